//! The synchronous engine: admitted requests, running sequences, one KV pool,
//! and `step()`, one forward pass over a mixed batch.
//!
//! Continuous batching: between steps, waiting requests join the running
//! batch as soon as the pool can hold their prompt and a first slice of
//! output, taking turns by tenant (the tenant holding the fewest pages
//! first); each step takes one token from every decoding sequence and
//! fills the rest of a time budget with prefill chunks shared fairly
//! across tenants. A sequence takes pages as it grows; when none is free,
//! or its tenant holds more than its share while another waits, a sequence
//! of the tenant holding the most is preempted: its pages go back and it
//! waits to recompute what it had and go on. Finished, failed and
//! cancelled sequences return their pages at once.
//!
//! The step budget is about `step_time` of compute (200 ms, `--step-ms`) at the
//! speed measured at start ([`crate::PrefillSpeed`]), and at most
//! `step_tokens`; decode never takes more than half of it from prompts, so a
//! request waits at most about one step for its turn, whatever others queued.
//! The first slice is `first_slice_tokens` (64) of output; the table then grows
//! a page at a time ([`bulkhead_kv::KvPool::grow`]), never past what admission
//! allowed. While another tenant waits, no tenant grows past
//! `tenant_share_percent` of the pool (half, `--tenant-share-percent`): its
//! youngest sequence is preempted instead; a tenant below its fair share (the
//! pool over the active tenants) that cannot join takes pages back from tenants
//! above theirs.
//!
//! A preempted sequence's pages go back to the pool
//! ([`bulkhead_kv::KvPool::release_pages`]) and it waits, first among its
//! tenant's, to recompute its prompt in chunks and replay the tokens it had
//! generated one a step, as they were first computed: its pages then hold the
//! same values and it goes on with exactly the tokens it would have produced.
//! It never emits a token twice, never returns partial output as complete, and
//! fails (4xx) only if pages were quarantined so that it can never fit. Prefill
//! jobs (prompt pages only) and sequences landing a transfer are never
//! preempted.
//!
//! A sequence's `Role` is `Generate` (optionally landing a transfer: not
//! scheduled until committed) or `Prefill` (computes its prompt, lends the
//! pages, hands over the last logits, and is held until released). Tables of
//! failed transfers wait in `draining` until fenced; prefilled ones in `held`
//! until released.

use crate::GenerateRequest;
use crate::detok::{Detokenizer, Piece};
use crate::engine::EngineConfig;
use crate::error::{ConfigError, EngineError, TransferFault};
use crate::forward::{BatchSeq, Buffers, Numerics, Rope, forward};
use crate::gguf::ModelFile;
use crate::sampling::Sampler;
use crate::schedule::{PrefillWork, fair_chunks};
use crate::speed::{PrefillSpeed, UNIT};
use bulkhead_kv::{
    AdmissionError, Admitted, AllocError, CacheScope, Generation, Home, KvDtype, KvGeometry,
    KvPool, LentPage, Limits, Owner, PageTable, PoolCounters, RequestId, TenantId, TransferId,
};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
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
        /// Its log-probabilities, when the request asked for them.
        logprobs: Option<Box<crate::sampling::Logprobs>>,
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
    /// Part of the prompt is computed (sent after every step that moved it
    /// on, so the decode side knows the transfer is alive).
    Progress {
        /// Prompt tokens computed so far.
        computed: usize,
    },
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
    /// Sequences preempted so far (pages taken back; each resumed later).
    pub preemptions: u64,
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
    cache: Option<CacheScope>,
}

#[derive(Debug)]
enum Pending {
    Generate(PendingRequest),
    Prefill(PendingPrefill),
}

/// An entry of the wait queue.
#[derive(Debug)]
enum Waiting {
    /// Admitted, never run.
    New(Box<Admitted<Pending>>),
    /// Preempted: its pages went back to the pool; it recomputes what it
    /// had (prompt and generated tokens) and goes on where it stopped.
    Resume(Box<Sequence>),
}

impl Waiting {
    fn owner(&self) -> Owner {
        match self {
            Waiting::New(a) => a.owner(),
            Waiting::Resume(s) => s.owner,
        }
    }
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
    /// It ended in an error: none of its pages are published.
    failed: bool,
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
    sampler: Box<Sampler>,
    detok: Detokenizer,
    sink: Sink,
    landing: Option<Landing>,
    /// Tests only: answer wrong (the runner-up of every choice).
    corrupt: bool,
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
    step_time: Duration,
    speed: PrefillSpeed,
    prefill_deadline: Duration,
    first_slice: usize,
    tenant_share_percent: usize,
    prefix_cache: bool,
    preemptions: u64,
    /// Compute each tenant got lately (step units, decayed every step).
    served: HashMap<TenantId, usize>,
    /// Which tenant's prefill goes first this step (rotates).
    prefill_turn: usize,
    waiting: VecDeque<Waiting>,
    running: Vec<Sequence>,
    /// Landing pages of failed transfers, held until fenced.
    draining: HashMap<TransferId, PageTable>,
    /// Source pages of prefilled transfers and their prompts, held until
    /// acknowledged.
    held: HashMap<TransferId, (PageTable, Vec<u32>)>,
    /// Tests only: each committed transfer's tenant and page bytes, when
    /// recording is on.
    #[cfg(feature = "test-hooks")]
    committed: Option<Vec<(TenantId, Vec<Vec<u8>>)>>,
    /// Where lent pages go when dropped (the engine's command channel).
    home: Option<Home>,
    buffers: Buffers,
    /// Tests only: requests started so far, and after how many answers
    /// go wrong ([`EngineConfig::corrupt_answers_after`]).
    started: u64,
    corrupt_after: Option<u64>,
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
        if config.corrupt_answers_after.is_some() && !crate::hooks::ENABLED {
            return Err(crate::hooks::HooksDisabled("corrupting answers").into());
        }
        let pool = KvPool::new(geometry, pages, config.scrub_on_free);
        let speed = PrefillSpeed::nominal(c);
        let limits = pool
            .limits(c.context_window)
            .with_prefill_limit(speed.max_prompt_within(config.prefill_deadline));
        Ok(EngineCore {
            rope: Rope::new(c, config.numerics),
            numerics: config.numerics,
            model,
            pool,
            limits,
            // Two at least: a prompt never moves one token at a time.
            step_tokens: config.step_tokens.max(2),
            step_time: config.step_time,
            speed,
            prefill_deadline: config.prefill_deadline,
            first_slice: config.first_slice_tokens.max(1),
            tenant_share_percent: config.tenant_share_percent.clamp(1, 100),
            prefix_cache: config.prefix_cache,
            preemptions: 0,
            served: HashMap::new(),
            prefill_turn: 0,
            waiting: VecDeque::new(),
            running: Vec::new(),
            draining: HashMap::new(),
            held: HashMap::new(),
            #[cfg(feature = "test-hooks")]
            committed: None,
            home: None,
            buffers: Buffers::default(),
            started: 0,
            corrupt_after: config.corrupt_answers_after,
        })
    }

    /// What one request may hold.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The prefill speed (nominal until [`EngineCore::calibrate`]).
    pub fn speed(&self) -> PrefillSpeed {
        self.speed
    }

    /// Measures this machine's prefill speed and sets the prompt limit
    /// from it: the longest prompt prefilled alone within the deadline.
    /// Attention is timed at depth on synthetic pages
    /// ([`crate::speed::measure_pair_secs`]); the matrices by two short
    /// passes on a scratch pool of the engine's own (the serving pool is
    /// never touched; the faster pass counts), less their attention. Call
    /// inside the engine's rayon pool, before anything is admitted.
    pub fn calibrate(&mut self) {
        const TOKENS: usize = 32;
        let geometry = self.pool.geometry();
        let secs_per_pair = crate::speed::measure_pair_secs(
            &self.model.config,
            geometry.dtype,
            geometry.page_size,
            (4 * crate::forward::TILE_ROWS, crate::forward::TILE_ROWS),
            // A few milliseconds each: the best of several rides out a
            // moment of contention on a shared machine.
            7,
        );
        let vocab = u32::try_from(self.model.config.vocab).unwrap_or(u32::MAX);
        let tokens: Vec<u32> = (0..TOKENS as u32)
            .map(|i| (i * 7_919 + 13) % vocab)
            .collect();
        let mut scratch = KvPool::new(geometry, TOKENS.div_ceil(geometry.page_size), false);
        let Ok(admitted) = scratch
            .limits(TOKENS)
            .admit(TenantId::new(0), TOKENS - 1, 1, ())
        else {
            return;
        };
        let Ok(table) = scratch.allocate(&admitted) else {
            return;
        };
        let model = Arc::clone(&self.model);
        let mut best = f64::INFINITY;
        for _ in 0..2 {
            let t = Instant::now();
            let batch = [BatchSeq {
                table: &table,
                start: 0,
                tokens: &tokens[..TOKENS - 1],
                want_logits: true,
            }];
            let out = forward(
                &model,
                &self.rope,
                self.numerics,
                &mut scratch,
                &batch,
                &mut self.buffers,
            );
            if !out.violations.is_empty() {
                return; // cannot happen on a private pool; keep the nominal figure
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        #[allow(clippy::cast_precision_loss)]
        let (n, pairs) = (
            (TOKENS - 1) as f64,
            ((TOKENS - 1) * (TOKENS - 2) / 2) as f64,
        );
        // Never less than a tenth of the pass: the pair cost is an estimate.
        let secs_per_token = ((best - pairs * secs_per_pair) / n).max(best / n / 10.0);
        self.speed = PrefillSpeed::measured(secs_per_token, secs_per_pair);
        self.limits = self
            .pool
            .limits(self.model.config.context_window)
            .with_prefill_limit(self.speed.max_prompt_within(self.prefill_deadline));
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
        cache: Option<CacheScope>,
    ) -> Result<Admitted<PendingPrefill>, AdmissionError> {
        let n = prompt.len();
        let job = PendingPrefill {
            prompt,
            transfer,
            events,
            cache,
        };
        Ok(limits.admit(tenant, n, max_tokens, job)?.prompt_only())
    }

    /// Queues an admitted request; it joins the batch when its prompt and
    /// first slice of output fit.
    pub fn submit(&mut self, admitted: Admitted<PendingRequest>) {
        let admitted = admitted.first_slice(self.first_slice);
        self.waiting
            .push_back(Waiting::New(Box::new(admitted.map(Pending::Generate))));
    }

    /// Queues an admitted prefill-only job.
    pub fn submit_prefill(&mut self, admitted: Admitted<PendingPrefill>) {
        self.waiting
            .push_back(Waiting::New(Box::new(admitted.map(Pending::Prefill))));
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
        if let Some((table, prompt)) = self.held.remove(&transfer) {
            // The decode side has it all: the pages (home again) may serve
            // the next prompt of the same namespace.
            self.pool.publish_prefix(&table, &prompt, prompt.len());
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
        if let Some(i) = self.waiting.iter().position(|w| {
            matches!(w, Waiting::New(a) if matches!(a.payload(), Pending::Prefill(p) if p.transfer == transfer))
        }) {
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
            preemptions: self.preemptions,
        }
    }

    fn landing_index(&self, transfer: TransferId) -> Option<usize> {
        self.running.iter().position(|s| {
            matches!(&s.role, Role::Generate(Generator { landing: Some(l), .. }) if l.transfer == transfer)
        })
    }

    /// Cancels a request: its pages return to the pool at once.
    pub fn cancel(&mut self, id: RequestId) {
        if let Some(i) = self.waiting.iter().position(|w| w.owner().request() == id) {
            match self.waiting.remove(i) {
                Some(Waiting::New(a)) => {
                    if let Pending::Generate(p) = a.into_payload() {
                        let _ = p.sink.send(SeqEvent::Finished {
                            reason: FinishReason::Cancelled,
                            text: String::new(),
                            usage: Usage {
                                prompt_tokens: p.request.prompt.len(),
                                completion_tokens: 0,
                            },
                        });
                    }
                }
                Some(Waiting::Resume(mut seq)) => {
                    seq.finish(FinishReason::Cancelled);
                    self.pool.release(seq.table);
                }
                None => {}
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
        let stalled = self.grow_decoding();
        if !self.running.iter().any(Sequence::runnable) {
            return false;
        }
        let plan = self.plan(&stalled);
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

        self.apply(&plan, out);
        self.reap();
        true
    }

    /// This step's work: decode tokens first, then prefill chunks, within a
    /// budget of about `step_time` of compute at the measured speed, shared
    /// fairly across tenants by cost (`schedule::fair_chunks`). Each entry
    /// is (sequence, start, length).
    fn plan(&mut self, stalled: &[RequestId]) -> Vec<(usize, usize, usize)> {
        let ps = self.pool.geometry().page_size;
        let budget = self
            .speed
            .units_in(self.step_time)
            .clamp(2 * UNIT as usize, self.step_tokens * UNIT as usize);
        let mut decode_units = 0;
        let mut plan: Vec<(usize, usize, usize)> = Vec::new(); // (seq, start, len)
        for (i, s) in self.running.iter().enumerate() {
            if s.runnable()
                && s.decoding()
                && plan.len() < self.step_tokens
                && s.table.len() * ps >= s.tokens.len()
                && !stalled.contains(&s.owner.request())
            {
                plan.push((i, s.computed, 1));
                decode_units += self.speed.unit_at(s.computed);
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
                    unit: self.speed.unit_at(s.computed),
                }
            })
            .collect();
        // Decode never takes more than half the step from prompts, and every
        // prompt can always move by two tokens.
        let deepest = work.iter().map(|w| w.unit).max().unwrap_or(0);
        let prefill_budget = budget
            .saturating_sub(decode_units)
            .max(budget / 2)
            .max(2 * deepest);
        // The tenant with prompt work that was served least lately.
        let least = work
            .iter()
            .map(|w| w.tenant)
            .min_by_key(|t| self.served.get(t).copied().unwrap_or(0));
        let chunks = fair_chunks(
            &work,
            prefill_budget,
            self.step_tokens.saturating_sub(plan.len()),
            self.prefill_turn,
            least,
        );
        for v in self.served.values_mut() {
            *v -= *v / 8;
        }
        self.served.retain(|_, v| *v > 0);
        for (w, len) in work.iter().zip(&chunks) {
            *self.served.entry(w.tenant).or_default() += len * w.unit;
        }
        self.prefill_turn = self.prefill_turn.wrapping_add(1);
        for (&i, len) in prefilling.iter().zip(chunks) {
            if len > 0 {
                plan.push((i, self.running[i].computed, len));
            }
        }
        plan
    }

    /// What a forward pass of `plan` gave: violations quarantined and
    /// failed, progress counted and pages lent, tokens sampled, prefilled
    /// sequences held for their decode side.
    fn apply(&mut self, plan: &[(usize, usize, usize)], out: crate::forward::ForwardOutput) {
        for (b, violation) in out.violations {
            self.pool.quarantine(&violation);
            self.running[plan[b].0].fail(EngineError::Integrity(violation));
        }
        for &(i, _, len) in plan {
            let seq = &mut self.running[i];
            seq.computed += len;
            if let Role::Prefill { events, .. } = &seq.role
                && !seq.done
                && seq.computed < seq.prompt_len
            {
                let _ = events.send(PrefillEvent::Progress {
                    computed: seq.computed,
                });
            }
            seq.lend_pages(&mut self.pool, self.home.as_ref());
        }
        let tokenizer = self.model.tokenizer();
        let vocab = self.model.config.vocab;
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
                    && let Some((old, _)) = self.held.insert(transfer, (seq.table, seq.tokens))
                {
                    self.pool.release(old);
                }
            } else {
                i += 1;
            }
        }
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

    /// Pages held now per tenant: running, held for a transfer and draining.
    fn held_pages(&self) -> HashMap<TenantId, usize> {
        let mut held: HashMap<TenantId, usize> = HashMap::new();
        let tables = self
            .running
            .iter()
            .map(|s| &s.table)
            .chain(self.held.values().map(|(t, _)| t))
            .chain(self.draining.values());
        for t in tables {
            *held.entry(t.owner().tenant()).or_default() += t.len();
        }
        held
    }

    /// Pages one tenant may hold while another tenant waits.
    fn tenant_cap(&self) -> usize {
        (self.pool.counters().total_pages * self.tenant_share_percent / 100).max(1)
    }

    /// Pages one of `tenants` active tenants is due: an equal part of the pool.
    fn fair_share(&self, tenants: usize) -> usize {
        self.pool.counters().total_pages / tenants.max(1)
    }

    /// Tenants with a sequence running or waiting.
    fn active_tenants(&self) -> usize {
        let mut t: Vec<TenantId> = self
            .running
            .iter()
            .map(|s| s.owner.tenant())
            .chain(self.waiting.iter().map(|w| w.owner().tenant()))
            .collect();
        t.sort_unstable();
        t.dedup();
        t.len()
    }

    /// The waiting request to try next: the oldest one of the tenant that
    /// holds the fewest pages now (ties: the one that came first). So a
    /// tenant whose requests fill the pool cannot make another tenant's
    /// request wait behind its own queue; within a tenant, oldest first (a
    /// preempted sequence before the requests that came after it).
    /// A tenant over its cap while another waits is passed over.
    fn next_waiting(&self, held: &HashMap<TenantId, usize>) -> Option<usize> {
        let cap = self.tenant_cap();
        // Another tenant waits for every waiting tenant once two do.
        let first_tenant = self.waiting.front().map(|w| w.owner().tenant());
        let others_wait = self
            .waiting
            .iter()
            .any(|w| Some(w.owner().tenant()) != first_tenant);
        let mut best: Option<(usize, RequestId, usize)> = None; // (pages held, request, index)
        for (i, w) in self.waiting.iter().enumerate() {
            let owner = w.owner();
            let h = held.get(&owner.tenant()).copied().unwrap_or(0);
            if others_wait && h > 0 && h + self.pages_to_join(w) > cap {
                continue;
            }
            if best.is_none_or(|(bh, br, _)| (h, owner.request()) < (bh, br)) {
                best = Some((h, owner.request(), i));
            }
        }
        best.map(|(_, _, i)| i)
    }

    /// Pages a waiting entry takes when it joins.
    fn pages_to_join(&self, w: &Waiting) -> usize {
        match w {
            Waiting::New(a) => a.reserve(),
            Waiting::Resume(s) => {
                s.pages_to_resume(self.first_slice, self.pool.geometry().page_size)
            }
        }
    }

    fn join_waiting(&mut self) {
        loop {
            let held = self.held_pages();
            let Some(next) = self.next_waiting(&held) else {
                return;
            };
            let tenant = self.waiting[next].owner().tenant();
            let need = self.pages_to_join(&self.waiting[next]);
            let mine = held.get(&tenant).copied().unwrap_or(0);
            if self.pool.free_pages() < need {
                // Below its fair share: take pages back from tenants above
                // theirs, the tenant holding the most first.
                let fair = self.fair_share(self.active_tenants());
                if mine + need <= fair.max(need) {
                    while self.pool.free_pages() < need {
                        if !self.preempt_one(|t, h| t != tenant && h > fair) {
                            break;
                        }
                    }
                }
            }
            let entry = self.waiting.remove(next).expect("index exists");
            match entry {
                Waiting::Resume(mut seq) => {
                    let want =
                        seq.pages_to_resume(self.first_slice, self.pool.geometry().page_size);
                    match self.pool.grow(&mut seq.table, want) {
                        Ok(()) => self.running.push(*seq),
                        Err(AllocError::Exhausted(_)) => {
                            self.waiting.insert(next, Waiting::Resume(seq));
                            return;
                        }
                        Err(_) => {
                            // Pages were quarantined since: it can never fit.
                            let error = seq.never_fits(self.pool.capacity_tokens());
                            seq.fail(error);
                            self.pool.release(seq.table);
                        }
                    }
                }
                Waiting::New(admitted) => {
                    if let Some(back) = self.join_new(*admitted) {
                        self.waiting.insert(next, Waiting::New(Box::new(back)));
                        return;
                    }
                }
            }
        }
    }

    /// Allocates an admitted request's first pages and starts it (or
    /// refuses it for good); gives it back when too few pages are free now.
    fn join_new(&mut self, admitted: Admitted<Pending>) -> Option<Admitted<Pending>> {
        let allocated = self.allocate_for(&admitted);
        let (table, cached) = match allocated {
            Ok(found) => found,
            // The tenant's turn: it waits for pages.
            Err(AllocError::Exhausted(_)) => return Some(admitted),
            // Pages were quarantined since admission (or the request was
            // admitted elsewhere): it can never fit here. Refuse it with
            // its 4xx and serve the requests behind it.
            Err(_) => {
                self.refuse_unfit(admitted);
                return None;
            }
        };
        let owner = admitted.owner();
        let max_tokens = admitted.max_tokens();
        let prompt_pages = admitted.prompt_pages();
        let seq = match admitted.into_payload() {
            Pending::Prefill(p) => Sequence {
                owner,
                table,
                prompt_len: p.prompt.len(),
                tokens: p.prompt,
                computed: cached,
                done: false,
                failed: false,
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
                        let pages = self.pool.lend_landing(&table, transfer, self.home.as_ref());
                        if let Err(grant) = granted.send(Grant { generations, pages }) {
                            // The caller is gone before anything was sent.
                            self.pool.release(table);
                            for p in grant.pages {
                                self.pool.restore(p);
                            }
                            return None;
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
                    computed: cached,
                    done: false,
                    failed: false,
                    role: Role::Generate(Generator {
                        max_tokens,
                        ignore_eos: request.ignore_eos,
                        sampler: Box::new(Sampler::new(request.sampling)),
                        detok: Detokenizer::new(request.stop),
                        sink,
                        landing,
                        corrupt: {
                            self.started += 1;
                            self.corrupt_after.is_some_and(|n| self.started > n)
                        },
                    }),
                }
            }
        };
        self.running.push(seq);
        None
    }

    /// Pages for an admitted request: a landing table for a transfer, a
    /// prefixed one where the cache holds part of the prompt, else fresh
    /// ones; with the prompt tokens already computed.
    fn allocate_for(
        &mut self,
        admitted: &Admitted<Pending>,
    ) -> Result<(PageTable, usize), AllocError> {
        match admitted.payload() {
            Pending::Generate(PendingRequest {
                landing: Some((transfer, _)),
                ..
            }) => self
                .pool
                .allocate_receiving(admitted, *transfer)
                .map(|t| (t, 0)),
            // Prefix reuse: only a sequence that computes its own prompt
            // here (a landing or prefill table's pages are lent whole).
            Pending::Generate(PendingRequest {
                request:
                    GenerateRequest {
                        cache: Some(scope),
                        prompt,
                        ..
                    },
                landing: None,
                ..
            }) if self.prefix_cache => self
                .pool
                .allocate_prefixed(admitted, *scope, prompt)
                .map(|(t, hit)| (t, hit.tokens)),
            // A prefill worker lends its pages whole: the cached part of
            // the prompt is copied into pages of its own, not computed.
            Pending::Prefill(PendingPrefill {
                cache: Some(scope),
                prompt,
                ..
            }) if self.prefix_cache => self
                .pool
                .allocate_prefixed_copy(admitted, *scope, prompt)
                .map(|(t, hit)| (t, hit.tokens)),
            _ => self.pool.allocate(admitted).map(|t| (t, 0)),
        }
    }

    /// An admitted request that can never fit here (pages were quarantined
    /// since admission, or it was admitted elsewhere): refused with its 4xx,
    /// so the requests behind it are served.
    fn refuse_unfit(&self, admitted: Admitted<Pending>) {
        let error = AdmissionError::PoolCapacityExceeded {
            prompt_tokens: admitted.prompt_tokens(),
            max_tokens: admitted.max_tokens(),
            limit: self.pool.capacity_tokens(),
        };
        match admitted.into_payload() {
            Pending::Generate(p) => {
                let _ = p.sink.send(SeqEvent::Failed(EngineError::Rejected(error)));
            }
            Pending::Prefill(p) => {
                let _ = p
                    .events
                    .send(PrefillEvent::Failed(EngineError::Rejected(error)));
            }
        }
    }

    /// Gives every decoding sequence the page its next token needs. When
    /// none is free, or its tenant holds more than its cap while another
    /// tenant waits, a sequence is preempted: of the tenant holding the
    /// most pages (of this tenant, in the second case), its youngest. Returns
    /// the requests that found no page this step (nothing preemptable).
    fn grow_decoding(&mut self) -> Vec<RequestId> {
        let ps = self.pool.geometry().page_size;
        let mut stalled = Vec::new();
        loop {
            let Some(i) = self.running.iter().position(|s| {
                s.runnable()
                    && s.decoding()
                    && s.table.len() * ps < s.tokens.len()
                    && !stalled.contains(&s.owner.request())
            }) else {
                return stalled;
            };
            let owner = self.running[i].owner;
            let tenant = owner.tenant();
            let need = self.running[i].tokens.len().div_ceil(ps);
            let held = self.held_pages();
            let others_wait = self.waiting.iter().any(|w| w.owner().tenant() != tenant);
            if others_wait && held.get(&tenant).copied().unwrap_or(0) >= self.tenant_cap() {
                // Over its cap while another tenant waits: it gives back
                // instead of taking (its youngest, possibly this one).
                if self.preempt_one(|t, _| t == tenant) {
                    continue;
                }
            }
            let grown = self.pool.grow(&mut self.running[i].table, need);
            match grown {
                Ok(()) => {}
                Err(AllocError::Exhausted(_)) => {
                    if !self.preempt_one(|_, _| true) {
                        stalled.push(owner.request());
                    }
                }
                Err(_) => {
                    let limit = self.pool.capacity_tokens();
                    let seq = &mut self.running[i];
                    let error = seq.never_fits(limit);
                    seq.fail(error);
                    self.reap();
                }
            }
        }
    }

    /// Preempts the youngest preemptable sequence of the tenant holding the
    /// most pages among those `eligible(tenant, pages held)` accepts; its
    /// pages go back to the pool and it waits to resume. `false` if there
    /// is none.
    fn preempt_one(&mut self, eligible: impl Fn(TenantId, usize) -> bool) -> bool {
        let held = self.held_pages();
        let victim = self
            .running
            .iter()
            .enumerate()
            .filter(|(_, s)| s.preemptable())
            .filter(|(_, s)| {
                let t = s.owner.tenant();
                eligible(t, held.get(&t).copied().unwrap_or(0))
            })
            .max_by_key(|(_, s)| {
                let t = s.owner.tenant();
                (held.get(&t).copied().unwrap_or(0), s.owner.request())
            })
            .map(|(i, _)| i);
        let Some(i) = victim else {
            return false;
        };
        let mut seq = self.running.swap_remove(i);
        self.pool.release_pages(&mut seq.table);
        seq.computed = 0;
        self.preemptions += 1;
        self.waiting.push_back(Waiting::Resume(Box::new(seq)));
        true
    }

    /// Removes finished sequences and returns their pages.
    fn reap(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].done {
                let seq = self.running.swap_remove(i);
                if !seq.failed {
                    // Only a table allocated with a cache scope publishes.
                    self.pool
                        .publish_prefix(&seq.table, &seq.tokens, seq.computed);
                }
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
        let at = |r: RequestId| self.running.iter().position(|s| s.owner.request() == r);
        let (Some(si), Some(vi)) = (at(source), at(victim)) else {
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
    /// Whether its next token is computed alone, as a decode step: its
    /// prompt is in the pages. A resumed sequence replays the tokens it had
    /// generated this way, one a step, so its pages hold exactly what they
    /// held before it was preempted and it goes on with the same tokens.
    fn decoding(&self) -> bool {
        self.computed >= self.prompt_len && self.computed < self.tokens.len()
    }

    /// Whether it may be preempted: a generating sequence not landing a
    /// transfer (a prefill job holds only its prompt and hands it over).
    fn preemptable(&self) -> bool {
        !self.done && matches!(self.role, Role::Generate(Generator { landing: None, .. }))
    }

    /// Pages a preempted sequence takes to resume: what it had and a first
    /// slice of what it may still generate.
    fn pages_to_resume(&self, slice: usize, page_size: usize) -> usize {
        let left = match &self.role {
            Role::Generate(g) => g
                .max_tokens
                .saturating_sub(self.tokens.len() - self.prompt_len),
            Role::Prefill { .. } => 0,
        };
        (self.tokens.len() + slice.min(left)).div_ceil(page_size)
    }

    /// The refusal of a sequence that can no longer fit a pool of `limit` tokens.
    fn never_fits(&self, limit: usize) -> EngineError {
        let max_tokens = match &self.role {
            Role::Generate(g) => g.max_tokens,
            Role::Prefill { .. } => 0,
        };
        EngineError::Rejected(AdmissionError::PoolCapacityExceeded {
            prompt_tokens: self.prompt_len,
            max_tokens,
            limit,
        })
    }

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
        self.failed = true;
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
        if g.corrupt {
            // Tests only: hide the best choice, so greedy takes the next.
            if let Some(best) = logits
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(i, _)| i)
            {
                logits[best] = f32::NEG_INFINITY;
            }
        }
        let pick = g.sampler.pick(logits, &self.tokens, tokenizer);
        let id = pick.id;
        if id == tokenizer.eos() && !g.ignore_eos {
            self.finish(FinishReason::Stop);
            return;
        }
        self.tokens.push(id);
        let (text, stopped) = match g.detok.push(tokenizer, id) {
            Piece::Text(t) => (t, false),
            Piece::Stopped(t) => (t, true),
        };
        let logprobs = pick.logprobs.map(Box::new);
        if g.sink.send(SeqEvent::Token { id, text, logprobs }).is_err() {
            // The consumer is gone: stop and free the pages.
            self.done = true;
            return;
        }
        let max_tokens = g.max_tokens;
        if stopped || g.sampler.grammar_done() {
            self.finish(FinishReason::Stop);
        } else if self.tokens.len() - self.prompt_len >= max_tokens {
            self.finish(FinishReason::Length);
        }
    }
}
