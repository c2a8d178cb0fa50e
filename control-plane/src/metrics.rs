//! The control plane's instruments: visibility flips and how long each took
//! to reach every gateway, and the routing-table version it publishes.

use crate::hub::Hub;
use bulkhead_control_api::Visibility;
use bulkhead_telemetry::KeyValue;
use bulkhead_telemetry::metrics::{Counter, Histogram};
use std::sync::OnceLock;
use std::time::Duration;

struct Instruments {
    flips: Counter<u64>,
    propagation: Histogram<f64>,
}

const PROPAGATION_HELP: &str =
    "From a visibility or allowlist change to every live gateway enforcing it";
const PROPAGATION_BOUNDS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

fn instruments() -> &'static Instruments {
    static I: OnceLock<Instruments> = OnceLock::new();
    I.get_or_init(|| {
        let m = bulkhead_telemetry::meter();
        Instruments {
            flips: m
                .u64_counter("bulkhead.control_plane.visibility.flips")
                .with_unit("{flip}")
                .with_description("Model visibility changes, by the visibility set")
                .build(),
            propagation: m
                .f64_histogram("bulkhead.control_plane.flip.propagation")
                .with_unit("s")
                .with_description(PROPAGATION_HELP)
                .with_boundaries(PROPAGATION_BOUNDS.to_vec())
                .build(),
        }
    })
}

fn label(v: Visibility) -> &'static str {
    match v {
        Visibility::Public => "public",
        Visibility::Private => "private",
    }
}

/// Counts a visibility flip to `to`.
pub(crate) fn flipped(to: Visibility) {
    instruments()
        .flips
        .add(1, &[KeyValue::new("visibility", label(to))]);
}

/// Records how long a change took to reach every gateway.
pub(crate) fn propagated(took: Duration) {
    instruments().propagation.record(took.as_secs_f64(), &[]);
}

/// Zeroes the flip counters, serves the propagation histogram empty until
/// the first flip, and exposes `bulkhead.routing.version`, the version
/// `hub` publishes.
pub(crate) fn register(hub: &Hub) {
    let name = "bulkhead_control_plane_flip_propagation_seconds";
    if let Err(e) =
        bulkhead_telemetry::declare_histogram(name, PROPAGATION_HELP, &PROPAGATION_BOUNDS)
    {
        tracing::warn!(error = %e, "the flip histogram is not served before the first flip");
    }
    for v in [Visibility::Public, Visibility::Private] {
        instruments()
            .flips
            .add(0, &[KeyValue::new("visibility", label(v))]);
    }
    let hub = hub.clone();
    bulkhead_telemetry::meter()
        .u64_observable_gauge("bulkhead.routing.version")
        .with_description("The routing-table version the control plane publishes")
        .with_callback(move |o| o.observe(hub.version(), &[]))
        .build();
}
