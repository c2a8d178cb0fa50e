//! Bulkhead's model engine: LLaMA-architecture GGUF models served from a
//! paged, tenant-tagged KV pool with continuous batching.
//!
//! - [`ModelFile`] loads a GGUF file: weights (kept at their own quantization),
//!   hyperparameters, the tokenizer and the chat template.
//! - [`EngineCore`] is the synchronous heart: admitted sequences, one
//!   [`bulkhead_kv::KvPool`], and `step()`, one forward pass over a mix of
//!   prefill chunks and decode tokens.
//! - [`Engine`] runs an `EngineCore` on its own thread, fed by a closed enum of
//!   commands; callers submit requests and read token events from a channel.
//!   Model compute never runs on an async runtime.
//! - [`fetch`] gets and verifies the default model file.
//!
//! Admission happens in [`Engine::submit`] before anything reaches the engine
//! thread: a rejected request is an [`bulkhead_kv::AdmissionError`] and never
//! becomes a sequence. Admission counts the prefill work already queued on
//! the engine (`queue`), so a prompt that would miss its deadline behind
//! others is refused at once, not failed after waiting.

mod chat;
pub mod compute_gate;
mod config;
mod core;
mod decode_cost;
mod detok;
mod engine;
mod error;
pub mod fetch;
mod forward;
mod gguf;
pub mod hooks;
mod queue;
mod sampling;
mod schedule;
mod speed;
mod stops;
mod tokenizer;
mod trim;
mod vocab;

pub use crate::core::{
    EngineCore, EngineStats, FinishReason, Grant, LogitsError, PendingPrefill, PendingRequest,
    PrefillEvent, PromptProgress, SeqEvent, Usage,
};
pub use bulkhead_kernels::{SimdLevel, simd_level};
pub use bulkhead_kv::{CacheScope, Namespace};
pub use chat::{ChatMessage, ChatTemplate};
pub use compute_gate::ComputeGate;
pub use config::EngineConfig;
pub use engine::{Engine, EngineInfo, RequestHandle};
pub use error::{ConfigError, EngineError, LoadError, TransferFault};
pub use forward::Numerics;
pub use gguf::{LayerTensors, ModelConfig, ModelFile, Tensors};
pub use sampling::{Logprobs, MAX_TOP_LOGPROBS, SamplingParams, TokenLogprob};
pub use schedule::WorkClass;
pub use speed::PrefillSpeed;
pub use tokenizer::Tokenizer;
pub use trim::trim_layers;

/// Everything a sequence needs besides its prompt: how to sample and when to stop.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Sampling parameters, including `max_tokens`.
    pub sampling: SamplingParams,
    /// Strings that end generation (not included in the output).
    pub stop: Vec<String>,
    /// Keep generating past the end-of-sequence token (tests and benchmarks).
    pub ignore_eos: bool,
    /// The prefix-cache scope the platform chose for this request (from
    /// the authenticated tenant, never from the client); `None`: the
    /// request neither reuses nor leaves cached pages.
    pub cache: Option<CacheScope>,
    /// Whether its prompt work goes before or after interactive work (the
    /// platform's signed context says, never the client alone).
    pub class: WorkClass,
}

impl GenerateRequest {
    /// Exactly `max_tokens` greedy tokens after `prompt` (the end-of-sequence
    /// token ignored), with no stop string and no cache: a request whose
    /// cost is known in advance, as benchmarks and tests want.
    pub fn fixed_length(prompt: Vec<u32>, max_tokens: usize) -> Self {
        GenerateRequest {
            prompt,
            sampling: SamplingParams::greedy(max_tokens),
            stop: Vec::new(),
            ignore_eos: true,
            cache: None,
            class: WorkClass::Interactive,
        }
    }
}
