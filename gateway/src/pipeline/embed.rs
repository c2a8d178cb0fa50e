//! The path of an embedding call, whichever API it came by: the model is
//! an embedding model visible to the account, its most tokens are reserved
//! against the budgets and admitted by the limits, a routable worker of the
//! model is picked by load and sent the inputs with a statement signed for
//! embeddings alone, and the call is settled at the tokens the worker
//! computed. A worker that cannot be reached (or is unavailable) is skipped
//! for the next, as for generation; a flip that withdraws the model from
//! the account cuts the call.

use super::{Bill, Ctx, MAX_ATTEMPTS, admit, call_id};
use crate::errors::GatewayError;
use crate::metrics::{self, GenAiTimer};
use crate::state::AppState;
use crate::upstream::UpstreamError;
use bulkhead_control_api::RoutedModel;
use bulkhead_worker_api::Usage;
use bulkhead_worker_api::context::TenantContext;
use bulkhead_worker_api::embed::{EmbedAnswer, EmbedBody, EmbedInput};
use tracing::Instrument;

/// Whether `model` embeds (and generates nothing).
pub(crate) fn embeds(model: &RoutedModel) -> bool {
    bulkhead_control_api::is_embedding(&model.task)
}

/// Most inputs one call may send (OpenAI's limit); a worker may hold a
/// call to fewer, and says so.
pub(crate) const MAX_INPUTS: usize = 2_048;

/// The most tokens `input` can be: one per byte of text (a WordPiece token
/// covers at least one character) or its ids, and the two special tokens
/// around them, cut at the model's window.
fn max_tokens(input: &EmbedInput, window: u64) -> u64 {
    let n = match input {
        EmbedInput::Text(t) => t.len(),
        EmbedInput::Tokens(ids) => ids.len(),
    };
    (n as u64 + 2).min(window)
}

/// The vectors of `inputs` under `model`, computed by one of its workers,
/// and what the call was billed for.
pub(crate) async fn embed(
    state: &AppState,
    ctx: &Ctx,
    model: &RoutedModel,
    inputs: Vec<EmbedInput>,
    dimensions: Option<u64>,
) -> Result<EmbedAnswer, GatewayError> {
    if !embeds(model) {
        return Err(GatewayError::UnsupportedValue {
            param: "model".to_owned(),
            detail: format!(
                "{} is a {} model; embeddings need an embedding model",
                model.slug, model.task
            ),
        });
    }
    if inputs.is_empty() {
        return Err(GatewayError::BadInput("input must not be empty".to_owned()));
    }
    if inputs.len() > MAX_INPUTS {
        return Err(GatewayError::BadInput(format!(
            "{} inputs; a call takes at most {MAX_INPUTS}",
            inputs.len()
        )));
    }
    let window = model.properties.map_or(u64::MAX, |p| p.context_window);
    let bound: u64 = inputs.iter().map(|i| max_tokens(i, window)).sum();
    let timer = GenAiTimer::start(model.slug.as_str(), "embeddings");
    let reservation =
        match super::reserve_cost(state, ctx, model.price.micro_neurons(bound, 0)).await {
            Ok(r) => r,
            Err(e) => {
                timer.failed(e.kind());
                return Err(e);
            }
        };
    let bill = Bill {
        reservation,
        price: model.price,
        model: model.slug.to_string(),
        prompt: true,
    };
    let permit = match admit(state, ctx, bound).await {
        Ok(p) => p,
        Err(e) => {
            bill.refused();
            timer.failed(e.kind());
            return Err(e);
        }
    };
    let body = EmbedBody { inputs, dimensions };
    let answer = call(state, ctx, model, &body, bound).await;
    drop(permit);
    match answer {
        Ok(a) => {
            let prompt = usize::try_from(a.prompt_tokens).unwrap_or(usize::MAX);
            timer.finished(prompt, 0);
            bill.settle(Usage {
                prompt_tokens: prompt,
                completion_tokens: 0,
            });
            Ok(a)
        }
        Err(e) => {
            // Refused or failed: the worker bills nothing it did not answer.
            bill.refused();
            timer.failed(e.kind());
            Err(e)
        }
    }
}

/// Worker choice and the call, another worker tried where one cannot be
/// reached.
async fn call(
    state: &AppState,
    ctx: &Ctx,
    model: &RoutedModel,
    body: &EmbedBody,
    bound: u64,
) -> Result<EmbedAnswer, GatewayError> {
    let _tracked = state.watch.track(&model.slug, &ctx.principal.account_id);
    let workers = ctx.snap.table.workers(&model.slug);
    let mut tried = Vec::new();
    let mut last: Option<UpstreamError> = None;
    loop {
        let Some((node, _lease)) = state.picker.pick(workers, &tried, None) else {
            return Err(last.take().map_or(
                GatewayError::Unavailable("no worker serves this model now"),
                GatewayError::from,
            ));
        };
        tried.push(node.id);
        let span = tracing::info_span!(
            target: "bulkhead::gateway",
            "upstream.embed",
            otel.kind = "client",
            gen_ai.operation.name = "embeddings",
            gen_ai.request.model = model.slug.as_str(),
            bulkhead.node = node.registration.name.as_str(),
            bulkhead.attempt = bulkhead_telemetry::int(tried.len()),
        );
        let id = call_id();
        if let Ok(mut calls) = ctx.calls.lock() {
            calls.push(id.clone());
        }
        let statement = TenantContext::embed(
            &ctx.principal.account_id,
            ctx.principal.tenant,
            id,
            model.slug.as_str(),
            model.config_version,
            bound,
            std::time::SystemTime::now(),
        );
        let withdrawn = state
            .watch
            .withdrawn(model.slug.clone(), ctx.principal.account_id.clone());
        let left = state.watch.node_left(model.slug.clone(), node.id);
        let answer = tokio::select! {
            biased;
            () = withdrawn => Err(UpstreamError::Withdrawn),
            () = left => Err(UpstreamError::Unreachable),
            r = state
                .upstream
                .embed(&node.registration.address, &statement, body)
                .instrument(span) => r,
        };
        match answer {
            Ok(a) if a.vectors.len() == body.inputs.len() => return Ok(a),
            Ok(_) => return Err(GatewayError::Upstream),
            Err(e) => {
                if e == UpstreamError::Unreachable {
                    state.picker.unreachable(node.id);
                }
                if e.retryable() && tried.len() < MAX_ATTEMPTS {
                    metrics::retried();
                    last = Some(e);
                    continue;
                }
                return Err(GatewayError::from(e));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_input_is_bounded_by_its_bytes_and_the_window() {
        assert_eq!(max_tokens(&EmbedInput::Text(String::new()), 256), 2);
        assert_eq!(max_tokens(&EmbedInput::Text("héllo".to_owned()), 256), 8);
        assert_eq!(max_tokens(&EmbedInput::Text("a".repeat(1_000)), 256), 256);
        assert_eq!(max_tokens(&EmbedInput::Tokens(vec![7; 3]), 256), 5);
    }
}
