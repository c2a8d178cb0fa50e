//! The path every generating request takes, whichever API it came by:
//! routing table fresh enough, bearer token valid, account matches the
//! URL, model visible to the account, limits admit it and its maximum cost
//! is reserved, a routable worker picked by load, the worker's first line
//! decides the status; then the answer is collected ([`collect()`]) or
//! streamed ([`sse()`]) and what it cost is settled ([`ends`]); a request
//! of `n` choices that answers an error has its calls voided ([`void`]).
//! An embedding call takes the same steps in one answer ([`embed()`]).

mod collect;
mod embed;
mod ends;
mod sse;
mod void;

pub(crate) use collect::{Collected, collect};
pub(crate) use embed::{embed, embeds};
use ends::{Ends, Held};
pub(crate) use sse::{StreamEvent, sse};
pub(crate) use void::void_calls;

use crate::affinity::AffinityKey;
use crate::auth::{self, Principal};
use crate::budget::Reservation;
use crate::errors::GatewayError;
use crate::limits::{LimiterError, Permit, Quota};
use crate::metrics::{self, GenAiTimer};
use crate::pick::NodeLease;
use crate::state::AppState;
use crate::upstream::{LineStream, UpstreamError};
use crate::watch::{Snapshot, WatchError};
use axum::http::{HeaderMap, header};
use bulkhead_control_api::{Price, RoutedModel, Timestamp};
use bulkhead_worker_api::context::{TenantContext, WorkClass};
use bulkhead_worker_api::{GenerateBody, Line, Usage};
use std::sync::{Arc, OnceLock};
use tracing::Instrument;

/// An authenticated request against one routing table. The door
/// (`edge::guard`) makes it from the headers before any handler runs and
/// hands it to the handler as a request extension.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    pub(crate) snap: Arc<Snapshot>,
    pub(crate) principal: Principal,
    /// The account's standing once the limiter decided on this request;
    /// the door turns it into `x-ratelimit-*` headers on the response.
    pub(crate) quota: Arc<OnceLock<Quota>>,
    /// The ids of the worker calls this request signed, for a request of
    /// `n` choices that answers an error: its calls are voided in the
    /// ledger, so it bills nothing.
    pub(crate) calls: Arc<std::sync::Mutex<Vec<String>>>,
    /// The client's `x-session-affinity` header, if it sent one: the
    /// conversation its requests continue, for routing alone.
    pub(crate) session: Option<String>,
    /// Whether its prompt work goes before or after interactive work, as
    /// its API's handler read it (OpenAI's `service_tier`); signed into
    /// each worker call. A batch runner's credential is always the batch
    /// class ([`Ctx::asks`]).
    pub(crate) class: WorkClass,
    /// The batch line a batch runner's call runs (its
    /// [`BATCH_LINE_HEADER`]), billed under one key however often it runs.
    pub(crate) batch_line: Option<u64>,
}

/// The header with which the batch runner names the line a call runs.
/// Read only from a batch runner's credential (and required of it).
pub const BATCH_LINE_HEADER: &str = "bulkhead-batch-line";

/// Authenticates the request from its headers against the current table.
pub(crate) fn authenticate(state: &AppState, headers: &HeaderMap) -> Result<Ctx, GatewayError> {
    let snap = state.watch.current().map_err(|e| match e {
        WatchError::NotReady => GatewayError::Unavailable("the gateway is starting"),
        WatchError::Stale => {
            GatewayError::Unavailable("the gateway lost contact with the control plane")
        }
    })?;
    let header = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let token = auth::bearer(header).map_err(|_| GatewayError::Unauthenticated)?;
    let principal = auth::authenticate(token, &snap.table, state.jwt.as_deref())
        .map_err(|_| GatewayError::Unauthenticated)?;
    let session = headers
        .get(crate::affinity::SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let batch_line = match &principal.batch {
        None => None,
        Some(_) => Some(
            headers
                .get(BATCH_LINE_HEADER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| {
                    GatewayError::BadInput(format!(
                        "a batch runner's call names its line in {BATCH_LINE_HEADER}"
                    ))
                })?,
        ),
    };
    let class = match principal.batch {
        Some(_) => WorkClass::Batch,
        None => WorkClass::Interactive,
    };
    Ok(Ctx {
        snap,
        principal,
        quota: Arc::default(),
        calls: Arc::default(),
        session,
        class,
        batch_line,
    })
}

impl Ctx {
    /// The class a request that asks for `class` runs in: as asked, except
    /// that a batch runner's credential is always the batch class.
    pub(crate) fn asks(&self, class: WorkClass) -> WorkClass {
        match self.principal.batch {
            Some(_) => WorkClass::Batch,
            None => class,
        }
    }

    /// Refuses a credential used on another account's URL.
    pub(crate) fn for_account(&self, url_account: &str) -> Result<(), GatewayError> {
        if url_account == self.principal.account_id {
            Ok(())
        } else {
            Err(GatewayError::WrongAccount)
        }
    }

    /// Refuses, in `flavor`'s format, an `{account_id}` path that does not
    /// parse or names another account than the credential's.
    pub(crate) fn owns(
        &self,
        path: Result<axum::extract::Path<String>, axum::extract::rejection::PathRejection>,
        flavor: crate::errors::Flavor,
    ) -> Result<(), crate::errors::ApiError> {
        let axum::extract::Path(account) = path.map_err(|_| GatewayError::NoRoute.in_(flavor))?;
        self.for_account(&account).map_err(|e| e.in_(flavor))
    }
}

/// A request the worker has started answering.
#[derive(Debug)]
pub(crate) struct Generation {
    first: Line,
    rest: LineStream,
    /// The permit, the node lease and the flip tracker (counted until the
    /// answer ends: a flip that withdraws the model is acknowledged only
    /// after).
    held: Held,
    /// The timer and the request's reserved cost, settled when it ends.
    ends: Ends,
}

/// A request's reservation against its account's budgets and the price it
/// settles at.
#[derive(Debug)]
pub(crate) struct Bill {
    reservation: Reservation,
    price: Price,
    model: String,
    /// Whether this call bills the prompt (choice 0 of a request's `n`).
    prompt: bool,
}

impl Bill {
    /// The request ended with this usage: that is its cost.
    pub(crate) fn settle(self, usage: Usage) {
        let prompt = if self.prompt { usage.prompt_tokens } else { 0 };
        let cost = self
            .price
            .micro_neurons(prompt as u64, usage.completion_tokens as u64);
        metrics::neurons(&self.model, cost);
        self.reservation.settle(cost);
    }

    /// The worker refused the request before computing anything: it costs
    /// nothing.
    pub(crate) fn refused(self) {
        self.reservation.settle(0);
    }
}

/// The visible model `slug`, or not found.
pub(crate) fn model<'a>(ctx: &'a Ctx, slug: &str) -> Result<&'a RoutedModel, GatewayError> {
    ctx.snap
        .table
        .visible(&ctx.principal.account_id, slug)
        .ok_or_else(|| GatewayError::ModelNotFound(slug.chars().take(200).collect()))
}

/// Workers tried for one request before its error goes to the client.
const MAX_ATTEMPTS: usize = 3;

/// Limits, worker choice and the call; the first line has arrived.
pub(crate) async fn start(
    state: &AppState,
    ctx: &Ctx,
    model: &RoutedModel,
    body: GenerateBody,
) -> Result<Generation, GatewayError> {
    start_choice(state, ctx, model, body, 0).await
}

/// As [`start`], for choice `choice` of a request's `n`: its worker bills
/// the prompt only for choice 0, so a request's prompt is billed once, as
/// its `usage` reports it.
pub(crate) async fn start_choice(
    state: &AppState,
    ctx: &Ctx,
    model: &RoutedModel,
    mut body: GenerateBody,
    choice: u32,
) -> Result<Generation, GatewayError> {
    if embeds(model) {
        return Err(GatewayError::UnsupportedValue {
            param: "model".to_owned(),
            detail: format!("{} is an embedding model; it generates no text", model.slug),
        });
    }
    if let Some(p) = model.properties
        && body.max_tokens as u64 > p.max_output
    {
        return Err(GatewayError::BadInput(format!(
            "max_tokens {} exceeds this model's maximum output of {} tokens",
            body.max_tokens, p.max_output
        )));
    }
    if body.max_tokens == 0 {
        return Err(GatewayError::BadInput(
            "max_tokens must be at least 1".to_owned(),
        ));
    }
    // The worker also holds the request to the model's configured window.
    body.context_limit = model
        .properties
        .and_then(|p| usize::try_from(p.context_window).ok());
    let body = &body;
    let operation = if body.raw.is_some() {
        "text_completion"
    } else {
        "chat"
    };
    let timer = GenAiTimer::start(model.slug.as_str(), operation);
    // The budget first: a request it refuses moves no rate-limit counter
    // (the limiter counts what it admits). A request the limits then
    // refuse gives its whole reservation back.
    let reservation = match reserve(state, ctx, model, body).await {
        Ok(r) => r,
        Err(e) => {
            timer.failed(e.kind());
            return Err(e);
        }
    };
    let permit = match admit(state, ctx, estimate(body)).await {
        Ok(p) => p,
        Err(e) => {
            reservation.settle(0);
            timer.failed(e.kind());
            return Err(e);
        }
    };
    let bill = Bill {
        reservation,
        price: model.price,
        model: model.slug.to_string(),
        prompt: choice == 0,
    };
    match call(state, ctx, model, body, timer, (operation, choice), permit).await {
        Ok((first, rest, permit, lease, timer, tracked)) => {
            let (held, ends) = ((permit, lease, tracked), Ends::new(timer, bill));
            Ok(Generation {
                first,
                rest,
                held,
                ends,
            })
        }
        Err(e) => {
            // Refused or failed before the worker computed anything.
            bill.refused();
            Err(e)
        }
    }
}

/// Admits a request of about `tokens` against the account's limits (a
/// generation's estimate; 0 for a call that generates nothing, such as a
/// file's); the door shows the account's standing either way.
pub(crate) async fn admit(
    state: &AppState,
    ctx: &Ctx,
    tokens: u64,
) -> Result<Permit, GatewayError> {
    match state.limiter.admit(&ctx.principal.account_id, tokens).await {
        Ok(p) => {
            let _ = ctx.quota.set(p.quota());
            Ok(p)
        }
        Err(e) => {
            if let LimiterError::Limited { quota, .. } = &e {
                let _ = ctx.quota.set(*quota);
            }
            let e = GatewayError::from(e);
            if let GatewayError::RateLimited { what, .. } = &e {
                metrics::rate_limited(what);
            }
            Err(e)
        }
    }
}

/// Reserves the request's maximum cost against the account's budgets.
async fn reserve(
    state: &AppState,
    ctx: &Ctx,
    model: &RoutedModel,
    body: &GenerateBody,
) -> Result<Reservation, GatewayError> {
    let prompt =
        max_prompt_tokens(body).min(model.properties.map_or(u64::MAX, |p| p.context_window));
    let cost = model.price.micro_neurons(prompt, body.max_tokens as u64);
    reserve_cost(state, ctx, cost).await
}

/// Reserves `cost` micro-neurons against the account's budgets (nothing
/// for an account the table does not know); a refusal is counted.
async fn reserve_cost(state: &AppState, ctx: &Ctx, cost: u64) -> Result<Reservation, GatewayError> {
    let Some(budget) = ctx
        .snap
        .table
        .account(&ctx.principal.account_id)
        .map(|a| a.budget)
    else {
        return Ok(Reservation::none());
    };
    let reserved = state
        .budgets
        .reserve(&ctx.principal.account_id, &budget, cost, Timestamp::now())
        .await
        .map_err(GatewayError::from);
    if let Err(GatewayError::OverBudget { period, .. }) = &reserved {
        metrics::budget_refused(*period);
    }
    reserved
}

/// The most prompt tokens a request can have: its token ids, or one token
/// per byte of text (a byte-level BPE never does worse) plus the chat
/// template's tokens around each message and the default system prompt.
fn max_prompt_tokens(body: &GenerateBody) -> u64 {
    if let Some(t) = &body.tokens {
        return t.len() as u64;
    }
    let messages = body.messages.as_deref().unwrap_or_default();
    let roles: usize = messages.iter().map(|m| m.role.len()).sum();
    (text_bytes(body) + tool_bytes(body, 6) + roles + 16 * (messages.len() + 1) + 64) as u64
}

/// Bytes of the request's text: prompt, raw text and message contents.
fn text_bytes(body: &GenerateBody) -> usize {
    body.prompt.as_ref().map_or(0, String::len)
        + body.raw.as_ref().map_or(0, String::len)
        + body
            .messages
            .as_ref()
            .map_or(0, |m| m.iter().map(|m| m.content.len()).sum())
}

/// What the worker adds to the prompt for tools: the functions'
/// description in the system message, earlier calls written out, and each
/// result's `<tool_response>`, with text escaped as JSON taking `escape`
/// bytes a byte (6 bounds it: a control character's `\u00XX`; 1 is what
/// text usually takes).
fn tool_bytes(body: &GenerateBody, escape: usize) -> usize {
    let offered = body.tools.as_ref().map_or(0, |t| {
        1024 + t
            .functions
            .iter()
            .map(|f| {
                128 + 2 * f.name.len()
                    + escape * f.description.as_ref().map_or(0, String::len)
                    + escape * f.parameters.to_string().len()
            })
            .sum::<usize>()
    });
    let history: usize = body.messages.as_ref().map_or(0, |m| {
        m.iter()
            .map(|m| {
                let calls: usize = m
                    .tool_calls
                    .iter()
                    .map(|c| 64 + 2 * c.name.len() + c.arguments.len())
                    .sum();
                // The content itself is counted with the messages' text.
                let result = if m.role == "tool" {
                    128 + (escape - 1) * m.content.len()
                } else {
                    0
                };
                calls + result
            })
            .sum()
    });
    offered + history
}

/// What [`call`] hands back: the first line, the rest, and what is held
/// until the answer ends.
type Called = (
    Line,
    LineStream,
    Permit,
    NodeLease,
    GenAiTimer,
    crate::watch::Tracked,
);

/// Worker choice and the call, up to the worker's first line.
async fn call(
    state: &AppState,
    ctx: &Ctx,
    model: &RoutedModel,
    body: &GenerateBody,
    mut timer: GenAiTimer,
    (operation, choice): (&'static str, u32),
    permit: Permit,
) -> Result<Called, GatewayError> {
    let tracked = state.watch.track(&model.slug, &ctx.principal.account_id);
    // Nothing has reached the client before the first line: a worker that
    // cannot be reached, or fails the request before its first token for a
    // reason another worker may not share, is skipped and the next tried.
    let workers = ctx.snap.table.workers(&model.slug);
    // The conversation's key, within the tenant's own namespace.
    let namespace = crate::affinity::Namespace {
        account: &ctx.principal.account_id,
        tenant: ctx.principal.tenant,
        model: model.slug.as_str(),
        config_version: model.config_version,
    };
    let affinity = if state.affinity {
        AffinityKey::of(namespace, ctx.session.as_deref(), body)
    } else {
        None
    };
    let mut tried = Vec::new();
    let mut last: Option<UpstreamError> = None;
    let (first, rest, lease) = loop {
        let Some((node, lease)) = state.picker.pick(workers, &tried, affinity) else {
            // Every worker was tried: the last one's error is the answer.
            let e = last.take().map_or(
                GatewayError::Unavailable("no worker serves this model now"),
                GatewayError::from,
            );
            timer.failed(e.kind());
            return Err(e);
        };
        tried.push(node.id);
        let called = attempt(
            state,
            ctx,
            model,
            body,
            (operation, choice),
            node,
            tried.len(),
        )
        .await;
        match called {
            Ok((first, rest)) => break (first, rest, lease),
            Err(e) => {
                if e == UpstreamError::Unreachable {
                    state.picker.unreachable(node.id);
                }
                if e.retryable() && tried.len() < MAX_ATTEMPTS {
                    tracing::warn!(
                        target: "bulkhead::gateway",
                        node = node.registration.name.as_str(),
                        error = ?e,
                        "worker failed before the first byte; trying another"
                    );
                    metrics::retried();
                    last = Some(e);
                    continue;
                }
                let e = GatewayError::from(e);
                timer.failed(e.kind());
                return Err(e);
            }
        }
    };
    if matches!(first, Line::Token { .. }) {
        timer.first_token();
    }
    Ok((first, rest, permit, lease, timer, tracked))
}

/// One call to `node`, numbered `n` among this request's attempts, up to
/// its first line. A worker that leaves the routing table (its heartbeat
/// lapsed: a partition that TCP alone would notice only after minutes)
/// fails the request, before its first line or after; so does a flip that
/// withdraws the model from this account.
async fn attempt(
    state: &AppState,
    ctx: &Ctx,
    model: &RoutedModel,
    body: &GenerateBody,
    (operation, choice): (&'static str, u32),
    node: &bulkhead_control_api::NodeView,
    n: usize,
) -> Result<(Line, LineStream), UpstreamError> {
    let span = tracing::info_span!(
        target: "bulkhead::gateway",
        "upstream.generate",
        otel.kind = "client",
        gen_ai.operation.name = operation,
        gen_ai.request.model = model.slug.as_str(),
        bulkhead.node = node.registration.name.as_str(),
        bulkhead.routing.version = bulkhead_telemetry::int(ctx.snap.table.version()),
        bulkhead.attempt = bulkhead_telemetry::int(n),
    );
    let cut = || {
        let left = state.watch.node_left(model.slug.clone(), node.id);
        let withdrawn = state
            .watch
            .withdrawn(model.slug.clone(), ctx.principal.account_id.clone());
        async move {
            // A withdrawal may also take the model's workers out of the
            // table: it is the reason to report.
            tokio::select! {
                biased;
                () = withdrawn => UpstreamError::Withdrawn,
                () = left => UpstreamError::Unreachable,
            }
        }
    };
    // What this gateway vouches for, for this call alone.
    let id = call_id();
    if let Ok(mut calls) = ctx.calls.lock() {
        calls.push(id.clone());
    }
    let mut statement = TenantContext::new(
        &ctx.principal.account_id,
        ctx.principal.tenant,
        id,
        model.slug.as_str(),
        model.config_version,
        body.max_tokens as u64,
        body.context_limit.map(|c| c as u64),
        std::time::SystemTime::now(),
    );
    statement.choice = choice;
    statement.class = ctx.class;
    statement.bill_as = match (&ctx.principal.batch, ctx.batch_line) {
        (Some(batch), Some(line)) => Some(format!("batch:{batch}:{line}:{choice}")),
        _ => None,
    };
    let (first, mut rest) = tokio::select! {
        r = state
            .upstream
            .generate(&node.registration.address, &statement, body)
            .instrument(span) => r,
        e = cut() => Err(e),
    }?;
    rest.cut_when(cut());
    Ok((first, rest))
}

/// A worker call's id: the request's id (when it has one) and 64 random
/// bits, so no two calls share one even when a client repeats its
/// `x-request-id` (a worker serves each id once).
fn call_id() -> String {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    let nonce = u64::from_le_bytes(b);
    match bulkhead_telemetry::RequestId::current() {
        Some(id) => format!("{}.{nonce:016x}", id.0),
        None => format!("{nonce:016x}"),
    }
}

/// Tokens a request may use, for the tokens-per-minute limit: about four
/// characters per prompt token, plus `max_tokens`.
fn estimate(body: &GenerateBody) -> u64 {
    let chars =
        text_bytes(body) + tool_bytes(body, 1) + body.tokens.as_ref().map_or(0, |t| t.len() * 4);
    (chars / 4 + body.max_tokens) as u64
}

/// A request's usage as both APIs write it.
pub(crate) fn usage_json(u: Usage) -> serde_json::Value {
    serde_json::json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens
    })
}

/// A fresh sampling seed for a request that did not fix one.
pub(crate) fn random_seed() -> u64 {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    u64::from_le_bytes(b)
}

/// A JSON body parsed leniently about unknown fields but strictly about
/// types; errors are `BadInput` with serde's message.
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, GatewayError> {
    if bytes.is_empty() {
        return Err(GatewayError::BadInput(
            "the request body is empty; send JSON".to_owned(),
        ));
    }
    serde_json::from_slice(bytes)
        .map_err(|e| GatewayError::BadInput(format!("invalid JSON body: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bulkhead_worker_api::{Message, ToolCall, ToolChoice, ToolFunction, Tools};

    fn chat(messages: Vec<Message>, tools: Option<Tools>) -> GenerateBody {
        GenerateBody {
            messages: Some(messages),
            tools,
            ..GenerateBody::default()
        }
    }

    fn message(role: &str, content: &str) -> Message {
        Message {
            role: role.to_owned(),
            content: content.to_owned(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    #[test]
    fn the_prompt_bound_covers_what_the_worker_renders_for_tools() {
        let tools = Tools {
            functions: vec![ToolFunction {
                name: "get_weather".to_owned(),
                // Quotes and control characters grow when escaped as JSON.
                description: Some("\"\u{1}".repeat(2_000)),
                parameters: serde_json::json!({"type": "object",
                    "properties": {"city": {"type": "string", "description": "\u{2}".repeat(500)}}}),
            }],
            choice: ToolChoice::Auto,
            parallel: true,
        };
        let mut call = message("assistant", "");
        call.tool_calls.push(ToolCall {
            id: "c1".to_owned(),
            name: "get_weather".to_owned(),
            arguments: "{\"city\": \"Oslo\"}".to_owned(),
        });
        let mut result = message("tool", &"\u{3}".repeat(1_000));
        result.tool_call_id = Some("c1".to_owned());
        let plain = max_prompt_tokens(&chat(vec![message("user", "hi")], None));
        let convo = vec![message("user", "hi"), call, result];
        let offered = max_prompt_tokens(&chat(convo, Some(tools.clone())));
        // What the worker adds: the functions' description, the call and
        // the result written out (one token per byte bounds each).
        let added = bulkhead_grammar::tools::system_text(&tools.functions()).len()
            + bulkhead_grammar::tools::calls_text([(
                "get_weather",
                &serde_json::json!({"city": "Oslo"}),
            )])
            .len()
            + bulkhead_grammar::tools::response_text(Some("get_weather"), &"\u{3}".repeat(1_000))
                .len();
        assert!(
            offered >= plain + added as u64,
            "{offered} < {plain} + {added}"
        );
    }
}
