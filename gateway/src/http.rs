//! The router and the path every generating request takes: routing table
//! fresh enough, bearer token valid, account matches the URL, model visible
//! to the account, limits admit it, a routable worker picked by load, the
//! worker's first line decides the status, the rest streams.

use crate::auth::{self, JwtConfig, Principal};
use crate::budget::{Budgets, Reservation};
use crate::errors::GatewayError;
use crate::limits::{Limiter, LimiterError, Permit, Quota};
use crate::metrics::{self, GenAiTimer};
use crate::pick::{NodeLease, Picker};
use crate::upstream::{LineStream, Upstream, UpstreamError};
use crate::watch::{RoutingWatch, Snapshot, WatchError};
use crate::{openai, workers_ai};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bulkhead_control_api::{Price, RoutedModel, Timestamp};
use bulkhead_worker_api::context::TenantContext;
use bulkhead_worker_api::{GenerateBody, Line, TokenLogprobs, Usage};
use std::convert::Infallible;
use std::sync::{Arc, OnceLock};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tracing::Instrument;

/// Shared state of every handler; cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState {
    watch: RoutingWatch,
    jwt: Option<Arc<JwtConfig>>,
    limiter: Limiter,
    upstream: Upstream,
    picker: Arc<Picker>,
    budgets: Budgets,
}

impl AppState {
    /// State over a routing watch, JWT settings, a limiter and the client
    /// that calls workers.
    pub fn new(
        watch: RoutingWatch,
        jwt: Option<JwtConfig>,
        limiter: Limiter,
        upstream: Upstream,
    ) -> AppState {
        AppState {
            watch,
            jwt: jwt.map(Arc::new),
            limiter,
            upstream,
            picker: Arc::new(Picker::default()),
            budgets: Budgets::memory(),
        }
    }

    /// The same state with budgets counted in `budgets` (in this process
    /// otherwise).
    pub fn with_budgets(self, budgets: Budgets) -> AppState {
        AppState { budgets, ..self }
    }
}

impl AppState {
    /// The control plane, for reads a handler makes there.
    pub(crate) fn control_plane(&self) -> &bulkhead_control_api::Client {
        self.watch.control_plane()
    }
}

/// The gateway router.
pub fn app(state: AppState) -> Router {
    let v4 = "/client/v4/accounts/{account_id}/ai";
    let router = Router::new()
        .route(&format!("{v4}/run/{{*model}}"), post(workers_ai::run))
        .route(&format!("{v4}/models/search"), get(workers_ai::search))
        .route(&format!("{v4}/usage"), get(workers_ai::usage))
        .route(
            &format!("{v4}/v1/chat/completions"),
            post(openai::account_chat),
        )
        .route(&format!("{v4}/v1/models"), get(openai::account_models))
        .route("/v1/chat/completions", post(openai::chat))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/models", get(openai::models))
        .route("/v1/models/{*model}", get(openai::model))
        .route("/health", get(health))
        // Before any handler: strangers and declared over-large bodies are
        // refused without reading a byte of the body.
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::edge::guard,
        ))
        .layer(axum::extract::DefaultBodyLimit::max(
            crate::edge::MAX_BODY_BYTES,
        ))
        .method_not_allowed_fallback(crate::edge::method_not_allowed)
        .fallback(fallback)
        .with_state(state);
    // Tenants call this router: a trace starts here, whatever they send.
    bulkhead_telemetry::instrument(router, bulkhead_telemetry::Hop::Edge, &["/health"])
}

async fn health(axum::extract::State(s): axum::extract::State<AppState>) -> Response {
    match s.watch.current() {
        Ok(snap) => format!("ok version={}\n", snap.table.version()).into_response(),
        Err(e) => (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            format!("{e}\n"),
        )
            .into_response(),
    }
}

async fn fallback(uri: Uri) -> Response {
    GatewayError::NoRoute
        .in_(crate::edge::flavor_of(uri.path()))
        .into_response()
}

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
}

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
    Ok(Ctx {
        snap,
        principal,
        quota: Arc::default(),
    })
}

impl Ctx {
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
}

impl Bill {
    /// The request ended with this usage: that is its cost.
    pub(crate) fn settle(self, usage: Usage) {
        let cost = self
            .price
            .micro_neurons(usage.prompt_tokens as u64, usage.completion_tokens as u64);
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
    mut body: GenerateBody,
) -> Result<Generation, GatewayError> {
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
    // Budget and limits are independent stores: asked at once, so a
    // deployment with both in Redis pays one round trip, not two.
    let (reservation, permit) =
        tokio::join!(reserve(state, ctx, model, body), admit(state, ctx, body));
    let (reservation, permit) = match (reservation, permit) {
        (Ok(r), Ok(p)) => (r, p),
        (Err(e), _) => {
            // Over budget (a permit taken meanwhile is released here).
            if let GatewayError::OverBudget { period, .. } = &e {
                metrics::budget_refused(*period);
            }
            timer.failed(e.kind());
            return Err(e);
        }
        (Ok(r), Err(e)) => {
            r.settle(0);
            timer.failed(e.kind());
            return Err(e);
        }
    };
    let bill = Bill {
        reservation,
        price: model.price,
        model: model.slug.to_string(),
    };
    match call(state, ctx, model, body, timer, operation, permit).await {
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

/// Admits the request against the account's limits; the door shows the
/// account's standing either way.
async fn admit(state: &AppState, ctx: &Ctx, body: &GenerateBody) -> Result<Permit, GatewayError> {
    match state
        .limiter
        .admit(&ctx.principal.account_id, estimate(body))
        .await
    {
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
    let Some(budget) = ctx
        .snap
        .table
        .account(&ctx.principal.account_id)
        .map(|a| a.budget)
    else {
        return Ok(Reservation::none());
    };
    let prompt =
        max_prompt_tokens(body).min(model.properties.map_or(u64::MAX, |p| p.context_window));
    let cost = model.price.micro_neurons(prompt, body.max_tokens as u64);
    Ok(state
        .budgets
        .reserve(&ctx.principal.account_id, &budget, cost, Timestamp::now())
        .await?)
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
    (text_bytes(body) + roles + 16 * (messages.len() + 1) + 64) as u64
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
    operation: &'static str,
    permit: Permit,
) -> Result<Called, GatewayError> {
    let tracked = state.watch.track(&model.slug, &ctx.principal.account_id);
    // Nothing has reached the client before the first line: a worker that
    // cannot be reached, or fails the request before its first token for a
    // reason another worker may not share, is skipped and the next tried.
    let workers = ctx.snap.table.workers(&model.slug);
    let mut tried = Vec::new();
    let mut last: Option<UpstreamError> = None;
    let (first, rest, lease) = loop {
        let Some((node, lease)) = state.picker.pick(workers, &tried) else {
            // Every worker was tried: the last one's error is the answer.
            let e = last.take().map_or(
                GatewayError::Unavailable("no worker serves this model now"),
                GatewayError::from,
            );
            timer.failed(e.kind());
            return Err(e);
        };
        tried.push(node.id);
        let called = attempt(state, ctx, model, body, operation, node, tried.len()).await;
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
    operation: &'static str,
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
    let statement = TenantContext::new(
        &ctx.principal.account_id,
        ctx.principal.tenant,
        call_id(),
        model.slug.as_str(),
        model.config_version,
        body.max_tokens as u64,
        body.context_limit.map(|c| c as u64),
        std::time::SystemTime::now(),
    );
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
    let chars = text_bytes(body) + body.tokens.as_ref().map_or(0, |t| t.len() * 4);
    (chars / 4 + body.max_tokens) as u64
}

/// The end of a collected generation.
#[derive(Debug)]
pub(crate) struct Collected {
    pub(crate) text: String,
    /// Each token's log-probabilities, when the request asked for them.
    pub(crate) logprobs: Vec<TokenLogprobs>,
    pub(crate) finish_reason: String,
    pub(crate) usage: Usage,
}

/// A request's usage as both APIs write it.
pub(crate) fn usage_json(u: Usage) -> serde_json::Value {
    serde_json::json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens
    })
}

/// What a generation holds until its answer ends (released when dropped).
type Held = (Permit, NodeLease, crate::watch::Tracked);

impl Generation {
    /// The first line, the rest, what is held, and what settles at the end.
    fn into_parts(self) -> (Line, LineStream, Held, Ends) {
        (self.first, self.rest, self.held, self.ends)
    }
}

/// Reads a generation to its end.
pub(crate) async fn collect(g: Generation) -> Result<Collected, GatewayError> {
    let (first, mut rest, held, mut ends) = g.into_parts();
    let mut line = Some(Ok(first));
    let mut answer = String::new();
    let mut logprobs = Vec::new();
    let result = loop {
        match line {
            Some(Ok(Line::Token {
                text, logprobs: l, ..
            })) => {
                ends.started = true;
                answer.push_str(&text);
                logprobs.extend(l);
                line = rest.next().await;
            }
            Some(Ok(Line::Finished {
                finish_reason,
                text,
                usage,
            })) => {
                answer.push_str(&text);
                ends.finished(usage);
                break Ok(Collected {
                    text: answer,
                    logprobs,
                    finish_reason: finish_reason_of(&finish_reason),
                    usage,
                });
            }
            Some(Ok(Line::Error { error })) => break Err(ends.worker_failed(&error)),
            Some(Err(e)) => break Err(ends.broke(e.into())),
            None => break Err(ends.broke(GatewayError::Upstream)),
        }
    };
    drop((held, ends));
    result
}

/// What a generation settles when it ends: its metrics and its budget
/// reservation. A reservation it never settles (the worker failed
/// mid-answer, the client went away) stays whole when this is dropped.
#[derive(Debug)]
struct Ends {
    timer: Option<GenAiTimer>,
    bill: Option<Bill>,
    /// A token has arrived: the worker computed something.
    started: bool,
}

impl Ends {
    fn new(timer: GenAiTimer, bill: Bill) -> Ends {
        Ends {
            timer: Some(timer),
            bill: Some(bill),
            started: false,
        }
    }

    /// A good end with the worker's count.
    fn finished(&mut self, usage: Usage) {
        if let Some(t) = self.timer.take() {
            t.finished(usage.prompt_tokens, usage.completion_tokens);
        }
        if let Some(b) = self.bill.take() {
            b.settle(usage);
        }
    }

    /// The worker's own error line; before any token it refused the
    /// request, which then costs nothing.
    fn worker_failed(&mut self, error: &bulkhead_worker_api::ErrorDetail) -> GatewayError {
        let e = GatewayError::from(crate::upstream::UpstreamError::Worker {
            status: crate::upstream::status_of(&error.code),
            code: error.code.clone(),
            message: error.message.clone(),
            overflow: error.overflow,
        });
        if !self.started
            && let Some(b) = self.bill.take()
        {
            b.refused();
        }
        self.broke(e)
    }

    /// Any other failed end (`kind` on the metrics).
    fn broke(&mut self, e: GatewayError) -> GatewayError {
        self.gone(e.kind());
        e
    }

    /// The end, for the metrics, as `kind`.
    fn gone(&mut self, kind: &'static str) {
        if let Some(t) = self.timer.take() {
            t.failed(kind);
        }
    }
}

/// OpenAI's finish reasons: `stop` or `length`.
pub(crate) fn finish_reason_of(worker: &str) -> String {
    match worker {
        "length" => "length".to_owned(),
        _ => "stop".to_owned(),
    }
}

/// What a streaming renderer is given.
#[derive(Debug)]
pub(crate) enum StreamEvent<'a> {
    /// Generated text, and the log-probabilities of the tokens it
    /// completes (when asked for).
    Text(&'a str, &'a [TokenLogprobs]),
    /// The end.
    Finished { finish_reason: String, usage: Usage },
    /// The end, failed.
    Failed(GatewayError),
}

/// Streams a generation as server-sent events: each event the renderer
/// returns is one `data:` line, and `data: [DONE]` follows a good end. When
/// the client goes away the task ends, dropping the worker connection, and
/// the worker cancels the request.
pub(crate) fn sse<F>(g: Generation, mut render: F) -> Response
where
    F: FnMut(StreamEvent<'_>) -> Vec<String> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(64);
    tokio::spawn(async move {
        let (first, mut rest, held, ends) = g.into_parts();
        let mut stream = SseState {
            ends,
            held: Vec::new(),
        };
        let mut line: Option<Result<Line, UpstreamError>> = Some(Ok(first));
        loop {
            let (events, end) = stream.events(line, &mut render);
            if !send_events(&tx, events).await {
                stream.ends.gone("client_gone");
                break;
            }
            if let Some(ok) = end {
                if ok {
                    let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
                }
                break;
            }
            line = tokio::select! {
                l = rest.next() => l,
                () = tx.closed() => {
                    stream.ends.gone("client_gone");
                    break;
                }
            };
        }
        drop((stream, held));
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(ReceiverStream::new(rx)),
    )
        .into_response()
}

/// Sends each event as one `data:` line; false once the client is gone.
async fn send_events(tx: &mpsc::Sender<Result<Bytes, Infallible>>, events: Vec<String>) -> bool {
    for e in events {
        if tx
            .send(Ok(Bytes::from(format!("data: {e}\n\n"))))
            .await
            .is_err()
        {
            return false;
        }
    }
    true
}

/// A stream between worker lines.
#[derive(Debug)]
struct SseState {
    ends: Ends,
    /// Log-probabilities of tokens whose text is held back, sent with the
    /// next text.
    held: Vec<TokenLogprobs>,
}

impl SseState {
    /// The events of one worker line, and whether the stream ends there
    /// (`Some(true)`: well).
    fn events<F>(
        &mut self,
        line: Option<Result<Line, UpstreamError>>,
        render: &mut F,
    ) -> (Vec<String>, Option<bool>)
    where
        F: FnMut(StreamEvent<'_>) -> Vec<String>,
    {
        match line {
            Some(Ok(Line::Token { text, logprobs, .. })) => {
                self.ends.started = true;
                self.held.extend(logprobs);
                if text.is_empty() {
                    return (Vec::new(), None);
                }
                if let Some(t) = &mut self.ends.timer {
                    t.first_token();
                }
                let events = render(StreamEvent::Text(&text, &self.held));
                self.held.clear();
                (events, None)
            }
            Some(Ok(Line::Finished {
                finish_reason,
                usage,
                text,
            })) => {
                let mut events = Vec::new();
                if !text.is_empty() || !self.held.is_empty() {
                    events.extend(render(StreamEvent::Text(&text, &self.held)));
                    self.held.clear();
                }
                events.extend(render(StreamEvent::Finished {
                    finish_reason: finish_reason_of(&finish_reason),
                    usage,
                }));
                self.ends.finished(usage);
                (events, Some(true))
            }
            Some(Ok(Line::Error { error })) => {
                let e = self.ends.worker_failed(&error);
                (render(StreamEvent::Failed(e)), Some(false))
            }
            Some(Err(e)) => {
                let e = self.ends.broke(e.into());
                (render(StreamEvent::Failed(e)), Some(false))
            }
            None => {
                let e = self.ends.broke(GatewayError::Upstream);
                (render(StreamEvent::Failed(e)), Some(false))
            }
        }
    }
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
