//! The engine thread: one owner of the [`EngineCore`], fed by a closed enum
//! of commands. Compute runs in the engine's own rayon pool, never on an
//! async runtime.
//!
//! Admission runs in [`Engine::submit`], [`Engine::submit_landing`] and
//! [`Engine::submit_prefill`], on the caller's thread, before anything reaches
//! the engine thread; it also refuses token ids outside the vocabulary, whoever
//! sent them, and a prompt the prefill work queued ahead would make miss its
//! deadline (`crate::queue`). Lent pages come home as `Command::Returned`, in
//! order with every other command. While prefill jobs wait, the thread wakes
//! four times a second to tell each its place in the queue.

use crate::GenerateRequest;
use crate::compute_gate::ComputeGate;
use crate::config::EngineConfig;
use crate::core::{
    EngineCore, EngineStats, Grant, PendingPrefill, PendingRequest, PrefillEvent, PromptProgress,
    SeqEvent,
};
use crate::error::{ConfigError, TransferFault};
use crate::gguf::{ModelConfig, ModelFile};
use crate::queue::{PrefillQueue, QueueCharge, remaining_us};
use crate::speed::PrefillSpeed;
use crate::tokenizer::Tokenizer;
use bulkhead_kv::{
    AdmissionError, Admitted, CacheScope, Capacity, LentPage, Limits, PoolCounters, RequestId,
    TenantId, TransferId,
};
use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tokio::sync::oneshot;

/// What an engine can serve, measured after loading.
#[derive(Debug, Clone)]
pub struct EngineInfo {
    /// The model's hyperparameters.
    pub model: ModelConfig,
    /// Admission limits (context window, pool capacity, page size).
    pub limits: Limits,
    /// Pages in the pool.
    pub total_pages: usize,
    /// Element type of the pool's pages.
    pub kv_dtype: bulkhead_kv::KvDtype,
    /// The prefill speed measured at start.
    pub speed: PrefillSpeed,
    /// The prefill deadline the prompt limit was computed for.
    pub prefill_deadline: Duration,
}

enum Command {
    Submit(Admitted<PendingRequest>),
    Prefill(Admitted<PendingPrefill>),
    Cancel(RequestId),
    Returned(LentPage),
    Commit {
        transfer: TransferId,
        logits: Vec<f32>,
    },
    Fail(TransferId, TransferFault),
    Reject(TransferId, AdmissionError),
    Fence(TransferId, TransferFault),
    ReleaseSource(TransferId),
    Counters(mpsc::Sender<PoolCounters>),
    Stats(mpsc::Sender<EngineStats>),
    #[cfg(feature = "test-hooks")]
    TakeCommitted(mpsc::Sender<Vec<(TenantId, Vec<Vec<u8>>)>>),
    Shutdown,
}

/// A running engine. Dropping it stops the thread.
#[derive(Debug)]
pub struct Engine {
    commands: mpsc::Sender<Command>,
    model: Arc<ModelFile>,
    info: EngineInfo,
    /// The prefill work admitted and not yet computed.
    queue: Arc<PrefillQueue>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Command::Submit(_) => "Submit",
            Command::Prefill(_) => "Prefill",
            Command::Cancel(_) => "Cancel",
            Command::Returned(_) => "Returned",
            Command::Commit { .. } => "Commit",
            Command::Fail(..) => "Fail",
            Command::Reject(..) => "Reject",
            Command::Fence(..) => "Fence",
            Command::ReleaseSource(_) => "ReleaseSource",
            Command::Counters(_) => "Counters",
            Command::Stats(_) => "Stats",
            #[cfg(feature = "test-hooks")]
            Command::TakeCommitted(_) => "TakeCommitted",
            Command::Shutdown => "Shutdown",
        })
    }
}

/// The consumer side of one request. Dropping it before the end cancels
/// the request and returns its pages.
#[derive(Debug)]
pub struct RequestHandle {
    id: RequestId,
    events: UnboundedReceiver<SeqEvent>,
    commands: mpsc::Sender<Command>,
    ended: bool,
    progress: PromptProgress,
}

impl Engine {
    /// Checks `config` against the model and starts the engine thread.
    ///
    /// # Panics
    /// If the OS refuses to create threads.
    pub fn start(model: Arc<ModelFile>, config: &EngineConfig) -> Result<Self, ConfigError> {
        let mut core = EngineCore::new(Arc::clone(&model), config)?;
        let mut gate = match &config.compute_gate {
            Some(path) => Some(
                ComputeGate::open(path).map_err(|e| ConfigError::ComputeGate {
                    path: path.clone(),
                    why: e.to_string(),
                })?,
            ),
            None => None,
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(config.threads.max(1))
            .thread_name(|i| format!("bulkhead-compute-{i}"))
            .build()
            .expect("compute threads");
        // Measure before anything is admitted: the prompt limit depends on
        // it. Holding the gate, so background work on this host (the
        // embedding worker) does not compute beside the measurement.
        if let Some(g) = gate.as_mut() {
            let _ = g.hold();
        }
        pool.install(|| core.calibrate());
        if let Some(g) = gate.as_mut() {
            let _ = g.release();
        }
        let info = EngineInfo {
            model: model.config().clone(),
            limits: core.limits(),
            total_pages: core.counters().total_pages,
            kv_dtype: core.kv_dtype(),
            speed: core.speed(),
            prefill_deadline: config.prefill_deadline,
        };
        let (tx, rx) = mpsc::channel::<Command>();
        // Lent pages come home through the command channel, in order with
        // every other command.
        let home_tx = tx.clone();
        core.set_home(bulkhead_kv::Home::new(move |page| {
            let _ = home_tx.send(Command::Returned(page));
        }));
        let thread = std::thread::Builder::new()
            .name("bulkhead-engine".into())
            .spawn(move || run(&mut core, &pool, &rx, gate))
            .expect("engine thread");
        Ok(Engine {
            commands: tx,
            model,
            queue: PrefillQueue::new(info.prefill_deadline),
            info,
            thread: Some(thread),
        })
    }

    /// What this engine serves.
    pub fn info(&self) -> &EngineInfo {
        &self.info
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        self.model.tokenizer()
    }

    /// The loaded model file.
    pub fn model(&self) -> &ModelFile {
        &self.model
    }

    /// Every prompt token must be in the vocabulary (ids come from clients
    /// and peers; the embedding lookup must never see a wild one).
    fn check_tokens(&self, prompt: &[u32]) -> Result<(), AdmissionError> {
        let vocab = self.info.model.vocab;
        match prompt.iter().find(|t| **t as usize >= vocab) {
            Some(t) => Err(AdmissionError::TokenOutOfRange {
                token: *t as usize,
                vocab,
            }),
            None => Ok(()),
        }
    }

    /// Admits and queues a request for `tenant`. A rejected request is
    /// returned as an error here, before anything reaches the engine thread.
    pub fn submit(
        &self,
        tenant: TenantId,
        request: GenerateRequest,
    ) -> Result<RequestHandle, AdmissionError> {
        self.submit_generate(tenant, request, &self.info.limits, None)
    }

    /// Both generate doors: token check, admission, handle, queue.
    fn submit_generate(
        &self,
        tenant: TenantId,
        request: GenerateRequest,
        limits: &Limits,
        landing: Option<(TransferId, oneshot::Sender<Grant>)>,
    ) -> Result<RequestHandle, AdmissionError> {
        self.check_tokens(&request.prompt)?;
        // A landing's prompt is computed by its prefill worker.
        let prompt = landing.is_none().then_some(request.prompt.len());
        let (sink, events) = unbounded_channel();
        let mut admitted = EngineCore::admit_with(limits, tenant, request, sink, landing)?;
        if let Some(n) = prompt {
            let charge = self.reserve_prefill(n)?;
            admitted = admitted.map(|p| p.charged(charge));
        }
        let mut handle = RequestHandle {
            id: admitted.owner().request(),
            events,
            commands: self.commands.clone(),
            ended: false,
            progress: admitted.payload().progress(),
        };
        if self.commands.send(Command::Submit(admitted)).is_err() {
            handle.ended = true;
        }
        Ok(handle)
    }

    /// Reserves the cost of prefilling `n` prompt tokens in the queue, or
    /// refuses them: the work queued ahead plus theirs would overrun the
    /// prefill deadline. Before anything reaches the engine thread.
    fn reserve_prefill(&self, n: usize) -> Result<QueueCharge, AdmissionError> {
        self.queue
            .reserve(remaining_us(&self.info.speed, n, 0))
            .map_err(|full| AdmissionError::PrefillQueueFull {
                prompt_tokens: n,
                queued_ms: full.queued_ms,
                retry_after_ms: full.retry_after_ms,
            })
    }

    /// Prefill work admitted and not yet computed, at the measured speed.
    pub fn queued_prefill(&self) -> Duration {
        Duration::from_micros(self.queue.queued_us())
    }

    /// Current pool counters (waits for the engine thread).
    pub fn counters(&self) -> Option<PoolCounters> {
        let (tx, rx) = mpsc::channel();
        self.commands.send(Command::Counters(tx)).ok()?;
        rx.recv().ok()
    }

    /// Current engine counters (waits for the engine thread; call from a
    /// blocking context).
    pub fn stats(&self) -> Option<EngineStats> {
        let (tx, rx) = mpsc::channel();
        self.commands.send(Command::Stats(tx)).ok()?;
        rx.recv().ok()
    }

    /// Tests only: starts keeping the page bytes of every transfer committed
    /// from now on (tenant and pages, as committed), and returns those kept
    /// since the last call. Waits for the engine thread.
    #[cfg(feature = "test-hooks")]
    pub fn take_committed_for_test(&self) -> Vec<(TenantId, Vec<Vec<u8>>)> {
        let (tx, rx) = mpsc::channel();
        if self.commands.send(Command::TakeCommitted(tx)).is_err() {
            return Vec::new();
        }
        rx.recv().unwrap_or_default()
    }

    /// Decode side: admits a request against `peer` (the prefill worker's
    /// limits) and this engine's own, whichever is smaller, and queues it to
    /// land a transfer. The grant arrives once its pages are allocated.
    /// A rejection here happens before any page or transfer exists.
    pub fn submit_landing(
        &self,
        tenant: TenantId,
        request: GenerateRequest,
        peer: &Capacity,
        transfer: TransferId,
    ) -> Result<(RequestHandle, oneshot::Receiver<Grant>), AdmissionError> {
        // Hellos refuse a peer with another page size, so the pair always
        // narrows; if not, nothing fits.
        let limits = self
            .info
            .limits
            .narrow(peer)
            .ok_or(AdmissionError::PoolCapacityExceeded {
                prompt_tokens: request.prompt.len(),
                max_tokens: request.sampling.max_tokens,
                limit: 0,
            })?;
        let (granted, grant) = oneshot::channel();
        let handle = self.submit_generate(tenant, request, &limits, Some((transfer, granted)))?;
        Ok((handle, grant))
    }

    /// Prefill side: admits a prompt for `transfer` against this engine's
    /// limits (prompt plus `max_tokens`) and queues it. Events carry the
    /// finished pages and the last logits. With a cache scope (the decode
    /// worker's, from the signed context) the cached part of the prompt
    /// is copied instead of computed, and the pages are published once
    /// the transfer is released. `class` orders its prompt work against
    /// other requests' (the signed context's, as for the decode side).
    pub fn submit_prefill(
        &self,
        tenant: TenantId,
        prompt: Vec<u32>,
        max_tokens: usize,
        transfer: TransferId,
        cache: Option<CacheScope>,
        class: crate::WorkClass,
    ) -> Result<UnboundedReceiver<PrefillEvent>, AdmissionError> {
        self.check_tokens(&prompt)?;
        let (events, rx) = unbounded_channel();
        let n = prompt.len();
        let admitted = EngineCore::admit_prefill(
            &self.info.limits,
            tenant,
            prompt,
            max_tokens,
            transfer,
            events,
            cache,
        )?;
        let charge = self.reserve_prefill(n)?;
        let _ = self.commands.send(Command::Prefill(
            admitted.map(|p| p.charged(charge).of_class(class)),
        ));
        Ok(rx)
    }

    /// Decode side: the transfer was verified whole; decode from it.
    pub fn commit_transfer(&self, transfer: TransferId, logits: Vec<f32>) {
        let _ = self.commands.send(Command::Commit { transfer, logits });
    }

    /// Decode side: fails the transfer's request; pages stay held.
    pub fn fail_transfer(&self, transfer: TransferId, fault: TransferFault) {
        let _ = self.commands.send(Command::Fail(transfer, fault));
    }

    /// Decode side: the prefill worker's admission refused the request.
    pub fn reject_transfer(&self, transfer: TransferId, error: AdmissionError) {
        let _ = self.commands.send(Command::Reject(transfer, error));
    }

    /// Decode side: no write for the transfer can arrive any more.
    pub fn fence_transfer(&self, transfer: TransferId, fault: TransferFault) {
        let _ = self.commands.send(Command::Fence(transfer, fault));
    }

    /// Prefill side: the decode worker is done with the transfer.
    pub fn release_source(&self, transfer: TransferId) {
        let _ = self.commands.send(Command::ReleaseSource(transfer));
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl RequestHandle {
    /// Its prompt tokens computed so far (shared: a decode worker's link
    /// advances it from prefill's progress).
    pub fn prompt_progress(&self) -> &PromptProgress {
        &self.progress
    }

    /// The request's id.
    pub fn id(&self) -> RequestId {
        self.id
    }

    /// The next event, or `None` after the last one.
    pub async fn next(&mut self) -> Option<SeqEvent> {
        if self.ended {
            return None;
        }
        let ev = self.events.recv().await;
        self.note(ev.as_ref());
        ev
    }

    /// Asks the engine to stop the request without giving up its events:
    /// the last one (`Finished`, reason `Cancelled`, with the exact usage)
    /// still arrives. Dropping the handle cancels too, unseen.
    pub fn cancel(&self) {
        if !self.ended {
            let _ = self.commands.send(Command::Cancel(self.id));
        }
    }

    /// The next event, blocking the current (non-async) thread.
    pub fn blocking_next(&mut self) -> Option<SeqEvent> {
        if self.ended {
            return None;
        }
        let ev = self.events.blocking_recv();
        self.note(ev.as_ref());
        ev
    }

    fn note(&mut self, ev: Option<&SeqEvent>) {
        if matches!(
            ev,
            None | Some(SeqEvent::Finished { .. } | SeqEvent::Failed(_))
        ) {
            self.ended = true;
        }
    }
}

impl Drop for RequestHandle {
    fn drop(&mut self) {
        if !self.ended {
            let _ = self.commands.send(Command::Cancel(self.id));
        }
    }
}

/// How often prefill jobs that wait hear of their place in the queue.
const QUEUE_REPORT: Duration = Duration::from_millis(250);

fn run(
    core: &mut EngineCore,
    pool: &rayon::ThreadPool,
    rx: &mpsc::Receiver<Command>,
    mut gate: Option<ComputeGate>,
) {
    // Block for a command when there is nothing to do, or when the last step
    // could do nothing (requests waiting for pages held by transfers); with
    // prefill jobs waiting, only until their next report.
    let mut stalled = true;
    let mut reported = std::time::Instant::now();
    loop {
        if stalled || core.is_idle() {
            // Background work on this host may compute while we wait. (A
            // lock the kernel refuses leaves it unheld: the background then
            // computes beside us, slower for us, never wrong.)
            if let Some(g) = gate.as_mut() {
                let _ = g.release();
            }
            let cmd = if core.prefill_pending() {
                match rx.recv_timeout(QUEUE_REPORT.saturating_sub(reported.elapsed())) {
                    Ok(cmd) => Some(cmd),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
            } else {
                match rx.recv() {
                    Ok(cmd) => Some(cmd),
                    Err(_) => return,
                }
            };
            match cmd {
                Some(cmd) => {
                    if !apply(core, cmd) {
                        return;
                    }
                }
                None => {
                    core.report_queued();
                    reported = std::time::Instant::now();
                    continue;
                }
            }
        }
        loop {
            match rx.try_recv() {
                Ok(cmd) => {
                    if !apply(core, cmd) {
                        return;
                    }
                }
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => return,
            }
        }
        if let Some(g) = gate.as_mut() {
            let _ = g.hold();
        }
        stalled = !pool.install(|| core.step());
        if reported.elapsed() >= QUEUE_REPORT {
            core.report_queued();
            reported = std::time::Instant::now();
        }
    }
}

/// Applies one command; `false` means shut down.
fn apply(core: &mut EngineCore, cmd: Command) -> bool {
    match cmd {
        Command::Submit(a) => core.submit(a),
        Command::Prefill(a) => core.submit_prefill(a),
        Command::Cancel(id) => core.cancel(id),
        Command::Returned(page) => core.restore(page),
        Command::Commit {
            transfer,
            mut logits,
        } => core.commit_transfer(transfer, &mut logits),
        Command::Fail(t, fault) => core.fail_transfer(t, fault),
        Command::Reject(t, e) => core.reject_transfer(t, e),
        Command::Fence(t, fault) => core.fence_transfer(t, fault),
        Command::ReleaseSource(t) => core.release_source(t),
        Command::Counters(reply) => {
            let _ = reply.send(core.counters());
        }
        Command::Stats(reply) => {
            let _ = reply.send(core.stats());
        }
        #[cfg(feature = "test-hooks")]
        Command::TakeCommitted(reply) => {
            let _ = reply.send(core.take_committed_for_test());
        }
        Command::Shutdown => return false,
    }
    true
}
