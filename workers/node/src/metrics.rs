//! The worker's counters, moved where the work happens: admission
//! rejections by reason, refused contexts and metered tokens. KV pool
//! gauges, transfers and the isolation guards' counters (checksum failures,
//! owner-tag violations, late and duplicate frames) are kept by the engine
//! and the transfer owners and read when a reader collects ([`crate::gauges`]),
//! never copied on the hot path.
//!
//! The worker's spans, made where the work happens: `POST /v1/generate`
//! (server), `generate`, `kv.transfer` (decode, from submission to commit,
//! rejection, abort, timeout or connection loss, recorded in
//! `bulkhead.transfer.outcome`; `not_opened` when the engine finished the
//! prompt from decode's own cache), `prefill`, `prefill.compute` and
//! `kv.transfer.send` (prefill, from admission to release or abort).

use bulkhead_kv::AdmissionError;
use bulkhead_telemetry::KeyValue;
use bulkhead_telemetry::metrics::Counter;
use std::sync::OnceLock;

/// Counts a request refused at admission because of `reason` (see
/// [`AdmissionError::reason`]; `grant_mismatch` for a prefill request whose
/// slots do not match its prompt).
pub(crate) fn admission_rejected(reason: &'static str) {
    rejections().add(1, &rejection_attrs(reason));
}

/// Counts the tokens a served call used, per model and kind (`input`,
/// `output`): the metering's own totals, by model only (accounts are in
/// the ledger, not in label sets).
pub(crate) fn usage_recorded(model: &str, prompt_tokens: u64, completion_tokens: u64) {
    static C: OnceLock<Counter<u64>> = OnceLock::new();
    let c = C.get_or_init(|| {
        bulkhead_telemetry::meter()
            .u64_counter("bulkhead.usage.tokens")
            .with_description("Tokens metered for billing, by model and kind (input, output)")
            .with_unit("{token}")
            .build()
    });
    for (kind, n) in [("input", prompt_tokens), ("output", completion_tokens)] {
        c.add(
            n,
            &[
                KeyValue::new("gen_ai.request.model", model.to_owned()),
                KeyValue::new("gen_ai.token.type", kind),
            ],
        );
    }
}

/// Counts a generate call refused for its tenant context (`reason`: the
/// error code, e.g. `replayed_context`).
pub(crate) fn context_refused(reason: &'static str) {
    static C: OnceLock<Counter<u64>> = OnceLock::new();
    C.get_or_init(|| {
        bulkhead_telemetry::meter()
            .u64_counter("bulkhead.worker.context.refusals")
            .with_description("Generate calls refused for their signed tenant context, before anything was allocated")
            .with_unit("{request}")
            .build()
    })
    .add(1, &rejection_attrs(reason));
}

/// Counts a test fault this worker injected (`fault`, e.g.
/// `embedding_crossed`), so a fault-injection test can assert that its
/// fault happened. Test builds only.
#[cfg(feature = "test-hooks")]
pub(crate) fn fault_injected(fault: &'static str) {
    static C: OnceLock<Counter<u64>> = OnceLock::new();
    let mut a = BASE.get().cloned().unwrap_or_default();
    a.push(KeyValue::new("fault", fault));
    C.get_or_init(|| {
        bulkhead_telemetry::meter()
            .u64_counter("bulkhead.test.faults.injected")
            .with_description("Test faults injected by this worker (test builds only)")
            .with_unit("{fault}")
            .build()
    })
    .add(1, &a);
}

/// This worker's `node` and `role`, set once by [`set_base`].
static BASE: OnceLock<Vec<KeyValue>> = OnceLock::new();

fn rejection_attrs(reason: &'static str) -> Vec<KeyValue> {
    let mut a = BASE.get().cloned().unwrap_or_default();
    a.push(KeyValue::new("reason", reason));
    a
}

fn rejections() -> &'static Counter<u64> {
    static C: OnceLock<Counter<u64>> = OnceLock::new();
    C.get_or_init(|| {
        bulkhead_telemetry::meter()
            .u64_counter("bulkhead.admission.rejections")
            .with_description("Requests refused at admission, before any KV page or transfer")
            .with_unit("{request}")
            .build()
    })
}

/// Sets this worker's `node` and `role` labels (once per process) and
/// shows every rejection reason at zero; the labels, for other instruments.
pub(crate) fn set_base(node: &str, role: &'static str) -> Vec<KeyValue> {
    let base = vec![
        KeyValue::new("node", node.to_owned()),
        KeyValue::new("role", role),
    ];
    let _ = BASE.set(base.clone());
    for reason in AdmissionError::REASONS
        .into_iter()
        .chain(["grant_mismatch"])
    {
        rejections().add(0, &rejection_attrs(reason));
    }
    base
}
