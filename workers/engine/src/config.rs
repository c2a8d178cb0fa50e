//! How an engine is set up: the KV budget and page size, step sizes, the
//! prefill deadline, tenants' shares, threads and numerics. Read by the
//! engine thread and the core alike.

use crate::forward::Numerics;
use std::time::Duration;

/// How an engine is set up. No `Default`: callers state the budget.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Bytes of KV memory; the pool gets as many whole pages as fit.
    pub kv_budget_bytes: usize,
    /// Tokens per KV page.
    pub page_size: usize,
    /// Zero pages when they are freed (costs time; off by default).
    pub scrub_on_free: bool,
    /// Tokens one step may process at most (prefill chunk budget).
    pub step_tokens: usize,
    /// About how long one step may take: the prefill budget of a step is
    /// what the measured speed computes in this time, so a request that
    /// arrives waits at most about one step for its turn.
    pub step_time: Duration,
    /// The longest a prompt may take to prefill alone at the measured
    /// speed; longer prompts are refused at admission
    /// ([`bulkhead_kv::AdmissionError::PrefillTooLong`]).
    pub prefill_deadline: Duration,
    /// Output tokens reserved with the prompt; the rest of `max_tokens` is
    /// taken page by page as the sequence generates.
    pub first_slice_tokens: usize,
    /// The share of the pool (percent) one tenant may hold while another
    /// tenant waits for pages.
    pub tenant_share_percent: usize,
    /// Compute threads.
    pub threads: usize,
    /// Rounding of the forward pass; `LlamaCpp` by default.
    pub numerics: Numerics,
    /// Keep full prompt pages after a request for later prompts of the
    /// same namespace that start with them (requests carry their scope,
    /// [`crate::GenerateRequest::cache`]); on by default.
    pub prefix_cache: bool,
    /// A request that was to land its prompt from a prefill worker
    /// computes it here instead when at most this many of its tokens are
    /// not in this pool's prefix cache: for a short prompt the transfer's
    /// round trip and the prefill worker's queue cost more than a few
    /// tokens in a step here (Dynamo's conditional disaggregation). 0 in
    /// [`EngineConfig::with_budget`], so every such request lands unless
    /// the cache holds all of it but a short suffix; the workers' command
    /// line sets 64.
    pub local_prefill_tokens: usize,
    /// Tests only (the `test-hooks` feature; refused otherwise): every
    /// request after this many picks the runner-up of each greedy choice,
    /// a worker whose answers went wrong, for the leak prober to catch.
    pub corrupt_answers_after: Option<u64>,
    /// A [`crate::ComputeGate`] file this engine holds while it computes,
    /// so that background work on the same host (the embedding worker
    /// `up` starts) waits for it; `None` in [`EngineConfig::with_budget`].
    pub compute_gate: Option<std::path::PathBuf>,
}

impl EngineConfig {
    /// The serving defaults for a KV budget of `kv_budget_bytes`: 16-token
    /// pages, no scrubbing, steps of about 200 ms and at most 512 tokens, a
    /// 60 s prefill deadline, 64 output tokens reserved with the prompt, a
    /// tenant holding at most half the pool while others wait, one thread
    /// per core, llama.cpp numerics, the prefix cache on. Owner checks are
    /// always on.
    pub fn with_budget(kv_budget_bytes: usize) -> Self {
        EngineConfig {
            kv_budget_bytes,
            page_size: 16,
            scrub_on_free: false,
            step_tokens: 512,
            step_time: Duration::from_millis(200),
            prefill_deadline: Duration::from_secs(60),
            first_slice_tokens: 64,
            tenant_share_percent: 50,
            threads: std::thread::available_parallelism().map_or(1, usize::from),
            numerics: Numerics::LlamaCpp,
            prefix_cache: true,
            local_prefill_tokens: 0,
            corrupt_answers_after: None,
            compute_gate: None,
        }
    }
}
