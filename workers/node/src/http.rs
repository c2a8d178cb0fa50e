//! The worker HTTP API, the same for every role that generates
//! (colocated and decode): `POST /v1/generate` streams NDJSON events;
//! `GET /health`, `GET /stats` and `GET /metrics` (Prometheus) for
//! operators; on a prefill worker, `POST /admin/abort` aborts every transfer
//! in flight. Every request has a server span joined to the caller's trace
//! and an `x-request-id`.
//!
//! Workers are internal: their port is mutual TLS admitting the gateway and
//! operators' tools; only a gateway certificate may generate, and only an
//! operator's may abort. The tenant comes from the tenant context the
//! gateway signs per call ([`ContextCheck`]): no context, a forged,
//! expired or replayed one, one for another model or for less than the
//! request asks is refused before anything is allocated. Errors are
//! `{"error": {"code", "message"}}` with a 4xx for what the caller can fix
//! and never an internal detail.
//!
//! A request's first event decides its HTTP status, so a rejection that comes
//! late (from the prefill worker's door) is still a 4xx.

use crate::decode::SubmitError;
use crate::prefill::AdminCommand;
use crate::role::Role;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bulkhead_engine::{
    ChatMessage, Engine, EngineError, GenerateRequest, RequestHandle, SamplingParams, SeqEvent,
};
use bulkhead_kv::{AdmissionError, TenantId};
use bulkhead_trust::{CallerRole, Role as CertRole};
use bulkhead_worker_api::context::{
    Audience, CONTEXT_HEADER, ContextError, ReplayGuard, TenantContext, VerifyingKeys,
};
use bulkhead_worker_api::{ErrorBody, ErrorDetail, GenerateBody, Line, Overflow};
use serde_json::{Value, json};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnboundedReceiverStream;

/// The router of a worker in `role`; generate calls are checked by
/// `contexts`.
pub fn app(role: Role, contexts: Arc<ContextCheck>) -> Router {
    let r = Router::new()
        .route("/health", get(|| async { "ok\n" }))
        .route("/stats", get(stats));
    let r = match role {
        Role::Prefill(_) => r.route("/admin/abort", post(admin_abort)),
        _ => r
            .route("/v1/generate", post(generate))
            .layer(axum::Extension(contexts)),
    };
    bulkhead_telemetry::instrument(
        r.with_state(role)
            .merge(bulkhead_telemetry::metrics_router()),
        bulkhead_telemetry::Hop::Internal,
        &["/health", "/stats", "/metrics"],
    )
}

/// An error in the API's own format.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) code: &'static str,
    pub(crate) message: String,
    pub(crate) overflow: Option<Overflow>,
    /// A refusal for now, not for good: when to try again.
    pub(crate) retry_after_ms: Option<u64>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.detail(),
        };
        let mut resp = (self.status, axum::Json(body)).into_response();
        if let Some(ms) = self.retry_after_ms
            && let Ok(v) = axum::http::HeaderValue::from_str(&ms.div_ceil(1000).max(1).to_string())
        {
            resp.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, v);
        }
        resp
    }
}

impl ApiError {
    fn detail(&self) -> ErrorDetail {
        ErrorDetail {
            code: self.code.to_owned(),
            message: self.message.clone(),
            overflow: self.overflow,
            retry_after_ms: self.retry_after_ms,
        }
    }

    fn forbidden(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::FORBIDDEN,
            code: "forbidden",
            message: message.into(),
            overflow: None,
            retry_after_ms: None,
        }
    }

    pub(crate) fn bad(code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            code,
            message: message.into(),
            overflow: None,
            retry_after_ms: None,
        }
    }
}

impl From<AdmissionError> for ApiError {
    fn from(e: AdmissionError) -> Self {
        if let AdmissionError::PrefillQueueFull { retry_after_ms, .. } = e {
            // Refused for now, at once: the queue ahead would make the
            // prompt miss its deadline.
            return ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                code: "prefill_queue_full",
                message: e.to_string(),
                overflow: None,
                retry_after_ms: Some(retry_after_ms),
            };
        }
        let (code, overflow) = match e {
            AdmissionError::ContextWindowExceeded {
                prompt_tokens,
                max_tokens,
                limit,
            }
            | AdmissionError::PoolCapacityExceeded {
                prompt_tokens,
                max_tokens,
                limit,
            } => (
                "context_length_exceeded",
                Some(Overflow {
                    prompt_tokens,
                    max_tokens,
                    limit,
                }),
            ),
            AdmissionError::PrefillTooLong {
                prompt_tokens,
                limit,
            } => (
                "prefill_too_long",
                Some(Overflow {
                    prompt_tokens,
                    max_tokens: 0,
                    limit,
                }),
            ),
            _ => ("invalid_request", None),
        };
        ApiError {
            overflow,
            ..ApiError::bad(code, e.to_string())
        }
    }
}

/// The client-facing classification of an engine error (once, here).
fn engine_error(e: &EngineError) -> ApiError {
    let (status, code) = match e {
        EngineError::Rejected(a) => return ApiError::from(a.clone()),
        EngineError::Transfer(_) => (StatusCode::BAD_GATEWAY, "kv_transfer_failed"),
        EngineError::Integrity(_) => (StatusCode::INTERNAL_SERVER_ERROR, "kv_integrity"),
        EngineError::Unavailable(_) | EngineError::Shutdown => {
            (StatusCode::SERVICE_UNAVAILABLE, "unavailable")
        }
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
    };
    ApiError {
        status,
        code,
        message: e.to_string(),
        overflow: None,
        retry_after_ms: None,
    }
}

/// How a worker checks the tenant context of every generate call.
#[derive(Debug)]
pub struct ContextCheck {
    keys: VerifyingKeys,
    model: String,
    replay: std::sync::Mutex<ReplayGuard>,
    usage: Option<crate::usage::UsageSink>,
}

impl ContextCheck {
    /// Contexts signed with `keys` for `model` (its slug).
    pub fn new(keys: VerifyingKeys, model: &str) -> Arc<ContextCheck> {
        Arc::new(ContextCheck {
            keys,
            model: model.to_owned(),
            replay: std::sync::Mutex::new(ReplayGuard::default()),
            usage: None,
        })
    }

    /// As [`ContextCheck::new`], and every call it admits is metered into
    /// `usage` (see [`crate::usage`]).
    pub fn metered(
        keys: VerifyingKeys,
        model: &str,
        usage: crate::usage::UsageSink,
    ) -> Arc<ContextCheck> {
        Arc::new(ContextCheck {
            keys,
            model: model.to_owned(),
            replay: std::sync::Mutex::new(ReplayGuard::default()),
            usage: Some(usage),
        })
    }

    /// A call only the gateway may make, to the API `audience` names: the
    /// caller's certificate, then the statement, then the body.
    pub(crate) fn gateway_call<T: serde::de::DeserializeOwned>(
        &self,
        caller: Option<CertRole>,
        headers: &HeaderMap,
        audience: Audience,
        body: &[u8],
    ) -> Result<(TenantContext, String, T), ApiError> {
        if caller != Some(CertRole::Gateway) {
            let verb = match audience {
                Audience::Generate => "generates",
                Audience::Embed => "embeds",
            };
            return Err(ApiError::forbidden(format!(
                "only the gateway {verb}: call with its certificate over mutual TLS"
            )));
        }
        let (ctx, signed) = self.statement(headers, audience)?;
        let body = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad("invalid_request", format!("invalid JSON body: {e}")))?;
        Ok((ctx, signed, body))
    }

    /// The verified statement of a call to the API `audience` names,
    /// before its body is read, and the signed header itself (a decode
    /// worker forwards it to prefill).
    fn statement(
        &self,
        headers: &HeaderMap,
        audience: Audience,
    ) -> Result<(TenantContext, String), ApiError> {
        let header = headers
            .get(CONTEXT_HEADER)
            .and_then(|v| v.to_str().ok())
            .ok_or(ContextError::Missing)
            .map_err(|e| refused(&e))?;
        let ctx = self
            .keys
            .verify(header, std::time::SystemTime::now())
            .map_err(|e| refused(&e))?;
        if ctx.model != self.model {
            return Err(refused(&ContextError::WrongModel(ctx.model)));
        }
        if ctx.audience != audience {
            return Err(refused(&ContextError::WrongAudience(ctx.audience)));
        }
        Ok((ctx, header.to_owned()))
    }

    /// The request stays within what the statement allows; then its id is
    /// spent. Nothing is allocated before this.
    fn admit(&self, ctx: &TenantContext, body: &GenerateBody) -> Result<TenantId, ApiError> {
        if body.max_tokens as u64 > ctx.max_tokens {
            return Err(refused(&ContextError::Limits(format!(
                "max_tokens {} above the signed {}",
                body.max_tokens, ctx.max_tokens
            ))));
        }
        let limit = body.context_limit.map(|c| c as u64);
        let within = match (ctx.context_limit, limit) {
            (None, _) => true,
            (Some(signed), Some(asked)) => asked <= signed,
            (Some(_), None) => false,
        };
        if !within {
            return Err(refused(&ContextError::Limits(format!(
                "context_limit {limit:?} above the signed {:?}",
                ctx.context_limit
            ))));
        }
        self.spend(ctx)
    }

    /// Spends the statement's call id (a replay is refused): the last
    /// check before anything is allocated for the call.
    pub(crate) fn spend(&self, ctx: &TenantContext) -> Result<TenantId, ApiError> {
        self.replay
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .admit(ctx, std::time::SystemTime::now())
            .map_err(|e| refused(&e))?;
        Ok(TenantId::new(ctx.tenant))
    }

    /// Where admitted calls' usage goes, if they are metered.
    pub(crate) fn usage(&self) -> Option<&crate::usage::UsageSink> {
        self.usage.as_ref()
    }
}

pub(crate) fn refused(e: &ContextError) -> ApiError {
    crate::metrics::context_refused(e.code());
    ApiError {
        status: StatusCode::from_u16(e.status()).unwrap_or(StatusCode::FORBIDDEN),
        code: e.code(),
        message: e.to_string(),
        overflow: None,
        retry_after_ms: None,
    }
}

async fn generate(
    State(role): State<Role>,
    CallerRole(caller): CallerRole,
    axum::Extension(check): axum::Extension<Arc<ContextCheck>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let (ctx, signed, body) =
        check.gateway_call::<GenerateBody>(caller, &headers, Audience::Generate, &body)?;
    let tenant = check.admit(&ctx, &body)?;
    let engine = match &role {
        Role::Colocated(e) => Arc::clone(e),
        Role::Decode(d) => Arc::clone(d.engine()),
        Role::Prefill(_) => return Err(ApiError::bad("invalid_request", "not a decode worker")),
    };
    bulkhead_worker_api::check_stops(&body.stop)
        .map_err(|m| ApiError::bad("invalid_request", m))?;
    let prompt = prompt_of(&engine, &body)?;
    if let Some(limit) = body.context_limit
        && prompt.len().saturating_add(body.max_tokens) > limit
    {
        crate::metrics::admission_rejected("context_window_exceeded");
        return Err(ApiError::from(AdmissionError::ContextWindowExceeded {
            prompt_tokens: prompt.len(),
            max_tokens: body.max_tokens,
            limit,
        }));
    }
    let span = tracing::info_span!(
        target: "bulkhead::worker",
        "generate",
        otel.kind = "internal",
        bulkhead.tenant = bulkhead_telemetry::int(tenant.get()),
        gen_ai.request.max_tokens = bulkhead_telemetry::int(body.max_tokens),
        gen_ai.usage.input_tokens = bulkhead_telemetry::int(prompt.len()),
        gen_ai.usage.output_tokens = tracing::field::Empty,
        gen_ai.response.finish_reasons = tracing::field::Empty,
    );
    let (constraint, logprobs) = sampling_extras(&body)?;
    let prompt_len = prompt.len();
    let request = GenerateRequest {
        prompt,
        sampling: SamplingParams {
            max_tokens: body.max_tokens,
            temperature: body.temperature,
            top_p: body.top_p,
            top_k: body.top_k,
            repetition_penalty: body.repetition_penalty,
            seed: body.seed,
            constraint,
            logprobs,
        },
        stop: body.stop,
        ignore_eos: body.ignore_eos,
        cache: Some(crate::prefix::scope(&ctx)),
        class: crate::engine_class(ctx.class),
    };
    let mut handle = {
        let _in = span.enter();
        submit(&role, tenant, request, signed.clone())?
    };
    let meter = check.usage.clone().map(|sink| Meter {
        sink,
        call_id: ctx.request_id.clone(),
        account: ctx.account.clone(),
        model: ctx.model.clone(),
        // A request's `n` choices share one prompt: billed with choice 0.
        bills_prompt: ctx.choice == 0,
        prompt_tokens: prompt_len as u64,
        progress: handle.prompt_progress().clone(),
        context: signed,
        ended: false,
    });
    // The first event decides the status: a late rejection is still a 4xx.
    // A call that fails before its first token answered nothing and is
    // billed nothing (a refusal, or a transfer that failed and that the
    // gateway may retry on another worker, which would bill it again). A
    // client that goes away meanwhile drops this future and the meter with
    // it: the prompt tokens computed by then are billed.
    let first = handle.next().await;
    if let Some(SeqEvent::Failed(e)) = &first {
        if let Some(m) = meter {
            m.unbilled();
        }
        return Err(engine_error(e));
    }
    let lines =
        UnboundedReceiverStream::new(forward(first, handle, span, meter)).map(Ok::<_, Infallible>);
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response())
}

/// The prompt's token ids: a prompt or messages through the chat
/// template, raw text, or token ids (exactly one of them).
fn prompt_of(engine: &Engine, body: &GenerateBody) -> Result<Vec<u32>, ApiError> {
    match (&body.prompt, &body.messages, &body.raw, &body.tokens) {
        (Some(p), None, None, None) => render(
            engine,
            &[ChatMessage {
                role: "user".into(),
                content: p.clone(),
            }],
        ),
        (None, Some(m), None, None) => {
            if m.is_empty() {
                return Err(ApiError::bad(
                    "invalid_request",
                    "messages must not be empty",
                ));
            }
            let messages = crate::tools::chat_messages(m, body.tools.as_ref())
                .map_err(|m| ApiError::bad("invalid_request", m))?;
            render(engine, &messages)
        }
        (None, None, Some(r), None) => encode(engine, r),
        (None, None, None, Some(t)) => {
            let vocab = engine.info().model.vocab;
            if t.iter().any(|id| *id as usize >= vocab) {
                return Err(ApiError::bad(
                    "invalid_request",
                    format!("token ids must be below the vocabulary size {vocab}"),
                ));
            }
            Ok(t.clone())
        }
        _ => Err(ApiError::bad(
            "invalid_request",
            "give exactly one of prompt, messages, raw and tokens",
        )),
    }
}

/// The grammar `response_format` asks for and the log-probabilities asked.
fn sampling_extras(
    body: &GenerateBody,
) -> Result<(Option<Arc<bulkhead_grammar::Grammar>>, Option<u8>), ApiError> {
    let refused = |what: &str| {
        let what = what.to_owned();
        move |e| match e {
            bulkhead_grammar::SchemaError::Unsupported(m) => {
                ApiError::bad("unsupported_parameter", format!("{what}: {m}"))
            }
            bulkhead_grammar::SchemaError::Invalid(m) => {
                ApiError::bad("invalid_request", format!("{what}: {m}"))
            }
        }
    };
    if body.tools.is_some() && body.messages.is_none() {
        return Err(ApiError::bad(
            "invalid_request",
            "tools are offered in a chat (messages) only",
        ));
    }
    let constraint = match (&body.response_format, &body.tools) {
        (None, None) => None,
        (Some(f), None) => bulkhead_grammar::Grammar::from_response_format(f)
            .map_err(refused("response_format"))?,
        (None, Some(t)) => Some(t.grammar().map_err(refused("tools"))?),
        (Some(_), Some(_)) => {
            return Err(ApiError::bad(
                "unsupported_parameter",
                "response_format: not served together with tools",
            ));
        }
    };
    let logprobs = match body.logprobs {
        Some(n) if n > bulkhead_engine::MAX_TOP_LOGPROBS => {
            return Err(ApiError::bad(
                "invalid_request",
                "top_logprobs must be between 0 and 20",
            ));
        }
        n => n,
    };
    Ok((constraint, logprobs))
}

/// Submits to the engine (colocated) or the decode side (disaggregated).
fn submit(
    role: &Role,
    tenant: TenantId,
    request: GenerateRequest,
    signed: String,
) -> Result<bulkhead_engine::RequestHandle, ApiError> {
    let submitted = match role {
        Role::Colocated(e) => e.submit(tenant, request).map_err(SubmitError::Rejected),
        Role::Decode(d) => d.submit(tenant, request, signed),
        Role::Prefill(_) => {
            return Err(ApiError::bad("invalid_request", "not a decode worker"));
        }
    };
    match submitted {
        Ok(h) => Ok(h),
        Err(e) => {
            if let SubmitError::Rejected(a) = &e {
                crate::metrics::admission_rejected(a.reason());
            }
            Err(match e {
                SubmitError::Rejected(a) => ApiError::from(a),
                SubmitError::Unavailable => ApiError {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    code: "unavailable",
                    message: e.to_string(),
                    overflow: None,
                    retry_after_ms: None,
                },
            })
        }
    }
}

fn render(engine: &Engine, messages: &[ChatMessage]) -> Result<Vec<u32>, ApiError> {
    let template = engine.model().chat_template().ok_or_else(|| {
        ApiError::bad("invalid_request", "the model has no chat template: use raw")
    })?;
    let text = template
        .render(messages)
        .map_err(|e| ApiError::bad("invalid_request", e.to_string()))?;
    encode(engine, &text)
}

fn encode(engine: &Engine, text: &str) -> Result<Vec<u32>, ApiError> {
    engine
        .tokenizer()
        .encode(text)
        .map_err(|e| ApiError::bad("invalid_request", e.to_string()))
}

/// The NDJSON lines of a request's events, from a task that owns the
/// handle. When the client goes away the task ends and dropping the handle
/// cancels the request.
fn forward(
    first: Option<SeqEvent>,
    mut handle: RequestHandle,
    span: tracing::Span,
    meter: Option<Meter>,
) -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    let task = async move {
        let mut emitted = 0u64;
        let gone = relay(first, &mut handle, &tx, &mut emitted).await;
        let Some(meter) = meter else { return };
        match gone {
            Relayed::Ended { completion, finish } => meter.end(completion, finish),
            Relayed::ClientGone => {
                // Cancel, and read the engine's own count of what it
                // computed: what was computed is billed.
                handle.cancel();
                let mut completion = emitted;
                while let Some(ev) = handle.next().await {
                    match ev {
                        SeqEvent::Token { .. } => completion += 1,
                        SeqEvent::Finished { usage, .. } => {
                            completion = usage.completion_tokens as u64;
                        }
                        SeqEvent::Failed(_) => {}
                    }
                }
                meter.end(completion, "cancelled");
            }
        }
    };
    tokio::spawn(tracing::Instrument::instrument(task, span));
    rx
}

/// How [`relay`] stopped.
enum Relayed {
    /// The request ended (finished or failed) and the client has it all.
    Ended {
        completion: u64,
        finish: &'static str,
    },
    /// The client went away first.
    ClientGone,
}

/// A call's usage, recorded once when it ends; if dropped before (the
/// client went away before the first token), the prompt tokens computed by
/// then.
struct Meter {
    sink: crate::usage::UsageSink,
    call_id: String,
    account: String,
    model: String,
    /// Whether this call bills the prompt (choice 0 of a request's `n`).
    bills_prompt: bool,
    prompt_tokens: u64,
    /// The prompt tokens computed so far.
    progress: bulkhead_engine::PromptProgress,
    /// The call's signed context: the control plane bills only its account.
    context: String,
    ended: bool,
}

impl Meter {
    fn end(mut self, completion_tokens: u64, finish: &str) {
        let prompt = self.prompt_tokens;
        self.record(prompt, completion_tokens, finish);
    }

    /// It failed before computing anything the client was given: nothing.
    fn unbilled(mut self) {
        self.ended = true;
    }

    fn record(&mut self, prompt_tokens: u64, completion_tokens: u64, finish: &str) {
        self.ended = true;
        self.sink.record(crate::usage::UsageRecord {
            call_id: std::mem::take(&mut self.call_id),
            account: std::mem::take(&mut self.account),
            model: std::mem::take(&mut self.model),
            prompt_tokens: if self.bills_prompt { prompt_tokens } else { 0 },
            completion_tokens,
            context: std::mem::take(&mut self.context),
            finish: finish.to_owned(),
            at_ms: crate::usage::now_ms(),
        });
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        // Dropped before its first token: the client went away while the
        // prompt was computed (or waited its turn, when it is 0).
        let computed = self.progress.get() as u64;
        if self.bills_prompt && computed > 0 {
            self.record(computed.min(self.prompt_tokens), 0, "cancelled");
        }
    }
}

/// Sends the request's events to the client as NDJSON lines until it ends
/// or the client goes away; counts the tokens sent.
async fn relay(
    first: Option<SeqEvent>,
    handle: &mut RequestHandle,
    tx: &mpsc::UnboundedSender<String>,
    emitted: &mut u64,
) -> Relayed {
    let mut next = first;
    while let Some(ev) = next {
        let ended = match &ev {
            SeqEvent::Token { .. } => {
                *emitted += 1;
                None
            }
            SeqEvent::Finished { reason, usage, .. } => {
                Some((usage.completion_tokens as u64, reason.as_str()))
            }
            SeqEvent::Failed(_) => Some((*emitted, "error")),
        };
        if let SeqEvent::Finished { reason, usage, .. } = &ev {
            let s = tracing::Span::current();
            s.record(
                "gen_ai.usage.output_tokens",
                bulkhead_telemetry::int(usage.completion_tokens),
            );
            s.record("gen_ai.response.finish_reasons", reason.as_str());
            tracing::info!(
                target: "bulkhead::worker",
                prompt_tokens = usage.prompt_tokens,
                completion_tokens = usage.completion_tokens,
                finish_reason = reason.as_str(),
                "generated"
            );
        }
        let (line, end) = event_line(&ev);
        let sent = tx.send(line).is_ok();
        if let Some((completion, finish)) = ended {
            return Relayed::Ended { completion, finish };
        }
        if !sent {
            return Relayed::ClientGone;
        }
        if end {
            return Relayed::Ended {
                completion: *emitted,
                finish: "error",
            };
        }
        next = tokio::select! {
            ev = handle.next() => ev,
            () = tx.closed() => return Relayed::ClientGone,
        };
    }
    // The engine went away without a last event.
    Relayed::Ended {
        completion: *emitted,
        finish: "error",
    }
}

/// OpenAI's floor for a log-probability: JSON has no minus infinity.
const LOGPROB_FLOOR: f32 = -9999.0;

fn wire_logprobs(l: &bulkhead_engine::Logprobs) -> bulkhead_worker_api::TokenLogprobs {
    let floor = |x: f32| {
        if x.is_nan() {
            LOGPROB_FLOOR
        } else {
            x.max(LOGPROB_FLOOR)
        }
    };
    bulkhead_worker_api::TokenLogprobs {
        logprob: floor(l.chosen.logprob),
        bytes: l.chosen.bytes.clone(),
        top: l
            .top
            .iter()
            .map(|t| bulkhead_worker_api::TopLogprob {
                token: t.id,
                bytes: t.bytes.clone(),
                logprob: floor(t.logprob),
            })
            .collect(),
    }
}

fn event_line(ev: &SeqEvent) -> (String, bool) {
    let (line, end) = match ev {
        SeqEvent::Token { id, text, logprobs } => (
            Line::Token {
                token: *id,
                text: text.clone(),
                logprobs: logprobs.as_deref().map(wire_logprobs),
            },
            false,
        ),
        SeqEvent::Finished {
            reason,
            text,
            usage,
        } => (
            Line::Finished {
                finish_reason: reason.as_str().to_owned(),
                text: text.clone(),
                usage: bulkhead_worker_api::Usage {
                    prompt_tokens: usage.prompt_tokens,
                    completion_tokens: usage.completion_tokens,
                },
            },
            true,
        ),
        SeqEvent::Failed(e) => {
            let a = engine_error(e);
            (Line::Error { error: a.detail() }, true)
        }
    };
    let mut text = serde_json::to_string(&line).unwrap_or_default();
    text.push('\n');
    (text, end)
}

async fn stats(State(role): State<Role>) -> Result<axum::Json<Value>, ApiError> {
    let engine = match &role {
        Role::Colocated(e) => Arc::clone(e),
        Role::Decode(d) => Arc::clone(d.engine()),
        Role::Prefill(p) => Arc::clone(p.engine()),
    };
    let page_size = engine.info().limits.page_size();
    let s = tokio::task::spawn_blocking(move || engine.stats())
        .await
        .ok()
        .flatten()
        .ok_or(ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "unavailable",
            message: "the engine has shut down".into(),
            overflow: None,
            retry_after_ms: None,
        })?;
    let p = s.pool;
    let mut v = json!({
        "pool": {
            "total_pages": p.total_pages, "free_pages": p.free_pages,
            "allocated_pages": p.allocated_pages, "quarantined_pages": p.quarantined_pages,
            "receiving_pages": p.receiving_pages, "allocations": p.allocations,
            "releases": p.releases, "owner_violations": p.owner_violations,
            "cached_pages": p.cached_pages, "prefix_hit_tokens": p.prefix_hit_tokens,
            "page_size": page_size,
        },
        "engine": {
            "running": s.running, "waiting": s.waiting,
            "draining_transfers": s.draining_transfers, "held_transfers": s.held_transfers,
            "computed_here": s.computed_here,
            "kernels": format!("{:?}", bulkhead_engine::simd_level()).to_lowercase(),
        },
    });
    match &role {
        Role::Decode(d) => {
            let c = d.counters();
            v["transfer"] = json!({
                "started": c.started, "committed": c.committed, "rejected": c.rejected,
                "failed": c.failed, "checksum_mismatches": c.checksum_mismatches,
                "tag_mismatches": c.tag_mismatches,
                "slot_mismatches": c.slot_mismatches, "duplicate_pages": c.duplicate_pages,
                "incomplete": c.incomplete, "dropped_frames": c.dropped_frames,
                "aborts_sent": c.aborts_sent, "aborts_received": c.aborts_received,
                "acks_sent": c.acks_sent, "acks_received": c.acks_received,
                "timeouts": c.timeouts, "connection_losses": c.connection_losses,
            });
            v["prefills"] = d
                .prefills()
                .into_iter()
                .map(|(address, in_flight)| json!({"address": address, "in_flight": in_flight}))
                .collect();
        }
        Role::Prefill(w) => {
            let c = w.counters();
            let g = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
            v["transfer"] = json!({
                "requests": g(&c.requests), "rejected": g(&c.rejected),
                "pages_sent": g(&c.pages_sent), "completed": g(&c.completed),
                "released": g(&c.released), "aborts_sent": g(&c.aborts_sent),
                "aborts_received": g(&c.aborts_received), "acks_sent": g(&c.acks_sent),
                "acks_received": g(&c.acks_received), "dropped_frames": g(&c.dropped_frames),
                "connection_losses": g(&c.connection_losses),
                "delayed_frames": g(&c.delayed_frames),
                "queued_reports": g(&c.queued_reports),
                "queued_prefill_ms": w.engine().queued_prefill().as_millis(),
            });
        }
        Role::Colocated(_) => {}
    }
    Ok(axum::Json(v))
}

async fn admin_abort(
    State(role): State<Role>,
    CallerRole(caller): CallerRole,
) -> Result<StatusCode, ApiError> {
    if caller != Some(CertRole::Operator) {
        return Err(ApiError::forbidden(
            "aborting transfers needs an operator certificate",
        ));
    }
    if let Role::Prefill(w) = role {
        w.admin(AdminCommand::AbortAll);
    }
    Ok(StatusCode::ACCEPTED)
}
