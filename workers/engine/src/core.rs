//! The synchronous engine: admitted requests, running sequences, one KV pool,
//! and `step()`, one forward pass over a mixed batch.
//!
//! Continuous batching: between steps, waiting requests join the running
//! batch as soon as the pool can hold all their pages; each step takes one
//! token from every decoding sequence and fills the rest of the token budget
//! with prefill chunks. Finished, failed and cancelled sequences return their
//! pages at once.

use crate::GenerateRequest;
use crate::detok::{Detokenizer, Piece};
use crate::engine::EngineConfig;
use crate::error::{ConfigError, EngineError};
use crate::forward::{BatchSeq, Buffers, Numerics, Rope, forward};
use crate::gguf::ModelFile;
use crate::sampling::Sampler;
use bulkhead_kv::{
    AdmissionError, Admitted, KvDtype, KvGeometry, KvPool, Limits, Owner, OwnerChecks, PageTable,
    PoolCounters, RequestId,
};
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedSender;

/// What a request's consumer receives.
#[derive(Debug, Clone, PartialEq)]
pub enum SeqEvent {
    /// A generated token and the text it completes (may be empty while a
    /// character or a possible stop string is incomplete).
    Token {
        /// The token id.
        id: u32,
        /// New text.
        text: String,
    },
    /// Generation ended normally; `text` is any text held back until now.
    Finished {
        /// Why it ended.
        reason: FinishReason,
        /// Remaining text.
        text: String,
        /// Token counts.
        usage: Usage,
    },
    /// Generation failed; no further events follow.
    Failed(EngineError),
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// End-of-sequence token or a stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// Cancelled by the client.
    Cancelled,
}

impl FinishReason {
    /// The OpenAI-style name.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

/// Token counts of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
}

/// Why [`EngineCore::last_logits`] produced nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LogitsError {
    /// Admission refused the tokens.
    #[error(transparent)]
    Admission(#[from] AdmissionError),
    /// The pool has no room now.
    #[error(transparent)]
    Busy(#[from] bulkhead_kv::PoolExhausted),
    /// The pass failed.
    #[error(transparent)]
    Engine(EngineError),
    /// No tokens were given.
    #[error("no tokens")]
    Empty,
}

pub(crate) type Sink = UnboundedSender<SeqEvent>;

/// A request waiting for pages (opaque).
#[derive(Debug)]
pub struct PendingRequest {
    request: GenerateRequest,
    sink: Sink,
}

#[derive(Debug)]
struct Sequence {
    owner: Owner,
    table: PageTable,
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Positions whose keys and values are in the pages.
    computed: usize,
    max_tokens: usize,
    ignore_eos: bool,
    sampler: Sampler,
    detok: Detokenizer,
    sink: Sink,
    done: bool,
}

/// The engine state, owned by one thread.
#[derive(Debug)]
pub struct EngineCore {
    model: Arc<ModelFile>,
    rope: Rope,
    numerics: Numerics,
    pool: KvPool,
    limits: Limits,
    step_tokens: usize,
    waiting: VecDeque<Admitted<PendingRequest>>,
    running: Vec<Sequence>,
    buffers: Buffers,
}

impl EngineCore {
    /// Builds the engine state and its KV pool from `config`.
    pub fn new(model: Arc<ModelFile>, config: &EngineConfig) -> Result<Self, ConfigError> {
        let c = model.config();
        if config.page_size == 0 || config.page_size > 256 {
            return Err(ConfigError::PageSize(config.page_size));
        }
        let geometry = KvGeometry {
            layers: c.layers,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            page_size: config.page_size,
            // llama.cpp keeps an f16 cache; the f32 reference keeps f32.
            dtype: match config.numerics {
                Numerics::LlamaCpp => KvDtype::F16,
                Numerics::F32Reference => KvDtype::F32,
            },
        };
        let pages = geometry.pages_for_budget(config.kv_budget_bytes);
        if pages == 0 {
            return Err(ConfigError::NoPages {
                budget: config.kv_budget_bytes,
                page_bytes: geometry.bytes_per_page(),
            });
        }
        let mut pool = KvPool::new(geometry, pages, config.scrub_on_free);
        pool.set_owner_checks(config.owner_checks);
        let limits = Limits {
            context_window: c.context_window,
            pool_tokens: pool.capacity_tokens(),
            page_size: config.page_size,
        };
        Ok(EngineCore {
            rope: Rope::new(c, config.numerics),
            numerics: config.numerics,
            model,
            pool,
            limits,
            step_tokens: config.step_tokens.max(1),
            waiting: VecDeque::new(),
            running: Vec::new(),
            buffers: Buffers::default(),
        })
    }

    /// What one request may hold.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Admits a request against this engine's limits (touches no page).
    pub fn admit(
        limits: &Limits,
        owner: Owner,
        request: GenerateRequest,
        sink: Sink,
    ) -> Result<Admitted<PendingRequest>, AdmissionError> {
        let (prompt, max) = (request.prompt.len(), request.sampling.max_tokens);
        limits.admit(owner, prompt, max, PendingRequest { request, sink })
    }

    /// Queues an admitted request; it joins the batch when its pages fit.
    pub fn submit(&mut self, admitted: Admitted<PendingRequest>) {
        self.waiting.push_back(admitted);
    }

    /// Cancels a request: its pages return to the pool at once.
    pub fn cancel(&mut self, id: RequestId) {
        if let Some(i) = self.waiting.iter().position(|a| a.owner().request == id) {
            if let Some(a) = self.waiting.remove(i) {
                let p = a.into_payload();
                let _ = p.sink.send(SeqEvent::Finished {
                    reason: FinishReason::Cancelled,
                    text: String::new(),
                    usage: Usage {
                        prompt_tokens: p.request.prompt.len(),
                        completion_tokens: 0,
                    },
                });
            }
            return;
        }
        if let Some(seq) = self.running.iter_mut().find(|s| s.owner.request == id) {
            seq.finish(FinishReason::Cancelled);
        }
        self.reap();
    }

    /// Nothing waiting and nothing running.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// KV pool counters.
    pub fn counters(&self) -> PoolCounters {
        self.pool.counters()
    }

    /// The pool, for inspection in tests.
    pub fn pool(&self) -> &KvPool {
        &self.pool
    }

    /// Changes the pool's tag checks and scrubbing between runs, so the
    /// overhead benchmark can compare settings on the same memory.
    pub fn set_pool_options(&mut self, checks: OwnerChecks, scrub_on_free: bool) {
        self.pool.set_owner_checks(checks);
        self.pool.set_scrub_on_free(scrub_on_free);
    }

    /// Runs one step. Returns whether any work was done. Call inside the
    /// engine's rayon pool.
    pub fn step(&mut self) -> bool {
        self.join_waiting();
        if self.running.is_empty() {
            return false;
        }
        // Decode tokens first, then prefill chunks, within the token budget.
        let mut budget = self.step_tokens;
        let mut plan: Vec<(usize, usize, usize)> = Vec::new(); // (seq, start, len)
        for (i, s) in self.running.iter().enumerate() {
            if s.computed >= s.prompt_len && budget > 0 {
                plan.push((i, s.computed, s.tokens.len() - s.computed));
                budget -= 1;
            }
        }
        for (i, s) in self.running.iter().enumerate() {
            if s.computed < s.prompt_len && budget > 0 {
                let len = (s.prompt_len - s.computed).min(budget);
                plan.push((i, s.computed, len));
                budget -= len;
            }
        }
        let batch: Vec<BatchSeq<'_>> = plan
            .iter()
            .map(|&(i, start, len)| {
                let s = &self.running[i];
                BatchSeq {
                    owner: s.owner,
                    table: &s.table,
                    start,
                    tokens: &s.tokens[start..start + len],
                    want_logits: start + len == s.tokens.len(),
                }
            })
            .collect();
        let model = &self.model;
        let out = forward(
            model,
            &self.rope,
            self.numerics,
            &mut self.pool,
            &batch,
            &mut self.buffers,
        );
        drop(batch);

        for (b, violation) in out.violations {
            self.pool.quarantine(&violation);
            let seq = &mut self.running[plan[b].0];
            let _ = seq
                .sink
                .send(SeqEvent::Failed(EngineError::Integrity(violation)));
            seq.done = true;
        }
        for &(i, _, len) in &plan {
            self.running[i].computed += len;
        }
        let tokenizer = model.tokenizer();
        let vocab = model.config.vocab;
        for (b, logits) in out.logits.iter().zip(self.buffers.logits.chunks_mut(vocab)) {
            let seq = &mut self.running[plan[*b].0];
            if !seq.done {
                seq.accept(logits, tokenizer);
            }
        }
        self.reap();
        true
    }

    /// Runs `tokens` through the model on pages of this pool (admitted,
    /// allocated and released like any request) and returns the logits of
    /// the last position. Used to score text and to test the forward pass.
    pub fn last_logits(&mut self, owner: Owner, tokens: &[u32]) -> Result<Vec<f32>, LogitsError> {
        let admitted = self.limits.admit(owner, tokens.len(), 1, ())?;
        let table = self.pool.allocate(&admitted)?;
        let model = Arc::clone(&self.model);
        let mut start = 0;
        let mut result = Err(LogitsError::Empty);
        while start < tokens.len() {
            let len = (tokens.len() - start).min(self.step_tokens);
            let batch = [BatchSeq {
                owner,
                table: &table,
                start,
                tokens: &tokens[start..start + len],
                want_logits: start + len == tokens.len(),
            }];
            let out = forward(
                &model,
                &self.rope,
                self.numerics,
                &mut self.pool,
                &batch,
                &mut self.buffers,
            );
            if let Some((_, v)) = out.violations.into_iter().next() {
                self.pool.quarantine(&v);
                result = Err(LogitsError::Engine(EngineError::Integrity(v)));
                break;
            }
            if !out.logits.is_empty() {
                result = Ok(self.buffers.logits[..model.config.vocab].to_vec());
            }
            start += len;
        }
        self.pool.release(table);
        result
    }

    fn join_waiting(&mut self) {
        while let Some(front) = self.waiting.front() {
            let Ok(table) = self.pool.allocate(front) else {
                break;
            };
            let admitted = self.waiting.pop_front().expect("front exists");
            let owner = admitted.owner();
            let max_tokens = admitted.max_tokens();
            let PendingRequest { request, sink } = admitted.into_payload();
            let prompt_len = request.prompt.len();
            let mut tokens = request.prompt;
            tokens.reserve(max_tokens);
            self.running.push(Sequence {
                owner,
                table,
                tokens,
                prompt_len,
                computed: 0,
                max_tokens,
                ignore_eos: request.ignore_eos,
                sampler: Sampler::new(request.sampling),
                detok: Detokenizer::new(request.stop),
                sink,
                done: false,
            });
        }
    }

    /// Removes finished sequences and returns their pages.
    fn reap(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].done {
                let seq = self.running.swap_remove(i);
                self.pool.release(seq.table);
            } else {
                i += 1;
            }
        }
    }

    /// Fault injection for tests: points page-table entry `index` of
    /// `victim` at the page `source` holds at `source_index`.
    #[cfg(feature = "fault-injection")]
    pub fn redirect_page_for_fault_injection(
        &mut self,
        victim: RequestId,
        index: usize,
        source: RequestId,
        source_index: usize,
    ) -> bool {
        let Some(target) = self
            .running
            .iter()
            .find(|s| s.owner.request == source)
            .map(|s| s.table.pages()[source_index])
        else {
            return false;
        };
        match self.running.iter_mut().find(|s| s.owner.request == victim) {
            Some(s) => {
                s.table.redirect_for_fault_injection(index, target);
                true
            }
            None => false,
        }
    }

    /// Physical pages a running request holds (for tests).
    pub fn pages_of(&self, id: RequestId) -> Option<Vec<bulkhead_kv::PageRef>> {
        self.running
            .iter()
            .find(|s| s.owner.request == id)
            .map(|s| s.table.pages().to_vec())
    }
}

impl Sequence {
    fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt_len,
            completion_tokens: self.tokens.len() - self.prompt_len,
        }
    }

    fn finish(&mut self, reason: FinishReason) {
        let text = self.detok.finish();
        let _ = self.sink.send(SeqEvent::Finished {
            reason,
            text,
            usage: self.usage(),
        });
        self.done = true;
    }

    /// Samples the next token from `logits` and emits its events.
    fn accept(&mut self, logits: &mut [f32], tokenizer: &crate::Tokenizer) {
        let id = self.sampler.sample(logits, &self.tokens);
        if id == tokenizer.eos() && !self.ignore_eos {
            self.finish(FinishReason::Stop);
            return;
        }
        self.tokens.push(id);
        let (text, stopped) = match self.detok.push(tokenizer, id) {
            Piece::Text(t) => (t, false),
            Piece::Stopped(t) => (t, true),
        };
        if self.sink.send(SeqEvent::Token { id, text }).is_err() {
            // The consumer is gone: stop and free the pages.
            self.done = true;
            return;
        }
        if stopped {
            self.finish(FinishReason::Stop);
        } else if self.tokens.len() - self.prompt_len >= self.max_tokens {
            self.finish(FinishReason::Length);
        }
    }
}
