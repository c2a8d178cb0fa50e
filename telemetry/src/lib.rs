//! Traces, metrics and logs for every Bulkhead component, set up once at
//! start by [`init`]:
//!
//! - **traces**: `tracing` spans become OpenTelemetry spans, exported over
//!   OTLP (http/protobuf) when `OTEL_EXPORTER_OTLP_ENDPOINT` (or the traces
//!   endpoint) is set and kept in process otherwise; W3C `traceparent`
//!   crosses every hop ([`inject_headers`], [`traceparent`], [`parent_from`]);
//! - **metrics**: OpenTelemetry instruments from [`meter`], read by a
//!   Prometheus registry that [`metrics_router`] serves on `/metrics`, and
//!   exported over OTLP when configured;
//! - **logs**: `tracing` events as text (or JSON with
//!   `BULKHEAD_LOG_FORMAT=json`) on stderr, filtered by `RUST_LOG`.
//!
//! [`instrument`] wraps a router: every request gets a server span, an
//! `x-request-id` (echoed to the client and carried to the next hop), the
//! HTTP server metrics, and one log line. Prompt text never enters a span,
//! a log line or a metric label: the layer records only the method, the
//! route template, the status and the request id.

mod declared;
mod http;
mod propagate;
mod setup;

pub use declared::declare_histogram;
pub use http::{Hop, REQUEST_ID_HEADER, RequestId, instrument, metrics_app, metrics_router};
pub use propagate::{inject_headers, parent_from, set_remote_parent, traceparent, traceparent_of};
pub use setup::{Settings, Telemetry, TelemetryError, init, init_with_logs, trace_polls};

/// A count as a span attribute. `tracing-opentelemetry` exports `i64`,
/// `f64`, `bool` and strings as themselves but any other integer (`u64`,
/// `usize`, `u16`) as its text, so a count recorded as such would reach a
/// trace backend as a string: every numeric span field goes through this.
pub fn int<T: TryInto<i64>>(v: T) -> i64 {
    v.try_into().unwrap_or(i64::MAX)
}

/// The meter every Bulkhead instrument comes from.
pub fn meter() -> opentelemetry::metrics::Meter {
    opentelemetry::global::meter("bulkhead")
}

pub use opentelemetry::KeyValue;
pub use opentelemetry::metrics;
