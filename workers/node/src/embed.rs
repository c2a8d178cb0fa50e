//! The embedding worker's API: `POST /v1/embed` (one vector per input),
//! `GET /health`, `GET /stats` and `GET /metrics`, behind the same mutual
//! TLS and signed tenant contexts as the generating workers.
//!
//! A call is checked in this order, nothing computed before the last
//! check: the caller is the gateway; its statement is valid, for this
//! model and for embeddings (a statement signed for generation is
//! refused); the body parses; it asks for the model's own width, if any;
//! the call id is spent; every input tokenizes
//! (an unknown token id is refused); the call is within the worker's
//! limits and the tokens the statement allows. It is billed its tokens
//! once its vectors are computed, and nothing if it is refused or fails.
//!
//! Inputs of different calls share the model's passes, never its
//! attention: each input attends only to its own tokens
//! (`bulkhead_embed::EmbedService`), so no tenant's vector depends on
//! another's text.

use crate::http::{ApiError, ContextCheck, refused};
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use bulkhead_embed::{EmbedError, EmbedService, Refusal, Tokens};
use bulkhead_trust::CallerRole;
use bulkhead_worker_api::context::{Audience, ContextError};
use bulkhead_worker_api::embed::{EmbedAnswer, EmbedBody, EmbedInput};
use serde_json::{Value, json};
use std::sync::Arc;
use tracing::Instrument;

/// The router of an embedding worker serving `service`; calls are checked
/// by `contexts`.
pub fn embed_app(service: EmbedService, contexts: Arc<ContextCheck>) -> Router {
    router(service, contexts, None)
}

/// Testing only (the leak prober's test): [`embed_app`] answering every
/// call after the first `after` with the vectors of the call answered
/// before it, as a leak between tenants would. Refused unless built with
/// the `test-hooks` feature.
pub fn embed_app_crossing(
    service: EmbedService,
    contexts: Arc<ContextCheck>,
    after: u64,
) -> Result<Router, bulkhead_engine::hooks::HooksDisabled> {
    #[cfg(feature = "test-hooks")]
    {
        let crossed = Crossed {
            after,
            seen: std::sync::Mutex::default(),
        };
        Ok(router(service, contexts, Some(Arc::new(crossed))))
    }
    #[cfg(not(feature = "test-hooks"))]
    {
        let _ = (service, contexts, after);
        Err(bulkhead_engine::hooks::HooksDisabled(
            "--corrupt-answers-after",
        ))
    }
}

/// The crossing fault: calls answered so far, and the last answer.
#[derive(Debug)]
struct Crossed {
    #[cfg(feature = "test-hooks")]
    after: u64,
    #[cfg(feature = "test-hooks")]
    seen: std::sync::Mutex<(u64, Vec<Vec<f32>>)>,
}

impl Crossed {
    /// `vectors`, or past the fault's start the previous call's (as many,
    /// cycled).
    #[cfg(feature = "test-hooks")]
    fn answer(&self, vectors: Vec<Vec<f32>>) -> Vec<Vec<f32>> {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.0 += 1;
        let previous = std::mem::replace(&mut seen.1, vectors.clone());
        if seen.0 <= self.after || previous.is_empty() {
            return vectors;
        }
        tracing::warn!(target: "bulkhead::worker", "test fault: answering with the previous call's vectors");
        crate::metrics::fault_injected("embedding_crossed");
        (0..vectors.len())
            .map(|i| previous[i % previous.len()].clone())
            .collect()
    }

    #[cfg(not(feature = "test-hooks"))]
    fn answer(&self, vectors: Vec<Vec<f32>>) -> Vec<Vec<f32>> {
        vectors
    }
}

fn router(
    service: EmbedService,
    contexts: Arc<ContextCheck>,
    crossed: Option<Arc<Crossed>>,
) -> Router {
    let r = Router::new()
        .route("/health", get(|| async { "ok\n" }))
        .route("/stats", get(stats))
        .route("/v1/embed", post(embed))
        .layer(axum::Extension(contexts))
        .layer(axum::Extension(crossed));
    bulkhead_telemetry::instrument(
        r.with_state(service)
            .merge(bulkhead_telemetry::metrics_router()),
        bulkhead_telemetry::Hop::Internal,
        &["/health", "/stats", "/metrics"],
    )
}

async fn embed(
    State(service): State<EmbedService>,
    CallerRole(caller): CallerRole,
    axum::Extension(check): axum::Extension<Arc<ContextCheck>>,
    axum::Extension(crossed): axum::Extension<Option<Arc<Crossed>>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<axum::Json<EmbedAnswer>, ApiError> {
    let (ctx, signed, body) =
        check.gateway_call::<EmbedBody>(caller, &headers, Audience::Embed, &body)?;
    // Refused before tokenizing anything.
    service
        .limits()
        .check_inputs(body.inputs.len())
        .map_err(|e| refusal(&e))?;
    let width = service.embedder().config().hidden_size as u64;
    if let Some(d) = body.dimensions.filter(|d| *d != width) {
        return Err(ApiError::bad(
            "invalid_request",
            format!(
                "dimensions {d}: this model's vectors have {width} dimensions, and only {width} is served"
            ),
        ));
    }
    let tenant = check.spend(&ctx)?;
    let span = tracing::info_span!(
        target: "bulkhead::worker",
        "embed",
        otel.kind = "internal",
        bulkhead.tenant = bulkhead_telemetry::int(tenant.get()),
        bulkhead.embed.inputs = bulkhead_telemetry::int(body.inputs.len()),
        gen_ai.usage.input_tokens = tracing::field::Empty,
    );
    let tokens = {
        let service = service.clone();
        tokio::task::spawn_blocking(move || tokenize(&service, &body.inputs))
            .await
            .map_err(|_| failed("tokenizing failed"))??
    };
    let truncated = tokens.iter().filter(|t| t.truncated() > 0).count() as u64;
    let call = service.admit(tokens).map_err(|e| refusal(&e))?;
    let computed = call.tokens() as u64;
    if computed > ctx.max_tokens {
        return Err(refused(&ContextError::Limits(format!(
            "{computed} tokens above the signed {}",
            ctx.max_tokens
        ))));
    }
    span.record(
        "gen_ai.usage.input_tokens",
        bulkhead_telemetry::int(computed),
    );
    let vectors = service
        .embed(call)
        .instrument(span)
        .await
        .map_err(|e| match e {
            EmbedError::Stopped => ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                code: "unavailable",
                message: "the embedding thread has stopped".into(),
                overflow: None,
                retry_after_ms: None,
            },
            _ => failed("embedding failed"),
        })?;
    if let Some(sink) = check.usage() {
        sink.record(crate::usage::UsageRecord {
            call_id: ctx.request_id,
            account: ctx.account,
            model: ctx.model,
            prompt_tokens: computed,
            completion_tokens: 0,
            context: signed,
            finish: "stop".to_owned(),
            at_ms: crate::usage::now_ms(),
        });
    }
    let vectors = match &crossed {
        Some(c) => c.answer(vectors),
        None => vectors,
    };
    Ok(axum::Json(EmbedAnswer {
        vectors,
        prompt_tokens: computed,
        truncated,
    }))
}

/// Every input as the model reads it; an unknown token id is the
/// client's error, a tokenizer failure ours.
fn tokenize(service: &EmbedService, inputs: &[EmbedInput]) -> Result<Vec<Tokens>, ApiError> {
    let model = service.embedder();
    inputs
        .iter()
        .enumerate()
        .map(|(i, input)| {
            let t = match input {
                EmbedInput::Text(text) => model.tokenize(text),
                EmbedInput::Tokens(ids) => model.from_ids(ids),
            };
            t.map_err(|e| match e {
                EmbedError::UnknownToken { .. } => {
                    ApiError::bad("invalid_request", format!("input {i}: {e}"))
                }
                _ => failed("tokenizing failed"),
            })
        })
        .collect()
}

/// A call over the worker's limits: the client's to fix.
fn refusal(e: &Refusal) -> ApiError {
    let code = match e {
        Refusal::Empty => "invalid_request",
        Refusal::TooManyInputs { .. } => "too_many_inputs",
        Refusal::TooManyTokens { .. } => "too_many_tokens",
    };
    ApiError::bad(code, e.to_string())
}

/// Our failure, worded without its internals.
fn failed(message: &str) -> ApiError {
    ApiError {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        code: "internal_error",
        message: message.to_owned(),
        overflow: None,
        retry_after_ms: None,
    }
}

async fn stats(State(service): State<EmbedService>) -> axum::Json<Value> {
    let c = service.embedder().config();
    let l = service.limits();
    let load = service.load();
    axum::Json(json!({
        "embedding": {
            "dimensions": c.hidden_size, "max_seq_length": c.max_seq_length,
            "max_inputs": l.max_inputs, "max_tokens": l.max_tokens,
        },
        "load": {"calls": load.calls, "tokens": load.tokens},
    }))
}
