//! The gateway's instruments: the GenAI semantic conventions measured where
//! tenants see them (request duration, time to first token, time per output
//! token, token usage), rate-limit and budget refusals, neurons by model, and the routing-table version
//! this gateway serves. Labels are model slugs, operation names and error
//! codes: never prompt text, never a tenant's token.

use crate::watch::RoutingWatch;
use bulkhead_telemetry::KeyValue;
use bulkhead_telemetry::metrics::{Counter, Histogram};
use std::sync::OnceLock;
use std::time::Instant;

/// `gen_ai.provider.name` of every request served here.
pub(crate) const PROVIDER: &str = "bulkhead";

struct Instruments {
    duration: Histogram<f64>,
    ttft: Histogram<f64>,
    tpot: Histogram<f64>,
    tokens: Histogram<u64>,
    refusals: Counter<u64>,
    connections_refused: Counter<u64>,
    heads_refused: Counter<u64>,
    retries: Counter<u64>,
    neurons: Counter<f64>,
}

fn instruments() -> &'static Instruments {
    static I: OnceLock<Instruments> = OnceLock::new();
    I.get_or_init(|| {
        let m = bulkhead_telemetry::meter();
        Instruments {
            duration: m
                .f64_histogram("gen_ai.server.request.duration")
                .with_unit("s")
                .with_description("Generative AI server request duration")
                .with_boundaries(vec![
                    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                    40.96, 81.92,
                ])
                .build(),
            ttft: m
                .f64_histogram("gen_ai.server.time_to_first_token")
                .with_unit("s")
                .with_description("Time to generate the first token of a successful response")
                .with_boundaries(vec![
                    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                    5.0, 7.5, 10.0,
                ])
                .build(),
            tpot: m
                .f64_histogram("gen_ai.server.time_per_output_token")
                .with_unit("s")
                .with_description("Time per output token after the first, of successful responses")
                .with_boundaries(vec![
                    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                ])
                .build(),
            tokens: m
                .u64_histogram("gen_ai.client.token.usage")
                .with_unit("{token}")
                .with_description(
                    "Input and output tokens of each request, as the workers counted them",
                )
                .with_boundaries(vec![
                    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0,
                    1048576.0, 4194304.0, 16777216.0, 67108864.0,
                ])
                .build(),
            refusals: m
                .u64_counter("bulkhead.gateway.rate_limit.refusals")
                .with_unit("{request}")
                .with_description(
                    "Requests refused by a per-account limit, before any counter moved",
                )
                .build(),
            connections_refused: m
                .u64_counter("bulkhead.gateway.connections.refused")
                .with_unit("{connection}")
                .with_description("Connections closed at accept by a connection cap")
                .build(),
            heads_refused: m
                .u64_counter("bulkhead.gateway.heads.refused")
                .with_unit("{request}")
                .with_description(
                    "Requests refused before routing: headers over the limit or malformed",
                )
                .build(),
            retries: m
                .u64_counter("bulkhead.gateway.upstream.retries")
                .with_unit("{request}")
                .with_description(
                    "Requests sent to another worker after one failed before the first byte",
                )
                .build(),
            neurons: m
                .f64_counter("bulkhead.gateway.neurons")
                .with_unit("{neuron}")
                .with_description(
                    "Neurons of answered requests, at the model's price, as the gateway settled them against budgets (the ledger also bills abandoned streams)",
                )
                .build(),
        }
    })
}

/// Counts what an answered request cost, by model (never by account: the
/// ledger has the per-account figures).
pub(crate) fn neurons(model: &str, micro: u64) {
    instruments().neurons.add(
        micro as f64 / bulkhead_control_api::MICRO as f64,
        &[KeyValue::new("gen_ai.request.model", model.to_owned())],
    );
}

/// Counts a connection closed at accept by the cap named `cap`.
pub(crate) fn connection_refused(cap: &'static str) {
    instruments()
        .connections_refused
        .add(1, &[KeyValue::new("cap", cap)]);
}

/// Counts a request whose head was refused (`error.type`).
pub(crate) fn head_refused(kind: &'static str) {
    instruments()
        .heads_refused
        .add(1, &[KeyValue::new("error.type", kind)]);
}

/// Counts a request sent to another worker after one failed it before
/// anything reached the client.
pub(crate) fn retried() {
    instruments().retries.add(1, &[]);
}

/// Counts a refusal by a budget (`limit` is `daily_budget` or
/// `monthly_budget`).
pub(crate) fn budget_refused(period: crate::budget::Period) {
    let limit = match period {
        crate::budget::Period::Daily => "daily_budget",
        crate::budget::Period::Monthly => "monthly_budget",
    };
    instruments()
        .refusals
        .add(1, &[KeyValue::new("limit", limit)]);
}

/// Counts a refusal by the limit named `what` (the limiter's words).
pub(crate) fn rate_limited(what: &str) {
    instruments()
        .refusals
        .add(1, &[KeyValue::new("limit", limit_label(what))]);
}

fn limit_label(what: &str) -> &'static str {
    match what {
        "requests per minute" => "requests_per_minute",
        "tokens per minute" => "tokens_per_minute",
        "concurrent requests" => "concurrency",
        _ => "other",
    }
}

/// One generation's GenAI measurements, from the moment the gateway
/// accepted it.
#[derive(Debug)]
pub(crate) struct GenAiTimer {
    started: Instant,
    first: Option<Instant>,
    model: String,
    attrs: Vec<KeyValue>,
    /// Recorded (finished or failed); otherwise dropping it records a
    /// cancellation (the client went away before the end).
    recorded: bool,
}

impl GenAiTimer {
    /// Starts timing a request for `model` doing `operation` (`chat` or
    /// `text_completion`).
    pub(crate) fn start(model: &str, operation: &'static str) -> Self {
        GenAiTimer {
            started: Instant::now(),
            first: None,
            model: model.to_owned(),
            recorded: false,
            attrs: vec![
                KeyValue::new("gen_ai.operation.name", operation),
                KeyValue::new("gen_ai.provider.name", PROVIDER),
                KeyValue::new("gen_ai.request.model", model.to_owned()),
            ],
        }
    }

    /// The first token (or the end, for an empty answer) arrived.
    pub(crate) fn first_token(&mut self) {
        if self.first.is_none() {
            self.first = Some(Instant::now());
        }
    }

    /// A successful end with the worker's usage.
    pub(crate) fn finished(mut self, prompt_tokens: usize, completion_tokens: usize) {
        self.recorded = true;
        self.first_token();
        let i = instruments();
        let now = Instant::now();
        let total = now - self.started;
        let first = self.first.unwrap_or(now) - self.started;
        let mut a = self.attrs.clone();
        a.push(KeyValue::new("gen_ai.response.model", self.model.clone()));
        i.duration.record(total.as_secs_f64(), &a);
        i.ttft.record(first.as_secs_f64(), &a);
        if completion_tokens > 1 {
            let per = (total - first).as_secs_f64() / (completion_tokens - 1) as f64;
            i.tpot.record(per, &a);
        }
        let mut input = self.attrs.clone();
        input.push(KeyValue::new("gen_ai.token.type", "input"));
        i.tokens.record(prompt_tokens as u64, &input);
        let mut output = std::mem::take(&mut self.attrs);
        output.push(KeyValue::new("gen_ai.token.type", "output"));
        i.tokens.record(completion_tokens as u64, &output);
    }

    /// A failed end; `error_type` is the error's kind
    /// (`context_length_exceeded`, `rate_limited`, `upstream`, `client_gone`,
    /// ...).
    pub(crate) fn failed(mut self, error_type: &'static str) {
        self.record_failure(error_type);
    }

    fn record_failure(&mut self, error_type: &'static str) {
        self.recorded = true;
        let mut a = std::mem::take(&mut self.attrs);
        a.push(KeyValue::new("error.type", error_type));
        instruments()
            .duration
            .record(self.started.elapsed().as_secs_f64(), &a);
    }
}

impl Drop for GenAiTimer {
    fn drop(&mut self) {
        if !self.recorded {
            self.record_failure("cancelled");
        }
    }
}

/// Exposes the routing-table version `watch` serves as
/// `bulkhead.gateway.routing.version{gateway}`, and zeroes the refusal
/// counters so every series exists before the first refusal.
pub fn register(watch: &RoutingWatch, gateway: &str) {
    for what in [
        "requests per minute",
        "tokens per minute",
        "concurrent requests",
    ] {
        instruments()
            .refusals
            .add(0, &[KeyValue::new("limit", limit_label(what))]);
    }
    let watch = watch.clone();
    let attrs = [KeyValue::new("gateway", gateway.to_owned())];
    bulkhead_telemetry::meter()
        .u64_observable_gauge("bulkhead.gateway.routing.version")
        .with_description("The routing-table version this gateway serves")
        .with_callback(move |o| {
            if let Ok(s) = watch.current() {
                o.observe(s.table.version(), &attrs);
            }
        })
        .build();
}
