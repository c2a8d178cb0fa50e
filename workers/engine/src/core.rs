//! The synchronous engine: admitted requests, running sequences, one KV pool,
//! and `step()`, one forward pass over a mixed batch.
//!
//! Continuous batching: between steps, waiting requests join the running
//! batch as soon as the pool can hold all their pages, taking turns by
//! tenant (the tenant holding the fewest pages first); each step takes one
//! token from every decoding sequence and fills the rest of the token
//! budget with prefill chunks shared fairly across tenants. Finished,
//! failed and cancelled sequences return their pages at once.

use crate::GenerateRequest;
use crate::detok::{Detokenizer, Piece};
use crate::engine::EngineConfig;
use crate::error::{ConfigError, EngineError, TransferFault};
use crate::forward::{BatchSeq, Buffers, Numerics, Rope, forward};
use crate::gguf::ModelFile;
use crate::sampling::Sampler;
use crate::schedule::{PrefillWork, fair_chunks};
use bulkhead_kv::{
    AdmissionError, Admitted, AllocError, Generation, Home, KvDtype, KvGeometry, KvPool, LentPage,
    Limits, Owner, PageTable, PoolCounters, RequestId, TenantId, TransferId,
};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::oneshot;

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
    /// The pool has no room now (or can never hold the tokens).
    #[error(transparent)]
    Busy(#[from] AllocError),
    /// The pass failed.
    #[error(transparent)]
    Engine(EngineError),
    /// No tokens were given.
    #[error("no tokens")]
    Empty,
}

/// What a prefill-only sequence hands to the transfer layer.
#[derive(Debug)]
pub enum PrefillEvent {
    /// The computed prompt pages, lent in slot order: the sender reads them
    /// in place. They come home when dropped; the pages themselves stay
    /// held until [`EngineCore::release_source`] (and until they are home).
    Pages(Vec<LentPage>),
    /// The prompt is computed: the last position's logits (sent after
    /// [`PrefillEvent::Pages`]).
    Computed {
        /// Logits of the last prompt position.
        logits: Vec<f32>,
    },
    /// Prefill failed; the source pages are already released.
    Failed(EngineError),
}

/// Landing slots granted for a transfer: the generation of each prompt
/// page, in slot order, and the pages' memory, lent to the receiver so it
/// can read the wire straight into them. Physical page ids never leave the
/// engine; the memory comes home when the receiver drops it.
#[derive(Debug)]
pub struct Grant {
    /// Generations of the landing pages, slot by slot.
    pub generations: Vec<Generation>,
    /// The landing pages, slot by slot.
    pub pages: Vec<LentPage>,
}

/// Engine-wide counters beyond the pool's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineStats {
    /// The KV pool's counters.
    pub pool: PoolCounters,
    /// Sequences running (including those waiting for a transfer).
    pub running: usize,
    /// Requests waiting for pages.
    pub waiting: usize,
    /// Failed transfers whose landing pages are held until the sender's
    /// writes are drained (deferred release).
    pub draining_transfers: usize,
    /// Prefilled transfers whose source pages are held until the decode
    /// worker acknowledges.
    pub held_transfers: usize,
}

pub(crate) type Sink = UnboundedSender<SeqEvent>;
pub(crate) type PrefillSink = UnboundedSender<PrefillEvent>;

/// A request waiting for pages (opaque).
#[derive(Debug)]
pub struct PendingRequest {
    request: GenerateRequest,
    sink: Sink,
    landing: Option<(TransferId, oneshot::Sender<Grant>)>,
}

/// A prefill-only job waiting for pages (opaque).
#[derive(Debug)]
pub struct PendingPrefill {
    prompt: Vec<u32>,
    transfer: TransferId,
    events: PrefillSink,
}

#[derive(Debug)]
enum Pending {
    Generate(PendingRequest),
    Prefill(PendingPrefill),
}

#[derive(Debug)]
struct Sequence {
    owner: Owner,
    table: PageTable,
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Positions whose keys and values are in the pages.
    computed: usize,
    done: bool,
    role: Role,
}

#[derive(Debug)]
enum Role {
    /// Computes (or receives) its prompt and generates.
    Generate(Generator),
    /// Computes its prompt for a decode worker and stops.
    Prefill {
        transfer: TransferId,
        events: PrefillSink,
    },
}

#[derive(Debug)]
struct Generator {
    max_tokens: usize,
    ignore_eos: bool,
    sampler: Sampler,
    detok: Detokenizer,
    sink: Sink,
    landing: Option<Landing>,
}

/// A sequence whose prompt pages are arriving from a prefill worker.
#[derive(Debug)]
struct Landing {
    transfer: TransferId,
    /// The client went away: finish as cancelled once the transfer ends
    /// (a disconnect never aborts a transfer mid-flight).
    cancel_after: bool,
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
    /// Which tenant's prefill goes first this step (rotates).
    prefill_turn: usize,
    waiting: VecDeque<Admitted<Pending>>,
    running: Vec<Sequence>,
    /// Landing pages of failed transfers, held until fenced.
    draining: HashMap<TransferId, PageTable>,
    /// Source pages of prefilled transfers, held until acknowledged.
    held: HashMap<TransferId, PageTable>,
    /// Tests only: each committed transfer's tenant and page bytes, when
    /// recording is on.
    #[cfg(feature = "test-hooks")]
    committed: Option<Vec<(TenantId, Vec<Vec<u8>>)>>,
    /// Where lent pages go when dropped (the engine's command channel).
    home: Option<Home>,
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
        let pool = KvPool::new(geometry, pages, config.scrub_on_free);
        let limits = pool.limits(c.context_window);
        Ok(EngineCore {
            rope: Rope::new(c, config.numerics),
            numerics: config.numerics,
            model,
            pool,
            limits,
            // Two at least: a prompt never moves one token at a time.
            step_tokens: config.step_tokens.max(2),
            prefill_turn: 0,
            waiting: VecDeque::new(),
            running: Vec::new(),
            draining: HashMap::new(),
            held: HashMap::new(),
            #[cfg(feature = "test-hooks")]
            committed: None,
            home: None,
            buffers: Buffers::default(),
        })
    }

    /// What one request may hold.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The element type of the pool's pages.
    pub fn kv_dtype(&self) -> KvDtype {
        self.pool.geometry().dtype
    }

    /// Admits a request against this engine's limits (touches no page).
    pub fn admit(
        limits: &Limits,
        tenant: TenantId,
        request: GenerateRequest,
        sink: Sink,
    ) -> Result<Admitted<PendingRequest>, AdmissionError> {
        Self::admit_with(limits, tenant, request, sink, None)
    }

    /// Admits a request; with `landing`, its prompt KV will arrive through
    /// that transfer: once its pages fit, the prompt pages become landing
    /// slots and are lent out on the grant channel.
    pub(crate) fn admit_with(
        limits: &Limits,
        tenant: TenantId,
        request: GenerateRequest,
        sink: Sink,
        landing: Option<(TransferId, oneshot::Sender<Grant>)>,
    ) -> Result<Admitted<PendingRequest>, AdmissionError> {
        let (prompt, max) = (request.prompt.len(), request.sampling.max_tokens);
        let pending = PendingRequest {
            request,
            sink,
            landing,
        };
        limits.admit(tenant, prompt, max, pending)
    }

    /// Admits a prefill-only job: `max_tokens` counts against the limits
    /// (the decode side will hold it) but only the prompt's pages are
    /// reserved here.
    pub fn admit_prefill(
        limits: &Limits,
        tenant: TenantId,
        prompt: Vec<u32>,
        max_tokens: usize,
        transfer: TransferId,
        events: PrefillSink,
    ) -> Result<Admitted<PendingPrefill>, AdmissionError> {
        let n = prompt.len();
        let job = PendingPrefill {
            prompt,
            transfer,
            events,
        };
        Ok(limits.admit(tenant, n, max_tokens, job)?.prompt_only())
    }

    /// Queues an admitted request; it joins the batch when its pages fit.
    pub fn submit(&mut self, admitted: Admitted<PendingRequest>) {
        self.waiting.push_back(admitted.map(Pending::Generate));
    }

    /// Queues an admitted prefill-only job.
    pub fn submit_prefill(&mut self, admitted: Admitted<PendingPrefill>) {
        self.waiting.push_back(admitted.map(Pending::Prefill));
    }

    /// Where lent pages return when their holder drops them.
    pub fn set_home(&mut self, home: Home) {
        self.home = Some(home);
    }

    /// Takes a lent page's memory back.
    pub fn restore(&mut self, page: LentPage) {
        self.pool.restore(page);
    }

    /// Makes a verified transfer's pages readable and samples the first
    /// token from the prefill worker's `logits`. Refused (and the transfer
    /// failed) unless every landing page is back home.
    pub fn commit_transfer(&mut self, transfer: TransferId, logits: &mut [f32]) {
        let Some(i) = self.landing_index(transfer) else {
            // Failed meanwhile (a deadline): the receiver is done with the
            // pages, so no write can arrive; free them.
            if let Some(table) = self.draining.remove(&transfer) {
                self.pool.release_scrubbed(table);
            }
            return;
        };
        let seq = &self.running[i];
        let complete =
            self.pool.landing_home(&seq.table, transfer) && logits.len() == self.model.config.vocab;
        if !complete {
            // The receiver has finished with the pages: fail and free at once.
            self.fence_transfer(transfer, TransferFault::Incomplete);
            return;
        }
        let seq = &mut self.running[i];
        if !self.pool.commit_received(&seq.table, transfer) {
            // A landing page was not written whole: never readable.
            self.fence_transfer(transfer, TransferFault::Incomplete);
            return;
        }
        seq.computed = seq.prompt_len;
        #[cfg(feature = "test-hooks")]
        if let Some(log) = &mut self.committed {
            let pages = (0..seq.table.len())
                .filter_map(|i| self.pool.page_bytes_for_test(&seq.table, i))
                .collect();
            log.push((seq.owner.tenant(), pages));
        }
        let Role::Generate(g) = &mut seq.role else {
            return;
        };
        let cancel = g.landing.take().is_some_and(|l| l.cancel_after);
        if cancel {
            seq.finish(FinishReason::Cancelled);
        } else {
            seq.accept(logits, self.model.tokenizer());
        }
        self.reap();
    }

    /// Fails a transfer's request. Its landing pages stay unreadable and
    /// held until [`EngineCore::fence_transfer`] says no write can arrive.
    pub fn fail_transfer(&mut self, transfer: TransferId, fault: TransferFault) {
        let Some(i) = self.landing_index(transfer) else {
            return;
        };
        let seq = self.running.swap_remove(i);
        if let Role::Generate(g) = &seq.role {
            let _ = g.sink.send(SeqEvent::Failed(EngineError::Transfer(fault)));
        }
        if let Some(old) = self.draining.insert(transfer, seq.table) {
            self.pool.release_scrubbed(old);
        }
    }

    /// Fails a transfer the prefill side refused at its own admission.
    pub fn reject_transfer(&mut self, transfer: TransferId, error: AdmissionError) {
        let Some(i) = self.landing_index(transfer) else {
            if let Some(table) = self.draining.remove(&transfer) {
                self.pool.release_scrubbed(table);
            }
            return;
        };
        let seq = self.running.swap_remove(i);
        if let Role::Generate(g) = &seq.role {
            let _ = g.sink.send(SeqEvent::Failed(EngineError::Rejected(error)));
        }
        // Nothing was sent for a rejected transfer: no write can be in flight.
        self.pool.release_scrubbed(seq.table);
    }

    /// No write for `transfer` can arrive any more (the sender acknowledged
    /// an abort, or its connection is gone): zero and free its landing
    /// pages. A transfer still landing is failed first.
    pub fn fence_transfer(&mut self, transfer: TransferId, fault: TransferFault) {
        self.fail_transfer(transfer, fault);
        if let Some(table) = self.draining.remove(&transfer) {
            self.pool.release_scrubbed(table);
        }
    }

    /// Prefill side: the decode worker acknowledged (or aborted) `transfer`,
    /// so its source pages can go. A prefill still computing stops.
    pub fn release_source(&mut self, transfer: TransferId) {
        if let Some(table) = self.held.remove(&transfer) {
            self.pool.release(table);
            return;
        }
        if let Some(i) = self
            .running
            .iter()
            .position(|s| matches!(&s.role, Role::Prefill { transfer: t, .. } if *t == transfer))
        {
            self.running[i].done = true;
            self.reap();
            return;
        }
        if let Some(i) = self
            .waiting
            .iter()
            .position(|a| matches!(a.payload(), Pending::Prefill(p) if p.transfer == transfer))
        {
            self.waiting.remove(i);
        }
    }

    /// Engine-wide counters.
    pub fn stats(&self) -> EngineStats {
        EngineStats {
            pool: self.pool.counters(),
            running: self.running.len(),
            waiting: self.waiting.len(),
            draining_transfers: self.draining.len(),
            held_transfers: self.held.len(),
        }
    }

    fn landing_index(&self, transfer: TransferId) -> Option<usize> {
        self.running.iter().position(|s| {
            matches!(&s.role, Role::Generate(Generator { landing: Some(l), .. }) if l.transfer == transfer)
        })
    }

    /// Cancels a request: its pages return to the pool at once.
    pub fn cancel(&mut self, id: RequestId) {
        if let Some(i) = self.waiting.iter().position(|a| a.owner().request() == id) {
            if let Some(Pending::Generate(p)) = self.waiting.remove(i).map(Admitted::into_payload) {
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
        if let Some(seq) = self.running.iter_mut().find(|s| s.owner.request() == id) {
            match &mut seq.role {
                // Never abort a transfer mid-flight: cancel once it ends.
                Role::Generate(Generator {
                    landing: Some(l), ..
                }) => l.cancel_after = true,
                _ => seq.finish(FinishReason::Cancelled),
            }
        }
        self.reap();
    }

    /// Nothing waiting and nothing running.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && !self.running.iter().any(Sequence::runnable)
    }

    /// KV pool counters.
    pub fn counters(&self) -> PoolCounters {
        self.pool.counters()
    }

    /// The pool, for inspection in tests.
    #[cfg(feature = "test-hooks")]
    pub fn pool(&self) -> &KvPool {
        &self.pool
    }

    /// Changes the pool's tag checks and scrubbing between runs, so the
    /// overhead benchmark can compare settings on the same memory. Refused
    /// in a build without the `test-hooks` feature (the serving build).
    #[allow(clippy::unused_self, clippy::needless_pass_by_ref_mut)]
    pub fn set_pool_options(
        &mut self,
        owner_checks: bool,
        scrub_on_free: bool,
    ) -> Result<(), crate::hooks::HooksDisabled> {
        #[cfg(feature = "test-hooks")]
        {
            self.pool.set_owner_checks(if owner_checks {
                bulkhead_kv::OwnerChecks::Enforced
            } else {
                bulkhead_kv::OwnerChecks::OffForBenchmark
            });
            self.pool.set_scrub_on_free(scrub_on_free);
            Ok(())
        }
        #[cfg(not(feature = "test-hooks"))]
        {
            let _ = (owner_checks, scrub_on_free);
            Err(crate::hooks::HooksDisabled("turning owner checks off"))
        }
    }

    /// Runs one step. Returns whether any work was done. Call inside the
    /// engine's rayon pool.
    pub fn step(&mut self) -> bool {
        self.join_waiting();
        if !self.running.iter().any(Sequence::runnable) {
            return false;
        }
        // Decode tokens first, then prefill chunks, within the token budget,
        // shared fairly across tenants (`schedule::fair_chunks`).
        let mut budget = self.step_tokens;
        let mut plan: Vec<(usize, usize, usize)> = Vec::new(); // (seq, start, len)
        for (i, s) in self.running.iter().enumerate() {
            if s.runnable() && s.computed >= s.prompt_len && budget > 0 {
                plan.push((i, s.computed, s.tokens.len() - s.computed));
                budget -= 1;
            }
        }
        let prefilling: Vec<usize> = (0..self.running.len())
            .filter(|&i| {
                let s = &self.running[i];
                s.runnable() && s.computed < s.prompt_len
            })
            .collect();
        let work: Vec<PrefillWork> = prefilling
            .iter()
            .map(|&i| {
                let s = &self.running[i];
                PrefillWork {
                    tenant: s.owner.tenant(),
                    request: s.owner.request(),
                    remaining: s.prompt_len - s.computed,
                }
            })
            .collect();
        let chunks = fair_chunks(&work, budget, self.prefill_turn);
        self.prefill_turn = self.prefill_turn.wrapping_add(1);
        for (&i, len) in prefilling.iter().zip(chunks) {
            if len > 0 {
                plan.push((i, self.running[i].computed, len));
            }
        }
        if plan.is_empty() {
            return false;
        }
        let batch: Vec<BatchSeq<'_>> = plan
            .iter()
            .map(|&(i, start, len)| {
                let s = &self.running[i];
                BatchSeq {
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
            self.running[plan[b].0].fail(EngineError::Integrity(violation));
        }
        for &(i, _, len) in &plan {
            self.running[i].computed += len;
            self.running[i].lend_pages(&mut self.pool, self.home.as_ref());
        }
        let tokenizer = model.tokenizer();
        let vocab = model.config.vocab;
        for (b, logits) in out.logits.iter().zip(self.buffers.logits.chunks_mut(vocab)) {
            let seq = &mut self.running[plan[*b].0];
            if !seq.done {
                seq.accept(logits, tokenizer);
            }
        }
        // Prefilled sequences move to `held` until the decode side acks.
        let mut i = 0;
        while i < self.running.len() {
            let s = &self.running[i];
            if !s.done && matches!(s.role, Role::Prefill { .. }) && s.computed == s.prompt_len {
                let seq = self.running.swap_remove(i);
                if let Role::Prefill { transfer, .. } = seq.role
                    && let Some(old) = self.held.insert(transfer, seq.table)
                {
                    self.pool.release(old);
                }
            } else {
                i += 1;
            }
        }
        self.reap();
        true
    }

    /// Runs `tokens` through the model on pages of this pool (admitted,
    /// allocated and released like any request) and returns the logits of
    /// the last position. Used to score text and to test the forward pass.
    pub fn last_logits(
        &mut self,
        tenant: TenantId,
        tokens: &[u32],
    ) -> Result<Vec<f32>, LogitsError> {
        let admitted = self.limits.admit(tenant, tokens.len(), 1, ())?;
        let table = self.pool.allocate(&admitted)?;
        let model = Arc::clone(&self.model);
        let mut start = 0;
        let mut result = Err(LogitsError::Empty);
        while start < tokens.len() {
            let len = (tokens.len() - start).min(self.step_tokens);
            let batch = [BatchSeq {
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

    /// The waiting request to try next: the oldest one of the tenant that
    /// holds the fewest pages now (ties: the one that came first). So a
    /// tenant whose requests fill the pool cannot make another tenant's
    /// request wait behind its own queue; within a tenant, first come,
    /// first served.
    fn next_waiting(&self) -> Option<usize> {
        let mut held: HashMap<TenantId, usize> = HashMap::new();
        let tables = self
            .running
            .iter()
            .map(|s| &s.table)
            .chain(self.held.values())
            .chain(self.draining.values());
        for t in tables {
            *held.entry(t.owner().tenant()).or_default() += t.len();
        }
        let mut seen: Vec<TenantId> = Vec::new();
        let mut best: Option<(usize, usize)> = None; // (pages held, index)
        for (i, a) in self.waiting.iter().enumerate() {
            let tenant = a.owner().tenant();
            if seen.contains(&tenant) {
                continue;
            }
            seen.push(tenant);
            let h = held.get(&tenant).copied().unwrap_or(0);
            if best.is_none_or(|(bh, _)| h < bh) {
                best = Some((h, i));
            }
        }
        best.map(|(_, i)| i)
    }

    fn join_waiting(&mut self) {
        while let Some(next) = self.next_waiting() {
            let front = &self.waiting[next];
            let allocated = match front.payload() {
                Pending::Generate(PendingRequest {
                    landing: Some((transfer, _)),
                    ..
                }) => self.pool.allocate_receiving(front, *transfer),
                _ => self.pool.allocate(front),
            };
            let table = match allocated {
                Ok(table) => table,
                // The tenant's turn: it waits for pages.
                Err(AllocError::Exhausted(_)) => break,
                // Pages were quarantined since admission (or the request was
                // admitted elsewhere): it can never fit here. Refuse it with
                // its 4xx and serve the requests behind it.
                Err(_) => {
                    let refused = self.waiting.remove(next).expect("index exists");
                    let error = AdmissionError::PoolCapacityExceeded {
                        prompt_tokens: refused.prompt_tokens(),
                        max_tokens: refused.max_tokens(),
                        limit: self.pool.capacity_tokens(),
                    };
                    match refused.into_payload() {
                        Pending::Generate(p) => {
                            let _ = p.sink.send(SeqEvent::Failed(EngineError::Rejected(error)));
                        }
                        Pending::Prefill(p) => {
                            let _ = p
                                .events
                                .send(PrefillEvent::Failed(EngineError::Rejected(error)));
                        }
                    }
                    continue;
                }
            };
            let admitted = self.waiting.remove(next).expect("index exists");
            let owner = admitted.owner();
            let max_tokens = admitted.max_tokens();
            let prompt_pages = admitted.prompt_pages();
            let seq = match admitted.into_payload() {
                Pending::Prefill(p) => Sequence {
                    owner,
                    table,
                    prompt_len: p.prompt.len(),
                    tokens: p.prompt,
                    computed: 0,
                    done: false,
                    role: Role::Prefill {
                        transfer: p.transfer,
                        events: p.events,
                    },
                },
                Pending::Generate(PendingRequest {
                    request,
                    sink,
                    landing,
                }) => {
                    let landing = match landing {
                        None => None,
                        Some((transfer, granted)) => {
                            let generations = table.generations().take(prompt_pages).collect();
                            let pages =
                                self.pool.lend_landing(&table, transfer, self.home.as_ref());
                            if let Err(grant) = granted.send(Grant { generations, pages }) {
                                // The caller is gone before anything was sent.
                                self.pool.release(table);
                                for p in grant.pages {
                                    self.pool.restore(p);
                                }
                                continue;
                            }
                            Some(Landing {
                                transfer,
                                cancel_after: false,
                            })
                        }
                    };
                    let prompt_len = request.prompt.len();
                    let mut tokens = request.prompt;
                    tokens.reserve(max_tokens);
                    Sequence {
                        owner,
                        table,
                        tokens,
                        prompt_len,
                        computed: 0,
                        done: false,
                        role: Role::Generate(Generator {
                            max_tokens,
                            ignore_eos: request.ignore_eos,
                            sampler: Sampler::new(request.sampling),
                            detok: Detokenizer::new(request.stop),
                            sink,
                            landing,
                        }),
                    }
                }
            };
            self.running.push(seq);
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
    #[cfg(feature = "test-hooks")]
    pub fn redirect_page_for_fault_injection(
        &mut self,
        victim: RequestId,
        index: usize,
        source: RequestId,
        source_index: usize,
    ) -> bool {
        let Some(si) = self
            .running
            .iter()
            .position(|s| s.owner.request() == source)
        else {
            return false;
        };
        let Some(vi) = self
            .running
            .iter()
            .position(|s| s.owner.request() == victim)
        else {
            return false;
        };
        if si == vi {
            return false;
        }
        // Two disjoint borrows of `running`.
        let (lo, hi) = self.running.split_at_mut(si.max(vi));
        let (victim, source) = if vi < si {
            (&mut lo[vi], &hi[0])
        } else {
            (&mut hi[0], &lo[si])
        };
        victim
            .table
            .redirect_for_fault_injection(index, &source.table, source_index);
        true
    }

    /// Tests only: from now on, keep the bytes of every committed
    /// transfer's pages (as they are when committed); returns and clears
    /// what was kept so far.
    #[cfg(feature = "test-hooks")]
    pub fn take_committed_for_test(&mut self) -> Vec<(TenantId, Vec<Vec<u8>>)> {
        self.committed.replace(Vec::new()).unwrap_or_default()
    }

    /// Physical pages a running request holds (for tests).
    #[cfg(feature = "test-hooks")]
    pub fn pages_of(&self, id: RequestId) -> Option<Vec<bulkhead_kv::PageId>> {
        self.running
            .iter()
            .find(|s| s.owner.request() == id)
            .map(|s| s.table.page_ids())
    }
}

impl Sequence {
    /// Whether the next step may compute for it (not waiting for a transfer).
    fn runnable(&self) -> bool {
        !matches!(
            self.role,
            Role::Generate(Generator {
                landing: Some(_),
                ..
            })
        )
    }

    fn finish(&mut self, reason: FinishReason) {
        if let Role::Generate(g) = &mut self.role {
            let text = g.detok.finish();
            let usage = Usage {
                prompt_tokens: self.prompt_len,
                completion_tokens: self.tokens.len() - self.prompt_len,
            };
            let _ = g.sink.send(SeqEvent::Finished {
                reason,
                text,
                usage,
            });
        }
        self.done = true;
    }

    fn fail(&mut self, error: EngineError) {
        match &self.role {
            Role::Generate(g) => {
                let _ = g.sink.send(SeqEvent::Failed(error));
            }
            Role::Prefill { events, .. } => {
                let _ = events.send(PrefillEvent::Failed(error));
            }
        }
        self.done = true;
    }

    /// Prefill role, once the whole prompt is computed: lends every prompt
    /// page to the sender, in slot order (the logits follow).
    fn lend_pages(&mut self, pool: &mut KvPool, home: Option<&Home>) {
        if self.done || self.computed < self.prompt_len {
            return;
        }
        let Role::Prefill { events, .. } = &self.role else {
            return;
        };
        let mut pages = Vec::with_capacity(self.table.len());
        for slot in 0..self.table.len() {
            match pool.lend_source(&self.table, slot, home.cloned()) {
                Ok(p) => pages.push(p),
                Err(v) => {
                    for p in pages {
                        pool.restore(p);
                    }
                    let _ = events.send(PrefillEvent::Failed(EngineError::Integrity(v)));
                    self.done = true;
                    return;
                }
            }
        }
        if let Err(e) = events.send(PrefillEvent::Pages(pages)) {
            // The connection is gone: take the memory back, free the pages.
            if let PrefillEvent::Pages(pages) = e.0 {
                for p in pages {
                    pool.restore(p);
                }
            }
            self.done = true;
        }
    }

    /// Samples the next token from `logits` and emits its events (prefill
    /// role: hands the logits over instead).
    fn accept(&mut self, logits: &mut [f32], tokenizer: &crate::Tokenizer) {
        let g = match &mut self.role {
            Role::Generate(g) => g,
            Role::Prefill { events, .. } => {
                let computed = PrefillEvent::Computed {
                    logits: logits.to_vec(),
                };
                if events.send(computed).is_err() {
                    self.done = true;
                }
                return;
            }
        };
        let id = g.sampler.sample(logits, &self.tokens);
        if id == tokenizer.eos() && !g.ignore_eos {
            self.finish(FinishReason::Stop);
            return;
        }
        self.tokens.push(id);
        let (text, stopped) = match g.detok.push(tokenizer, id) {
            Piece::Text(t) => (t, false),
            Piece::Stopped(t) => (t, true),
        };
        if g.sink.send(SeqEvent::Token { id, text }).is_err() {
            // The consumer is gone: stop and free the pages.
            self.done = true;
            return;
        }
        let max_tokens = g.max_tokens;
        if stopped {
            self.finish(FinishReason::Stop);
        } else if self.tokens.len() - self.prompt_len >= max_tokens {
            self.finish(FinishReason::Length);
        }
    }
}
