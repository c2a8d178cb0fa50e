//! W3C trace context across hops: HTTP headers and the transfer protocol's
//! `traceparent` field.

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use std::collections::HashMap;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Adds the current span's `traceparent` (and `tracestate`) to `headers`.
pub fn inject_headers(headers: &mut HeaderMap) {
    let cx = tracing::Span::current().context();
    TraceContextPropagator::new().inject_context(&cx, &mut HeaderInjector(headers));
}

/// The current span's W3C `traceparent`, when it belongs to a trace.
pub fn traceparent() -> Option<String> {
    let cx = tracing::Span::current().context();
    let mut map = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut map);
    map.remove("traceparent")
}

/// The remote parent named by a W3C `traceparent` (an empty context when
/// it does not parse).
pub fn parent_from(traceparent: &str) -> Context {
    let mut map = HashMap::new();
    map.insert("traceparent".to_owned(), traceparent.to_owned());
    TraceContextPropagator::new().extract(&map)
}

/// The remote parent carried by request headers.
pub(crate) fn parent_from_headers(headers: &HeaderMap) -> Context {
    TraceContextPropagator::new().extract(&HeaderExtractor(headers))
}

struct HeaderInjector<'a>(&'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(k, v);
        }
    }
}

struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

/// The W3C `traceparent` of `span` (for a hop that is not HTTP).
pub fn traceparent_of(span: &tracing::Span) -> Option<String> {
    let cx = span.context();
    let mut map = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut map);
    map.remove("traceparent")
}

/// Makes `span` a child of the remote span named by `traceparent` (call it
/// before the span is entered).
pub fn set_remote_parent(span: &tracing::Span, traceparent: &str) {
    let _ = span.set_parent(parent_from(traceparent));
}
