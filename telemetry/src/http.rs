//! The layer every component's router wears ([`instrument`]) and the
//! Prometheus endpoint ([`metrics_router`]).
//!
//! A request's id is the caller's `x-request-id` on an internal hop, else its
//! trace id. Each router says where it sits ([`Hop`]): at the edge
//! ([`Hop::Edge`], the gateway) an incoming `traceparent` or `x-request-id` is
//! ignored, and the control plane honours them only under `/admin/`
//! ([`Hop::InternalUnder`]), never from status-page readers. The span, the
//! duration metric and the log line finish when the response body ends or is
//! dropped, so a streamed answer is measured to its end.

use crate::propagate::parent_from_headers;
use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use opentelemetry::KeyValue;
use opentelemetry::metrics::{Histogram, UpDownCounter};
use opentelemetry::trace::TraceContextExt;
use std::sync::Arc;
use std::time::Instant;
use tracing::Instrument;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The header that carries a request's id to the client and between hops.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Where a router sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hop {
    /// Tenants call it: an incoming `traceparent` or `x-request-id` is
    /// ignored and every request starts its own trace.
    Edge,
    /// Other components call it: both are honoured.
    Internal,
    /// Paths under this prefix are [`Hop::Internal`], every other path is
    /// [`Hop::Edge`] (a control plane's admin API beside its public status
    /// page).
    InternalUnder(&'static str),
}

impl Hop {
    fn internal(self, path: &str) -> bool {
        match self {
            Hop::Edge => false,
            Hop::Internal => true,
            Hop::InternalUnder(prefix) => path.starts_with(prefix),
        }
    }
}

/// The id of the request being served: in the request's extensions, and
/// [`RequestId::current`] inside the handler's future.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(pub String);

tokio::task_local! {
    static CURRENT: RequestId;
}

impl RequestId {
    /// The id of the request whose handler is running, if any.
    pub fn current() -> Option<RequestId> {
        CURRENT.try_with(Clone::clone).ok()
    }

    /// Whether `s` may be used as an id from another hop: 1 to 64 ASCII
    /// letters, digits, `-`, `_` or `.`.
    pub fn valid(s: &str) -> bool {
        (1..=64).contains(&s.len())
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    }
}

/// Wraps `router`: a server span per request (named `METHOD /route`), the
/// `x-request-id` response header, `http.server.request.duration` and
/// `http.server.active_requests`, and a log line. Routes in `quiet` (route
/// templates such as `/health`, the routing long-poll, heartbeats) log at
/// debug unless they fail, and are not traced unless
/// `BULKHEAD_TRACE_POLLS=true` ([`trace_polls`](crate::trace_polls)): a poll every few seconds
/// per component would bury the traces of tenants' requests.
pub fn instrument(router: Router, hop: Hop, quiet: &'static [&'static str]) -> Router {
    let meter = crate::meter();
    let layer = Arc::new(HttpLayer {
        hop,
        quiet,
        duration: meter
            .f64_histogram("http.server.request.duration")
            .with_unit("s")
            .with_description(
                "Duration of HTTP server requests, until the response body ended or was dropped",
            )
            .with_boundaries(vec![
                0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
            ])
            .build(),
        active: meter
            .i64_up_down_counter("http.server.active_requests")
            .with_unit("{request}")
            .with_description("HTTP server requests in flight")
            .build(),
    });
    router.layer(axum::middleware::from_fn_with_state(layer, track))
}

/// `GET /metrics`: every instrument of this process in Prometheus text.
pub fn metrics_router() -> Router {
    Router::new().route("/metrics", get(metrics))
}

/// [`metrics_router`] on its own (an operator-only listener), instrumented.
pub fn metrics_app() -> Router {
    instrument(metrics_router(), Hop::Internal, &["/metrics"])
}

#[derive(Debug)]
struct HttpLayer {
    hop: Hop,
    quiet: &'static [&'static str],
    duration: Histogram<f64>,
    active: UpDownCounter<i64>,
}

/// Counts a request in flight until dropped (also when the client leaves
/// before the response).
struct Active(Arc<HttpLayer>, [KeyValue; 2]);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.active.add(-1, &self.1);
    }
}

/// What is left to do when a response ends: record its duration, log it,
/// and end its span (the last handle). Runs once, on drop.
struct Finish {
    layer: Arc<HttpLayer>,
    attrs: Vec<KeyValue>,
    started: Instant,
    span: tracing::Span,
    status: u16,
    quiet: bool,
    /// Routine polls and scrapes are not counted in flight.
    _active: Option<Active>,
}

impl Drop for Finish {
    fn drop(&mut self) {
        let elapsed = self.started.elapsed();
        self.layer
            .duration
            .record(elapsed.as_secs_f64(), &self.attrs);
        let ms = elapsed.as_secs_f64() * 1e3;
        let status = i64::from(self.status);
        // `tracing-opentelemetry` ends a span at its last exit, not when it
        // closes: entering it once more here makes the span end now.
        self.span.in_scope(|| {
            if self.quiet && self.status < 400 {
                tracing::debug!(target: "bulkhead::http", status, ms, "served");
            } else {
                tracing::info!(target: "bulkhead::http", status, ms, "served");
            }
        });
    }
}

/// A response body that finishes its request when it ends: at its last
/// frame, at an error, or when dropped unfinished (the client went away).
/// A streamed answer is measured to its end, not to its head.
struct Timed {
    inner: axum::body::Body,
    finish: Option<Finish>,
}

impl http_body::Body for Timed {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, std::task::Poll::Ready(None | Some(Err(_)))) {
            self.finish = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

async fn track(State(l): State<Arc<HttpLayer>>, mut req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = known_method(req.method().as_str());
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned());
    let name = match &route {
        Some(r) => format!("{method} {r}"),
        None => method.to_owned(),
    };
    let quiet = route.as_deref().is_some_and(|r| l.quiet.contains(&r));
    // Only spans at info and above become OpenTelemetry spans. A span's
    // level is fixed where it is written, hence one callsite per level.
    macro_rules! server_span {
        ($level:expr) => {
            tracing::span!(
                target: "bulkhead::http",
                $level,
                "http.request",
                otel.name = %name,
                otel.kind = "server",
                http.request.method = method,
                http.route = route.as_deref(),
                http.response.status_code = Empty,
                otel.status_code = Empty,
                request_id = Empty,
            )
        };
    }
    let span = if quiet && !crate::setup::trace_polls() {
        server_span!(tracing::Level::DEBUG)
    } else {
        server_span!(tracing::Level::INFO)
    };
    let id = request_id_of(&l, &req, &span);
    span.record("request_id", id.as_str());
    req.extensions_mut().insert(RequestId(id.clone()));

    let base = [
        KeyValue::new("http.request.method", method),
        KeyValue::new("url.scheme", "http"),
    ];
    // A scrape would always count itself, and a long-poll waits by design:
    // quiet routes are not requests in flight.
    let active = (!quiet).then(|| {
        l.active.add(1, &base);
        Active(l.clone(), base.clone())
    });
    let mut resp = CURRENT
        .scope(RequestId(id.clone()), next.run(req))
        .instrument(span.clone())
        .await;

    let status = resp.status();
    span.record("http.response.status_code", i64::from(status.as_u16()));
    if status.is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
    let attrs = response_attrs(&base, status, route.as_deref());
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert(REQUEST_ID_HEADER, v);
    }
    let finish = Finish {
        layer: l,
        attrs,
        started,
        span,
        status: status.as_u16(),
        quiet,
        _active: active,
    };
    resp.map(|inner| {
        axum::body::Body::new(Timed {
            inner,
            finish: Some(finish),
        })
    })
}

/// The request's id: the caller's on an internal hop (where it is a
/// trusted caller's), else the trace id, else random.
fn request_id_of(l: &HttpLayer, req: &Request, span: &tracing::Span) -> String {
    let mut incoming = None;
    if l.hop.internal(req.uri().path()) {
        let _ = span.set_parent(parent_from_headers(req.headers()));
        incoming = req
            .headers()
            .get(REQUEST_ID_HEADER)
            .and_then(|v| v.to_str().ok())
            .filter(|s| RequestId::valid(s))
            .map(str::to_owned);
    }
    incoming.unwrap_or_else(|| {
        let trace = span.context().span().span_context().trace_id();
        if trace == opentelemetry::trace::TraceId::INVALID {
            random_id()
        } else {
            trace.to_string()
        }
    })
}

/// The duration metric's attributes for a response.
fn response_attrs(
    base: &[KeyValue],
    status: axum::http::StatusCode,
    route: Option<&str>,
) -> Vec<KeyValue> {
    let mut attrs = base.to_vec();
    attrs.push(KeyValue::new(
        "http.response.status_code",
        i64::from(status.as_u16()),
    ));
    if let Some(r) = route {
        attrs.push(KeyValue::new("http.route", r.to_owned()));
    }
    if status.is_server_error() {
        attrs.push(KeyValue::new("error.type", status.as_u16().to_string()));
    }
    attrs
}

/// The method as OpenTelemetry names it (`_OTHER` for anything unknown,
/// so a client cannot mint label values).
fn known_method(m: &str) -> &'static str {
    match m {
        "GET" => "GET",
        "POST" => "POST",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        "HEAD" => "HEAD",
        "OPTIONS" => "OPTIONS",
        "CONNECT" => "CONNECT",
        "TRACE" => "TRACE",
        _ => "_OTHER",
    }
}

fn random_id() -> String {
    let mut b = [0u8; 16];
    let _ = getrandom::fill(&mut b);
    hex::encode(b)
}

async fn metrics() -> Response {
    let Some(registry) = crate::setup::registry() else {
        return (
            StatusCode::NOT_FOUND,
            "metrics are not set up in this process\n",
        )
            .into_response();
    };
    let encoded = tokio::task::spawn_blocking(move || {
        let mut buf = Vec::new();
        use prometheus::Encoder as _;
        prometheus::TextEncoder::new()
            .encode(&crate::declared::with_declared(registry.gather()), &mut buf)
            .map(|()| buf)
    })
    .await;
    match encoded {
        Ok(Ok(buf)) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            buf,
        )
            .into_response(),
        _ => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "metrics could not be encoded\n",
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_ids_cross_hops() {
        assert!(RequestId::valid("0af7651916cd43dd8448eb211c80319c"));
        assert!(RequestId::valid("req_1.a-b"));
        for bad in ["", "a b", "x\ny", "é", &"a".repeat(65), "a\"b"] {
            assert!(!RequestId::valid(bad), "{bad:?}");
        }
    }

    #[test]
    fn only_admin_paths_of_a_mixed_router_are_internal() {
        let hop = Hop::InternalUnder("/admin/");
        assert!(hop.internal("/admin/v1/routing"));
        assert!(!hop.internal("/api/v2/summary.json"));
        assert!(!hop.internal("/administrator"));
        assert!(!Hop::Edge.internal("/admin/v1/routing"));
        assert!(Hop::Internal.internal("/v1/generate"));
    }

    /// A body that sends one frame and then never ends.
    struct Endless(bool);

    impl http_body::Body for Endless {
        type Data = axum::body::Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
            if self.0 {
                return std::task::Poll::Pending;
            }
            self.0 = true;
            let first = http_body::Frame::data(axum::body::Bytes::from_static(b"first"));
            std::task::Poll::Ready(Some(Ok(first)))
        }
    }

    /// The request duration's sample count and the requests in flight.
    fn measured(registry: &prometheus::Registry) -> (u64, f64) {
        let families = registry.gather();
        let find = |name: &str| families.iter().find(|f| f.name() == name);
        let count = find("http_server_request_duration_seconds").map_or(0, |f| {
            f.get_metric()
                .iter()
                .map(|m| m.get_histogram().get_sample_count())
                .sum()
        });
        let active = find("http_server_active_requests").map_or(0.0, |f| {
            f.get_metric()
                .iter()
                .map(|m| m.get_gauge().get_value())
                .sum()
        });
        (count, active)
    }

    #[tokio::test]
    async fn a_response_is_measured_until_its_body_is_dropped() {
        use http_body_util::BodyExt as _;
        use tower::ServiceExt as _;
        let registry = prometheus::Registry::new();
        let reader = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .build()
            .expect("reader");
        let provider = opentelemetry_sdk::metrics::SdkMeterProvider::builder()
            .with_reader(reader)
            .build();
        opentelemetry::global::set_meter_provider(provider);
        let stream = || async { axum::body::Body::new(Endless(false)) };
        let app = instrument(Router::new().route("/stream", get(stream)), Hop::Edge, &[]);
        let req = Request::get("/stream")
            .body(axum::body::Body::empty())
            .expect("request");
        let mut body = app.oneshot(req).await.expect("response").into_body();
        let first = body.frame().await.expect("a frame").expect("data");
        assert_eq!(first.data_ref().map(|d| &d[..]), Some(&b"first"[..]));
        // Headers and a first frame sent: still in flight, not yet measured.
        assert_eq!(measured(&registry), (0, 1.0));
        // The client goes away mid-stream: the request ends there.
        drop(body);
        assert_eq!(measured(&registry), (1, 0.0));
    }

    #[test]
    fn methods_outside_the_list_are_other() {
        assert_eq!(known_method("GET"), "GET");
        assert_eq!(known_method("BREW"), "_OTHER");
    }
}
