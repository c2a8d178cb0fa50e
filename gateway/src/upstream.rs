//! Calling a worker: `POST https://{address}/v1/generate` (or
//! `/v1/embed`, an embedding worker's one answer) over mutual TLS
//! (the gateway's certificate; the worker's must name decode or colocated,
//! and may not be scoped to another model than the call's)
//! with the signed tenant context, then reading its NDJSON lines as they
//! arrive. Dropping a
//! [`LineStream`] closes the connection, which the worker takes as the
//! client going away: it cancels the request (after any KV transfer in
//! flight has finished) and its pages return to the pool.
//!
//! A failure another worker may not share ([`UpstreamError::retryable`]:
//! unreachable, broken protocol, no prefill worker, a lost KV transfer) is
//! retried by `http` on another worker, up to three in all, while no byte has
//! reached the client. A request whose worker leaves the routing table (its
//! heartbeat lapsed) fails at once, before its first line or mid-stream (an
//! error event, no `[DONE]`), instead of waiting on a partitioned socket.

use bulkhead_trust::connect::Connector;
use bulkhead_trust::{Identity, Role as CertRole, TrustError};
use bulkhead_worker_api::context::{CONTEXT_HEADER, SigningKey, TenantContext};
use bulkhead_worker_api::embed::{EmbedAnswer, EmbedBody};
use bulkhead_worker_api::{ErrorBody, GenerateBody, Line};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Longest to wait for a worker's first answer. The worker refuses at once
/// a prompt it cannot prefill within its own deadline (60 s by default) and
/// keeps a live transfer alive however long it queues, so this only catches
/// a worker that hangs.
const UPSTREAM_HEAD_TIMEOUT: Duration = Duration::from_secs(300);

/// The largest embedding answer read from a worker (2,048 vectors of
/// 1,024 floats written out as JSON fit several times over).
const MAX_EMBED_ANSWER: usize = 64 << 20;

/// Why a worker call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum UpstreamError {
    /// No connection or no answer.
    Unreachable,
    /// The worker refused or failed the request with its own error.
    Worker {
        status: u16,
        code: String,
        message: String,
        overflow: Option<bulkhead_worker_api::Overflow>,
        /// With a refusal for now: when the worker expects room.
        retry_after_ms: Option<u64>,
    },
    /// The worker answered something that is not its API.
    Protocol,
    /// The model was made private mid-request: the call was cut.
    Withdrawn,
}

impl UpstreamError {
    /// Whether another worker may succeed where this one failed (nothing
    /// has reached the client yet): it could not be reached, broke its
    /// protocol, had no prefill worker, lost the request's KV transfer, or
    /// had too much prefill queued to take the prompt in time. A refusal
    /// of the request itself (4xx) would be the same anywhere.
    pub(crate) fn retryable(&self) -> bool {
        match self {
            UpstreamError::Unreachable | UpstreamError::Protocol => true,
            UpstreamError::Withdrawn => false,
            UpstreamError::Worker { code, .. } => {
                matches!(
                    code.as_str(),
                    "unavailable" | "kv_transfer_failed" | "prefill_queue_full"
                )
            }
        }
    }
}

/// A pooled client for one model's workers.
type WorkerClient = Client<Connector, Full<Bytes>>;

/// The roles whose workers generate.
const GENERATING: [CertRole; 2] = [CertRole::Decode, CertRole::Colocated];

/// Pooled HTTP/1.1 clients for workers, over mutual TLS: one per model,
/// each accepting only workers whose certificate may serve that model.
#[derive(Debug, Clone)]
pub struct Upstream {
    identity: Identity,
    /// The model's client, made on its first call. The only shared state
    /// here: a map from slug to a client that is itself shared and cheap
    /// to clone, locked only to look one up.
    clients: Arc<Mutex<HashMap<String, WorkerClient>>>,
    /// The tenant-context signing key (only gateways hold one).
    keys: SigningKey,
}

impl Upstream {
    /// A client presenting the gateway's `identity`, accepting only workers
    /// that generate (decode and colocated certificates) and may serve the
    /// call's model, signing each call's tenant context with `keys`.
    pub fn new(identity: &Identity, keys: SigningKey) -> Result<Upstream, TrustError> {
        // Checked once here, so a per-model connector cannot fail later.
        Connector::new(identity, &GENERATING)?;
        Ok(Upstream {
            identity: identity.clone(),
            clients: Arc::default(),
            keys,
        })
    }

    /// The client for `model`'s workers: a worker whose certificate is
    /// scoped to another model is refused in the handshake, before a byte
    /// of the request (its prompt) is sent.
    fn client(&self, model: &str) -> Result<WorkerClient, UpstreamError> {
        let mut clients = self.clients.lock().map_err(|_| UpstreamError::Protocol)?;
        if let Some(c) = clients.get(model) {
            return Ok(c.clone());
        }
        let connector = Connector::for_model(&self.identity, &GENERATING, model)
            .map_err(|_| UpstreamError::Protocol)?;
        let client = Client::builder(TokioExecutor::new()).build(connector);
        clients.insert(model.to_owned(), client.clone());
        Ok(client)
    }

    /// Sends the request; returns the first line (a token or the end) and
    /// the rest of the stream. A worker error before the first token is an
    /// `Err`, so its status can still become the client's.
    pub(crate) async fn generate(
        &self,
        address: &str,
        ctx: &TenantContext,
        body: &GenerateBody,
    ) -> Result<(Line, LineStream), UpstreamError> {
        let resp = self.post(address, "/v1/generate", ctx, body).await?;
        let mut stream = LineStream {
            body: resp.into_body(),
            buf: Vec::new(),
            done: false,
            gone: None,
        };
        match stream.next().await {
            Some(Ok(Line::Error { error })) => Err(UpstreamError::Worker {
                status: status_of(&error.code),
                code: error.code,
                message: error.message,
                overflow: error.overflow,
                retry_after_ms: error.retry_after_ms,
            }),
            Some(Ok(first)) => Ok((first, stream)),
            Some(Err(e)) => Err(e),
            None => Err(UpstreamError::Protocol),
        }
    }

    /// The vectors of an embedding call (`POST /v1/embed`), or the
    /// worker's error.
    pub(crate) async fn embed(
        &self,
        address: &str,
        ctx: &TenantContext,
        body: &EmbedBody,
    ) -> Result<EmbedAnswer, UpstreamError> {
        let resp = self.post(address, "/v1/embed", ctx, body).await?;
        let bytes = http_body_util::Limited::new(resp.into_body(), MAX_EMBED_ANSWER)
            .collect()
            .await
            .map_err(|_| UpstreamError::Unreachable)?
            .to_bytes();
        serde_json::from_slice(&bytes).map_err(|_| UpstreamError::Protocol)
    }

    /// `POST https://{address}{path}` with `body` as JSON and `ctx` signed,
    /// in this request's trace; a worker's answer other than 200 is its
    /// error.
    async fn post(
        &self,
        address: &str,
        path: &str,
        ctx: &TenantContext,
        body: &impl serde::Serialize,
    ) -> Result<hyper::Response<Incoming>, UpstreamError> {
        let bytes = serde_json::to_vec(body).map_err(|_| UpstreamError::Protocol)?;
        let mut req = Request::post(format!("https://{address}{path}"))
            .header(CONTEXT_HEADER, self.keys.sign(ctx))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(bytes)))
            .map_err(|_| UpstreamError::Protocol)?;
        // The worker joins this request's trace and logs under its id.
        bulkhead_telemetry::inject_headers(req.headers_mut());
        if let Some(id) = bulkhead_telemetry::RequestId::current()
            && let Ok(v) = id.0.parse()
        {
            req.headers_mut()
                .insert(bulkhead_telemetry::REQUEST_ID_HEADER, v);
        }
        let http = self.client(&ctx.model)?;
        let resp = tokio::time::timeout(UPSTREAM_HEAD_TIMEOUT, http.request(req))
            .await
            .map_err(|_| UpstreamError::Unreachable)?
            .map_err(|e| {
                tracing::warn!(worker = %address, error = %bulkhead_control_api::error_chain(&e), "worker call failed");
                UpstreamError::Unreachable
            })?;
        let status = resp.status();
        if status == StatusCode::OK {
            return Ok(resp);
        }
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|_| UpstreamError::Unreachable)?
            .to_bytes();
        let err: ErrorBody = serde_json::from_slice(&bytes).map_err(|_| UpstreamError::Protocol)?;
        Err(UpstreamError::Worker {
            status: status.as_u16(),
            code: err.error.code,
            message: err.error.message,
            overflow: err.error.overflow,
            retry_after_ms: err.error.retry_after_ms,
        })
    }
}

/// The HTTP status a worker error code stands for (for errors that arrive
/// as a line).
pub(crate) fn status_of(code: &str) -> u16 {
    match code {
        "context_length_exceeded" | "invalid_request" | "missing_tenant" => 400,
        "kv_transfer_failed" => 502,
        "unavailable" | "prefill_queue_full" => 503,
        _ => 500,
    }
}

/// The NDJSON lines of a worker's answer.
pub(crate) struct LineStream {
    body: Incoming,
    buf: Vec<u8>,
    done: bool,
    /// Resolves, to the error the stream ends with, when the worker is
    /// known to be gone or the model was withdrawn.
    gone: Option<std::pin::Pin<Box<dyn std::future::Future<Output = UpstreamError> + Send>>>,
}

impl std::fmt::Debug for LineStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LineStream")
            .field("buffered", &self.buf.len())
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl LineStream {
    /// Ends the stream with the error `cut` resolves to (its worker left
    /// the routing table, or its model was withdrawn).
    pub(crate) fn cut_when(
        &mut self,
        cut: impl std::future::Future<Output = UpstreamError> + Send + 'static,
    ) {
        self.gone = Some(Box::pin(cut));
    }

    /// The next frame of the body, unless the worker is gone first.
    async fn frame(&mut self) -> Option<Result<hyper::body::Frame<Bytes>, UpstreamError>> {
        let frame = self.body.frame();
        match &mut self.gone {
            Some(gone) => tokio::select! {
                f = frame => f.map(|r| r.map_err(|_| UpstreamError::Unreachable)),
                e = gone => Some(Err(e)),
            },
            None => frame
                .await
                .map(|r| r.map_err(|_| UpstreamError::Unreachable)),
        }
    }

    /// Reads what is left of the body after its last line (a moment and a
    /// little data at most): a body read to its end gives its connection
    /// back to the client's pool, where one dropped before is closed, and
    /// the next request would pay a new connection and handshake.
    pub(crate) async fn finish(mut self) {
        if self.done {
            return;
        }
        let drain = async {
            let mut left: usize = 64 << 10;
            while let Some(Ok(frame)) = self.frame().await {
                if let Ok(data) = frame.into_data() {
                    match left.checked_sub(data.len()) {
                        Some(l) => left = l,
                        None => break,
                    }
                }
            }
        };
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), drain).await;
    }

    /// The next line; `None` after the end.
    pub(crate) async fn next(&mut self) -> Option<Result<Line, UpstreamError>> {
        loop {
            if let Some(at) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=at).collect();
                if line.len() <= 1 {
                    continue;
                }
                return Some(
                    serde_json::from_slice(&line[..line.len() - 1])
                        .map_err(|_| UpstreamError::Protocol),
                );
            }
            if self.done {
                return None;
            }
            match self.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        if self.buf.len() + data.len() > 16 << 20 {
                            self.done = true;
                            return Some(Err(UpstreamError::Protocol));
                        }
                        self.buf.extend_from_slice(&data);
                    }
                }
                Some(Err(e)) => {
                    self.done = true;
                    return Some(Err(e));
                }
                None => {
                    self.done = true;
                    if !self.buf.is_empty() {
                        return Some(Err(UpstreamError::Protocol));
                    }
                    return None;
                }
            }
        }
    }
}
