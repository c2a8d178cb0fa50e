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
//! While two or more tenants have sent requests within the last five seconds,
//! steps are a quarter as long: a tenant's short request then waits a short
//! step behind another's long prompt, and one tenant alone keeps the long
//! steps that prefill long prompts fastest.
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
use crate::config::EngineConfig;
use crate::decode_cost::DecodeCost;
use crate::detok::Detokenizer;
use crate::error::{ConfigError, EngineError};
use crate::forward::{BatchSeq, Buffers, Numerics, Rope, forward};
use crate::gguf::ModelFile;
use crate::queue::QueueCharge;
use crate::sampling::Sampler;
use crate::speed::PrefillSpeed;
use bulkhead_kv::{
    AdmissionError, Admitted, AllocError, CacheScope, Generation, Home, KvDtype, KvGeometry,
    KvPool, LentPage, Limits, Owner, PageTable, PoolCounters, RequestId, TenantId, TransferId,
};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::oneshot;

mod batching;
mod sequence;
mod tenancy;
mod transfers;

/// Tenants that sent requests within this long share the engine: its
/// steps are [`SHARED_STEP_DIVISOR`] times shorter, so one tenant's new
/// request waits a short step, not a long prompt's full one, for its turn.
const SHARED_WINDOW: Duration = Duration::from_secs(5);

/// How much shorter a shared engine's steps are.
const SHARED_STEP_DIVISOR: u32 = 4;

/// How much shorter again a shared engine's step is when it holds batch
/// work only: an interactive request arriving during it waits this short
/// step out (about 8 ms at the default `--step-ms`), not a batch
/// decode's full one.
const BATCH_ONLY_STEP_DIVISOR: u32 = 6;

/// Calibration runs at least this long ...
const CALIBRATION_SPAN: Duration = Duration::from_millis(500);

/// ... in at least the first and at most the second number of rounds.
const CALIBRATION_ROUNDS: (usize, usize) = (3, 12);

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
        /// Its place in the prefill queue, from 1 (0: it is being
        /// computed); sent on a timer while it waits, so a transfer waiting
        /// its turn is never taken for a dead one.
        place: usize,
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
    /// Work beyond the model (sampling: a grammar's walk, stop strings)
    /// charged so far to the tenants' fair shares, in step units.
    pub sampling_units: u64,
    /// Requests that were to land their prompt from a prefill worker and
    /// computed it here instead (a short prompt, or a short suffix of a
    /// cached one).
    pub computed_here: u64,
}

pub(crate) type Sink = UnboundedSender<SeqEvent>;
pub(crate) type PrefillSink = UnboundedSender<PrefillEvent>;

/// A request waiting for pages (opaque).
#[derive(Debug)]
pub struct PendingRequest {
    request: GenerateRequest,
    sink: Sink,
    landing: Option<(TransferId, oneshot::Sender<Grant>)>,
    /// Its prompt's share of the prefill queue (none for a landing).
    charge: Option<QueueCharge>,
    /// Prompt tokens computed so far, for its handle.
    progress: PromptProgress,
}

impl PendingRequest {
    /// Its prompt's progress, as its handle reads it.
    pub(crate) fn progress(&self) -> PromptProgress {
        self.progress.clone()
    }

    /// With its prompt's share of the prefill queue.
    pub(crate) fn charged(mut self, charge: QueueCharge) -> Self {
        self.charge = Some(charge);
        self
    }
}

impl PendingPrefill {
    /// With its share of the prefill queue.
    pub(crate) fn charged(mut self, charge: QueueCharge) -> Self {
        self.charge = Some(charge);
        self
    }

    /// Of `class` (interactive when not said).
    pub(crate) fn of_class(mut self, class: crate::WorkClass) -> Self {
        self.class = class;
        self
    }
}

/// A prefill-only job waiting for pages (opaque).
#[derive(Debug)]
pub struct PendingPrefill {
    prompt: Vec<u32>,
    transfer: TransferId,
    events: PrefillSink,
    cache: Option<CacheScope>,
    class: crate::WorkClass,
    /// Its share of the prefill queue.
    charge: Option<QueueCharge>,
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
    /// What is left of its prompt's share of the prefill queue.
    charge: Option<QueueCharge>,
    /// Prompt tokens computed so far, as its handle reads them (none for a
    /// prefill job).
    progress: Option<PromptProgress>,
    /// Whether its prompt work goes before or after interactive work.
    class: crate::WorkClass,
}

/// Prompt tokens computed so far for one request, shared between the
/// engine thread (which writes it after every step that moves the prompt
/// on, and a decode worker's link from prefill's progress) and its handle:
/// what a request dropped before its first token is billed for.
#[derive(Debug, Clone, Default)]
pub struct PromptProgress(Arc<std::sync::atomic::AtomicUsize>);

impl PromptProgress {
    /// Tokens computed so far.
    pub fn get(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }

    /// At least `computed` tokens are computed now.
    pub fn advance(&self, computed: usize) {
        self.0
            .fetch_max(computed, std::sync::atomic::Ordering::AcqRel);
    }
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
    /// When each tenant last sent a request (those of the last
    /// [`SHARED_WINDOW`]): with two or more, steps are shorter.
    arrivals: HashMap<TenantId, Instant>,
    speed: PrefillSpeed,
    prefill_deadline: Duration,
    first_slice: usize,
    tenant_share_percent: usize,
    prefix_cache: bool,
    /// See [`crate::EngineConfig::local_prefill_tokens`].
    local_prefill_tokens: usize,
    /// See [`EngineStats::computed_here`].
    computed_here: u64,
    /// What decode steps cost here, learned from them.
    decode_cost: DecodeCost,
    /// The running sequence whose decode comes first next step (they take
    /// turns when their tokens together would outlast the step).
    decode_turn: usize,
    /// Whether the last step left decoding out for a short prompt.
    last_prompt_first: bool,
    preemptions: u64,
    /// See [`EngineStats::sampling_units`].
    sampling_units: u64,
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
            arrivals: HashMap::new(),
            speed,
            prefill_deadline: config.prefill_deadline,
            first_slice: config.first_slice_tokens.max(1),
            tenant_share_percent: config.tenant_share_percent.clamp(1, 100),
            prefix_cache: config.prefix_cache,
            local_prefill_tokens: config.local_prefill_tokens,
            computed_here: 0,
            decode_cost: DecodeCost::default(),
            decode_turn: 0,
            last_prompt_first: false,
            preemptions: 0,
            sampling_units: 0,
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
    /// ([`crate::speed::measure_pair_secs`]); the matrices by short passes
    /// on a scratch pool of the engine's own (the serving pool is never
    /// touched), less their attention; the best of each over
    /// [`CALIBRATION_SPAN`]. Call inside the engine's rayon pool, before
    /// anything is admitted.
    pub fn calibrate(&mut self) {
        const TOKENS: usize = 32;
        let geometry = self.pool.geometry();
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
        // Rounds of both measurements over half a second at least, the best
        // of each kept: a busy moment on a shared machine (a neighbour's
        // burst, a restart beside busy workers) does not set the speed.
        let started = Instant::now();
        let (mut secs_per_pair, mut best) = (f64::INFINITY, f64::INFINITY);
        for round in 0..CALIBRATION_ROUNDS.1 {
            if round >= CALIBRATION_ROUNDS.0 && started.elapsed() >= CALIBRATION_SPAN {
                break;
            }
            secs_per_pair = secs_per_pair.min(crate::speed::measure_pair_secs(
                &self.model.config,
                geometry.dtype,
                geometry.page_size,
                (4 * crate::forward::TILE_ROWS, crate::forward::TILE_ROWS),
                3,
            ));
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

    /// Engine-wide counters.
    pub fn stats(&self) -> EngineStats {
        EngineStats {
            pool: self.pool.counters(),
            running: self.running.len(),
            waiting: self.waiting.len(),
            draining_transfers: self.draining.len(),
            held_transfers: self.held.len(),
            preemptions: self.preemptions,
            computed_here: self.computed_here,
            sampling_units: self.sampling_units,
        }
    }

    /// A prefill job is queued or being computed: it should hear of its
    /// place now and then ([`EngineCore::report_queued`]).
    pub fn prefill_pending(&self) -> bool {
        self.waiting.iter().any(|w| match w {
            Waiting::New(a) => matches!(a.payload(), Pending::Prefill(_)),
            Waiting::Resume(s) => matches!(s.role, Role::Prefill { .. }),
        }) || self
            .running
            .iter()
            .any(|s| matches!(s.role, Role::Prefill { .. }) && !s.done)
    }

    /// Tells every prefill job that is not done where it stands: those
    /// being computed their progress (place 0), those waiting their place
    /// in the queue, from 1. Sent on a timer by the engine thread, so a
    /// job that waits its turn (behind others, or for pages) still shows
    /// signs of life to its decode side.
    pub fn report_queued(&self) {
        for s in &self.running {
            if let Role::Prefill { events, .. } = &s.role
                && !s.done
            {
                let _ = events.send(PrefillEvent::Progress {
                    computed: s.computed,
                    place: 0,
                });
            }
        }
        let mut place = 0;
        for w in &self.waiting {
            let (events, computed) = match w {
                Waiting::New(a) => match a.payload() {
                    Pending::Prefill(p) => (&p.events, 0),
                    Pending::Generate(_) => continue,
                },
                Waiting::Resume(s) => match &s.role {
                    Role::Prefill { events, .. } => (events, s.computed),
                    Role::Generate(_) => continue,
                },
            };
            place += 1;
            let _ = events.send(PrefillEvent::Progress { computed, place });
        }
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
