//! The prefill role: accepts decode workers' connections, admits each
//! prefill request at its own door, computes the prompt and writes the
//! pages into the granted slots.
//!
//! Per connection, a reader task parses frames and a writer task owns the
//! transport and every transfer's sending state (one owner, fed by a
//! closed enum; control events take priority over page data, so an abort
//! is handled between two page writes and acknowledged once the write in
//! flight is done). Source pages stay held in the engine until the decode
//! worker releases or aborts the transfer, or the connection is gone.
//!
//! A transfer id used twice on one connection closes it: one request, one
//! transfer. When a connection ends, every transfer admitted on it releases its
//! source pages, whether the writer had opened it or not. While a prompt is
//! computed the writer sends a `Progress` frame after every step, and while it
//! waits its turn one with its place in the queue a few times a second, so
//! the decode side's deadline never kills a live transfer. The connection is mutual TLS
//! admitting only decode certificates. Each request carries the gateway's
//! signed context of its call ([`forwarded`]): prefill takes the tenant
//! and the cache scope from it, and aborts a request whose context does not
//! verify or does not match before anything is allocated.

mod forwarded;

pub use forwarded::{ContextKeys, FORWARD_AGE};

use crate::hello::{HelloCheck, check_peer};
use bulkhead_engine::{Engine, EngineError, PrefillEvent};
use bulkhead_kv::{AdmissionError, Generation, LentPage, TenantId, TransferId};
use bulkhead_transfer::FrameKey;
use bulkhead_transfer::checksum::transfer_digest;
use bulkhead_transfer::{
    Checksums, Done, Grant, Hello, Message, PrefillRequest, TcpTransport, Transport,
};
use bulkhead_trust::TlsListener;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A decode worker's connection: mutual TLS over TCP.
pub(crate) type Conn = bulkhead_trust::tokio_rustls::server::TlsStream<bulkhead_trust::Wire>;
use tokio::sync::{broadcast, mpsc};

/// How a prefill worker sends.
#[derive(Debug, Clone)]
pub struct PrefillOptions {
    /// Longest a single frame write may block on a peer that does not read.
    pub write_timeout: Duration,
    /// How pages travel.
    pub transport: crate::TransportKind,
    /// The contexts it accepts (none by default: every request is refused
    /// until the worker is given the platform's verifying keys).
    pub contexts: ContextKeys,
    /// Testing: the link's deliberate fault, if any.
    #[cfg(feature = "test-hooks")]
    fault: Option<LinkFault>,
}

/// A fault a test build puts on its link on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkFault {
    /// Wait this long before every frame (a deliberately slow link).
    Slow(Duration),
    /// Break this percent of the page frames sent (corrupted, delayed,
    /// dropped, duplicated or reordered), for the chaos soak.
    Broken(u8),
}

impl LinkFault {
    /// What the refusal in a serving build names.
    pub fn what(self) -> &'static str {
        match self {
            LinkFault::Slow(_) => "a slowed link (--page-delay-ms)",
            LinkFault::Broken(_) => "broken frames (--frame-faults-percent)",
        }
    }
}

impl PrefillOptions {
    /// Options for sending over `transport` with a per-frame write timeout.
    pub fn new(write_timeout: Duration, transport: crate::TransportKind) -> Self {
        PrefillOptions {
            write_timeout,
            transport,
            contexts: ContextKeys::default(),
            #[cfg(feature = "test-hooks")]
            fault: None,
        }
    }

    /// These options, accepting the contexts `contexts` verifies.
    #[must_use]
    pub fn with_contexts(mut self, contexts: ContextKeys) -> Self {
        self.contexts = contexts;
        self
    }

    /// Testing only: put `fault` on the link. Refused in a build without
    /// the `test-hooks` feature.
    #[allow(clippy::needless_pass_by_ref_mut, clippy::unused_self)]
    pub fn sabotage(
        &mut self,
        fault: LinkFault,
    ) -> Result<(), bulkhead_engine::hooks::HooksDisabled> {
        #[cfg(feature = "test-hooks")]
        {
            self.fault = Some(fault);
            Ok(())
        }
        #[cfg(not(feature = "test-hooks"))]
        Err(bulkhead_engine::hooks::HooksDisabled(fault.what()))
    }
}

/// Counters of a prefill worker.
#[derive(Debug, Default)]
pub struct PrefillCounters {
    /// Prefill requests received.
    pub requests: AtomicU64,
    /// Requests refused by admission (nothing allocated or sent).
    pub rejected: AtomicU64,
    /// Pages written.
    pub pages_sent: AtomicU64,
    /// Transfers finished with a `Done` frame.
    pub completed: AtomicU64,
    /// Transfers released by the decode worker.
    pub released: AtomicU64,
    /// Aborts sent / received, and acknowledgements sent / received.
    pub aborts_sent: AtomicU64,
    /// Aborts received.
    pub aborts_received: AtomicU64,
    /// Acknowledgements sent.
    pub acks_sent: AtomicU64,
    /// Acknowledgements received.
    pub acks_received: AtomicU64,
    /// Frames for finished or unknown transfers, dropped.
    pub dropped_frames: AtomicU64,
    /// Progress frames sent for transfers waiting their turn in the queue.
    pub queued_reports: AtomicU64,
    /// Connections whose loss released their transfers.
    pub connection_losses: AtomicU64,
    /// Frames held back by a slowed link (test builds only; always 0 in
    /// the serving build).
    pub delayed_frames: Arc<AtomicU64>,
    /// Frames broken on purpose, by kind (test builds only).
    pub frame_faults: Arc<bulkhead_transfer::ChaosCounts>,
}

/// An operator command for every connection.
#[derive(Debug, Clone, Copy)]
pub enum AdminCommand {
    /// Abort every transfer in flight (drain before maintenance).
    AbortAll,
}

/// A running prefill worker's shared handles.
#[derive(Debug, Clone)]
pub struct PrefillWorker {
    engine: Arc<Engine>,
    hello: Hello,
    options: PrefillOptions,
    counters: Arc<PrefillCounters>,
    admin: broadcast::Sender<AdminCommand>,
}

impl PrefillWorker {
    /// A worker around `engine`, introducing itself with `hello`.
    pub fn new(engine: Arc<Engine>, hello: Hello, options: PrefillOptions) -> Self {
        PrefillWorker {
            engine,
            hello,
            options,
            counters: Arc::default(),
            admin: broadcast::channel(16).0,
        }
    }

    /// The engine.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Counters.
    pub fn counters(&self) -> &PrefillCounters {
        &self.counters
    }

    /// Bytes of one KV page on the wire.
    pub fn page_bytes(&self) -> usize {
        crate::hello::page_bytes(&self.hello)
    }

    /// Sends an operator command to every connection.
    pub fn admin(&self, cmd: AdminCommand) {
        let _ = self.admin.send(cmd);
    }

    /// Serves the decode workers `listener` accepts (mutual TLS that admits
    /// only decode certificates, so a connection here is a decode worker's).
    pub async fn serve(self, mut listener: TlsListener) -> std::io::Result<()> {
        loop {
            let (sock, _) = listener.accept().await;
            tokio::spawn(self.clone().connection(sock));
        }
    }

    async fn connection(self, mut sock: Conn) {
        use tokio::io::AsyncWriteExt;
        let hello = Message::Hello(self.hello).encode();
        if sock.write_all(&hello).await.is_err() || sock.flush().await.is_err() {
            return;
        }
        let peer =
            match tokio::time::timeout(Duration::from_secs(10), Message::read(&mut sock)).await {
                Ok(Ok(Message::Hello(h))) => h,
                _ => return,
            };
        if check_peer(&self.hello, &peer) != HelloCheck::Compatible {
            return;
        }
        let (ctrl_tx, ctrl_rx) = mpsc::unbounded_channel();
        let (data_tx, data_rx) = mpsc::unbounded_channel();
        let admin = self.admin.subscribe();
        #[cfg(feature = "rdma")]
        if let crate::TransportKind::Rdma { device } = &self.options.transport {
            let Ok(transport) = crate::rdma::sender(&mut sock, device.clone()).await else {
                return;
            };
            let (rd, _wr) = tokio::io::split(sock);
            let reader = tokio::spawn(read_loop(rd, self.clone(), ctrl_tx, data_tx));
            let ctrl = write_loop(transport, self.clone(), ctrl_rx, data_rx, admin).await;
            reader.abort();
            let _ = reader.await;
            release_unopened(&self, ctrl);
            return;
        }
        let (rd, wr) = tokio::io::split(sock);
        let transport = TcpTransport::new(wr, Checksums::On, self.options.write_timeout);
        let reader = tokio::spawn(read_loop(rd, self.clone(), ctrl_tx, data_tx));
        #[cfg(feature = "test-hooks")]
        let ctrl = match self.options.fault {
            Some(LinkFault::Slow(d)) => {
                let delayed = Arc::clone(&self.counters.delayed_frames);
                let t = bulkhead_transfer::SlowTransport::new(transport, d, delayed);
                write_loop(t, self.clone(), ctrl_rx, data_rx, admin).await
            }
            Some(LinkFault::Broken(p)) => {
                let counts = Arc::clone(&self.counters.frame_faults);
                let t = bulkhead_transfer::ChaosTransport::new(transport, p, counts);
                write_loop(t, self.clone(), ctrl_rx, data_rx, admin).await
            }
            None => write_loop(transport, self.clone(), ctrl_rx, data_rx, admin).await,
        };
        #[cfg(not(feature = "test-hooks"))]
        let ctrl = write_loop(transport, self.clone(), ctrl_rx, data_rx, admin).await;
        reader.abort();
        let _ = reader.await;
        release_unopened(&self, ctrl);
    }
}

/// Control events for a connection's writer (handled before page data).
#[derive(Debug)]
enum Ctrl {
    /// A transfer admitted: its grant, prompt tokens and sending span.
    Open(Grant, u64, tracing::Span),
    Reject(TransferId, bulkhead_kv::AdmissionError),
    /// A request whose signed context was refused: nothing was allocated;
    /// decode is told to give up on it.
    Refuse(TransferId),
    PeerAbort(TransferId),
    AbortAck(TransferId),
    Release(TransferId),
    Closed,
}

/// Page data and results from the engine, per transfer.
#[derive(Debug)]
struct Data(TransferId, Item);

#[derive(Debug)]
enum Item {
    /// A computed page, lent by the engine: written in place.
    Page(LentPage),
    Computed(Vec<f32>),
    /// Prompt tokens computed so far (tells decode the transfer is alive).
    Progress {
        computed: usize,
        place: usize,
    },
    /// Refused after admission (pages were quarantined meanwhile and it
    /// can never fit): nothing was computed or sent.
    Refused(AdmissionError),
    Failed,
}

async fn read_loop(
    mut rd: tokio::io::ReadHalf<Conn>,
    w: PrefillWorker,
    ctrl: mpsc::UnboundedSender<Ctrl>,
    data: mpsc::UnboundedSender<Data>,
) {
    // Transfer ids this connection has used: one request, one transfer.
    let mut seen = HashSet::new();
    loop {
        let msg = match Message::read(&mut rd).await {
            Ok(m) => m,
            Err(_) => {
                let _ = ctrl.send(Ctrl::Closed);
                return;
            }
        };
        match msg {
            Message::Prefill(req) => {
                if !seen.insert(req.transfer) {
                    // A reused id is a broken or hostile peer.
                    let _ = ctrl.send(Ctrl::Closed);
                    return;
                }
                w.admit(req, &ctrl, &data);
            }
            Message::Abort { transfer } => {
                let _ = ctrl.send(Ctrl::PeerAbort(transfer));
            }
            Message::AbortAck { transfer } => {
                let _ = ctrl.send(Ctrl::AbortAck(transfer));
            }
            Message::Release { transfer } => {
                let _ = ctrl.send(Ctrl::Release(transfer));
            }
            // Frames only a prefill worker sends: a confused or hostile peer.
            _ => {
                let _ = ctrl.send(Ctrl::Closed);
                return;
            }
        }
    }
}

impl PrefillWorker {
    /// Admission at the prefill door, before any allocation: the request
    /// must fit this worker's limits and carry exactly the slots its prompt
    /// fills. A rejection is answered at once and is terminal.
    fn admit(
        &self,
        req: PrefillRequest,
        ctrl: &mpsc::UnboundedSender<Ctrl>,
        data: &mpsc::UnboundedSender<Data>,
    ) {
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        let page_size = self.hello.page_size as usize;
        let transfer = req.transfer;
        let max_tokens = usize::try_from(req.max_tokens).unwrap_or(usize::MAX);
        let tokens = req.prompt.len() as u64;
        if req.slots.len() != req.prompt.len().div_ceil(page_size.max(1)) {
            // A grant that does not match the prompt: a broken or hostile
            // peer. Drop the connection; nothing was allocated.
            self.counters.rejected.fetch_add(1, Ordering::Relaxed);
            crate::metrics::admission_rejected("grant_mismatch");
            let _ = ctrl.send(Ctrl::Closed);
            return;
        }
        // The request's server span, a child of decode's transfer span.
        let span = tracing::info_span!(
            target: "bulkhead::worker",
            "prefill",
            otel.kind = "server",
            bulkhead.transfer.id = %transfer,
            bulkhead.transfer.prompt_tokens = bulkhead_telemetry::int(tokens),
            bulkhead.admission.rejected = tracing::field::Empty,
        );
        if let Some(tp) = &req.traceparent {
            bulkhead_telemetry::set_remote_parent(&span, tp);
        }
        // The tenant and the cache scope come from the gateway's signed
        // context alone; a claim of decode's that differs is refused here,
        // before any page.
        let (ctx, cache) = match self
            .options
            .contexts
            .check(&req, std::time::SystemTime::now())
        {
            Ok(checked) => checked,
            Err(e) => {
                self.counters.rejected.fetch_add(1, Ordering::Relaxed);
                crate::metrics::context_refused(e.code());
                span.record("bulkhead.admission.rejected", e.code());
                tracing::warn!(target: "bulkhead::worker", parent: &span, error = %e, "prefill request refused: its signed context");
                let _ = ctrl.send(Ctrl::Refuse(transfer));
                return;
            }
        };
        let grant = Grant::new(transfer, req.slots, FrameKey::from_bytes(&req.key));
        match self.engine.submit_prefill(
            TenantId::new(ctx.tenant),
            req.prompt,
            max_tokens,
            transfer,
            cache,
            crate::engine_class(ctx.class),
        ) {
            Err(e) => {
                self.counters.rejected.fetch_add(1, Ordering::Relaxed);
                crate::metrics::admission_rejected(e.reason());
                span.record("bulkhead.admission.rejected", e.reason());
                let _ = ctrl.send(Ctrl::Reject(transfer, e));
            }
            Ok(mut events) => {
                let send = tracing::info_span!(
                    target: "bulkhead::worker",
                    parent: &span,
                    "kv.transfer.send",
                    otel.kind = "producer",
                    bulkhead.transfer.id = transfer.get(),
                    bulkhead.transfer.pages = tracing::field::Empty,
                    bulkhead.transfer.outcome = tracing::field::Empty,
                );
                let _ = ctrl.send(Ctrl::Open(grant, tokens, send));
                let data = data.clone();
                let compute = tracing::info_span!(
                    target: "bulkhead::worker",
                    parent: &span,
                    "prefill.compute",
                    otel.kind = "internal",
                );
                // Both end when the prompt is computed (or fails).
                let mut spans = Some((span, compute));
                tokio::spawn(async move {
                    while let Some(ev) = events.recv().await {
                        let items = match ev {
                            PrefillEvent::Pages(pages) => {
                                pages.into_iter().map(Item::Page).collect()
                            }
                            PrefillEvent::Computed { logits } => {
                                spans.take();
                                vec![Item::Computed(logits)]
                            }
                            PrefillEvent::Progress { computed, place } => {
                                vec![Item::Progress { computed, place }]
                            }
                            PrefillEvent::Failed(EngineError::Rejected(error)) => {
                                spans.take();
                                vec![Item::Refused(error)]
                            }
                            PrefillEvent::Failed(_) => {
                                spans.take();
                                vec![Item::Failed]
                            }
                        };
                        for item in items {
                            if data.send(Data(transfer, item)).is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        }
    }
}

#[derive(Debug)]
struct Sending {
    grant: Grant,
    tokens: u64,
    sent: Vec<(Generation, u64)>,
    /// The source pages written so far, held until the decode worker
    /// releases or aborts the transfer (dropping them sends them home).
    pages: Vec<LentPage>,
    /// `Done` was sent; waiting for the release.
    done: bool,
    /// We aborted; waiting for the acknowledgement.
    aborting: bool,
    /// From admission until the transfer is released or aborted.
    span: tracing::Span,
}

async fn write_loop<T: Transport>(
    mut t: T,
    w: PrefillWorker,
    mut ctrl: mpsc::UnboundedReceiver<Ctrl>,
    mut data: mpsc::UnboundedReceiver<Data>,
    mut admin: broadcast::Receiver<AdminCommand>,
) -> mpsc::UnboundedReceiver<Ctrl> {
    let c = &w.counters;
    let mut live: HashMap<TransferId, Sending> = HashMap::new();
    loop {
        let going = tokio::select! {
            biased;
            ev = ctrl.recv() => match ev {
                Some(ev) => on_ctrl(&mut t, &w, &mut live, ev).await.is_ok(),
                None => false,
            },
            cmd = admin.recv() => match cmd {
                Ok(AdminCommand::AbortAll) => abort_all(&mut t, &w, &mut live).await,
                _ => true,
            },
            d = data.recv() => match d {
                Some(Data(transfer, ev)) => on_data(&mut t, &w, &mut live, transfer, ev).await.is_ok(),
                None => false,
            },
        };
        if !going {
            break;
        }
    }
    // The connection is gone: nothing more can be written or acknowledged.
    if !live.is_empty() {
        c.connection_losses.fetch_add(1, Ordering::Relaxed);
    }
    for (transfer, sending) in live {
        drop(sending);
        w.engine.release_source(transfer);
    }
    ctrl
}

/// One control event; an error ends the connection.
async fn on_ctrl<T: Transport>(
    t: &mut T,
    w: &PrefillWorker,
    live: &mut HashMap<TransferId, Sending>,
    ev: Ctrl,
) -> Result<(), ()> {
    let c = &w.counters;
    match ev {
        Ctrl::Open(grant, tokens, span) => {
            live.insert(
                grant.transfer(),
                Sending {
                    sent: Vec::with_capacity(grant.len()),
                    pages: Vec::new(),
                    grant,
                    tokens,
                    done: false,
                    aborting: false,
                    span,
                },
            );
            Ok(())
        }
        Ctrl::Reject(transfer, error) => t
            .send(&Message::Rejected { transfer, error })
            .await
            .map_err(drop),
        Ctrl::Refuse(transfer) => t.send(&Message::Abort { transfer }).await.map_err(drop),
        Ctrl::PeerAbort(transfer) => {
            if let Some(s) = live.remove(&transfer) {
                s.span
                    .record("bulkhead.transfer.outcome", "aborted_by_decode");
                c.aborts_received.fetch_add(1, Ordering::Relaxed);
                w.engine.release_source(transfer);
                c.acks_sent.fetch_add(1, Ordering::Relaxed);
                // Every write for it is behind us: acknowledge once.
                t.send(&Message::AbortAck { transfer }).await.map_err(drop)
            } else {
                c.dropped_frames.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
        }
        Ctrl::AbortAck(transfer) => {
            match live.get(&transfer) {
                Some(s) if s.aborting => {
                    live.remove(&transfer);
                    c.acks_received.fetch_add(1, Ordering::Relaxed);
                }
                _ => {
                    c.dropped_frames.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(())
        }
        Ctrl::Release(transfer) => {
            match live.get(&transfer) {
                Some(s) if s.done => {
                    s.span.record("bulkhead.transfer.outcome", "released");
                    s.span.record(
                        "bulkhead.transfer.pages",
                        bulkhead_telemetry::int(s.sent.len()),
                    );
                    live.remove(&transfer);
                    c.released.fetch_add(1, Ordering::Relaxed);
                    w.engine.release_source(transfer);
                }
                _ => {
                    c.dropped_frames.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(())
        }
        Ctrl::Closed => Err(()),
    }
}

/// Aborts every transfer still sending (an operator's command); false when
/// the connection failed meanwhile.
async fn abort_all<T: Transport>(
    t: &mut T,
    w: &PrefillWorker,
    live: &mut HashMap<TransferId, Sending>,
) -> bool {
    let c = &w.counters;
    let mut failed = false;
    for (transfer, s) in live.iter_mut() {
        if !s.aborting && !s.done {
            s.aborting = true;
            s.span.record("bulkhead.transfer.outcome", "aborted");
            w.engine.release_source(*transfer);
            c.aborts_sent.fetch_add(1, Ordering::Relaxed);
            failed |= t
                .send(&Message::Abort {
                    transfer: *transfer,
                })
                .await
                .is_err();
        }
    }
    !failed
}

/// One item of a transfer's data; an error ends the connection.
async fn on_data<T: Transport>(
    t: &mut T,
    w: &PrefillWorker,
    live: &mut HashMap<TransferId, Sending>,
    transfer: TransferId,
    ev: Item,
) -> Result<(), ()> {
    let c = &w.counters;
    let Some(s) = live.get_mut(&transfer).filter(|s| !s.aborting && !s.done) else {
        return Ok(());
    };
    let r = match ev {
        Item::Page(page) => match s.grant.slot(page.slot()) {
            Some(slot) => {
                let r = t
                    .write_page(slot, page.bytes(), s.grant.key())
                    .await
                    .map(|sum| {
                        s.sent.push((slot.generation(), sum));
                        c.pages_sent.fetch_add(1, Ordering::Relaxed);
                    });
                s.pages.push(page);
                r
            }
            None => {
                // The engine made more pages than were granted:
                // never write past the grant; abort instead.
                s.aborting = true;
                s.span.record("bulkhead.transfer.outcome", "aborted");
                w.engine.release_source(transfer);
                c.aborts_sent.fetch_add(1, Ordering::Relaxed);
                t.send(&Message::Abort { transfer }).await
            }
        },
        Item::Computed(logits) => {
            let digest = transfer_digest(&s.sent, s.tokens, &logits);
            s.done = true;
            c.completed.fetch_add(1, Ordering::Relaxed);
            let mac = s.grant.key().done_tag(s.tokens, digest);
            t.send(&Message::Done(Done {
                transfer,
                tokens: s.tokens,
                digest,
                logits,
                mac,
            }))
            .await
        }
        Item::Progress { computed, place } => {
            if place > 0 {
                c.queued_reports.fetch_add(1, Ordering::Relaxed);
            }
            t.send(&Message::Progress {
                transfer,
                computed: computed as u64,
                place: place as u64,
            })
            .await
        }
        Item::Refused(error) => {
            // Never allocated: no page to release, nothing sent.
            s.span.record("bulkhead.transfer.outcome", "rejected");
            live.remove(&transfer);
            c.rejected.fetch_add(1, Ordering::Relaxed);
            t.send(&Message::Rejected { transfer, error }).await
        }
        Item::Failed => {
            s.aborting = true;
            s.span.record("bulkhead.transfer.outcome", "aborted");
            c.aborts_sent.fetch_add(1, Ordering::Relaxed);
            t.send(&Message::Abort { transfer }).await
        }
    };
    r.map_err(drop)
}

/// After the writer stopped and the reader is gone: transfers admitted but
/// never opened by the writer release their source pages too.
fn release_unopened(w: &PrefillWorker, mut ctrl: mpsc::UnboundedReceiver<Ctrl>) {
    ctrl.close();
    while let Ok(c) = ctrl.try_recv() {
        if let Ctrl::Open(grant, _, _) = c {
            w.engine.release_source(grant.transfer());
        }
    }
}
