//! The decode role: admits requests against the pair's limits, lands their
//! prompt KV from a prefill worker, and generates.
//!
//! One link task owns the connection to the prefill worker and the
//! [`Ledger`] of its transfers, fed by a closed enum of events (frames from
//! the reader task, transfers to open, a timer tick). It verifies every
//! frame before the engine sees it, commits a transfer only when it is
//! whole, and releases landing pages only once no write for them can
//! arrive: after the peer's acknowledgement, or when the connection is gone.

use crate::hello::{HelloCheck, check_peer, peer_limits};
use bulkhead_engine::{Engine, GenerateRequest, RequestHandle, TransferFault};
use bulkhead_kv::{AdmissionError, Limits, TenantId, TransferId};
use bulkhead_transfer::{
    Checksums, DoneVerdict, Fault, Hello, Ledger, Message, PageVerdict, PrefillRequest,
    TransferCounters,
};
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};

/// How a decode worker talks to its prefill worker.
#[derive(Debug, Clone)]
pub struct DecodeOptions {
    /// The prefill worker's transfer address.
    pub prefill: String,
    /// Longest a transfer may take from request to `Done` before it is aborted.
    pub transfer_timeout: Duration,
    /// Longest to wait for an abort's acknowledgement before the connection
    /// is closed (closing fences every write on it).
    pub ack_timeout: Duration,
}

/// Why a request could not be started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// Admission refused it (terminal; nothing allocated or sent).
    #[error(transparent)]
    Rejected(#[from] AdmissionError),
    /// No prefill worker is reachable now.
    #[error("no prefill worker is available")]
    Unavailable,
}

/// The decode side of a disaggregated pair.
#[derive(Debug, Clone)]
pub struct DecodeWorker {
    engine: Arc<Engine>,
    link: mpsc::UnboundedSender<LinkEvent>,
    peer: watch::Receiver<Option<Limits>>,
    counters: watch::Receiver<TransferCounters>,
}

#[derive(Debug)]
enum LinkEvent {
    Open {
        transfer: TransferId,
        tenant: TenantId,
        prompt: Vec<u32>,
        max_tokens: usize,
        grant: Grant,
    },
    Frame(u64, Message),
    Closed(u64),
    Tick,
}

impl DecodeWorker {
    /// Starts the link to the prefill worker (connecting at once, and again
    /// whenever a transfer needs it). Call inside a tokio runtime.
    pub fn start(engine: Arc<Engine>, hello: Hello, options: DecodeOptions) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let (peer_tx, peer) = watch::channel(None);
        let (counters_tx, counters) = watch::channel(TransferCounters::default());
        let link = Link {
            engine: Arc::clone(&engine),
            hello,
            options,
            events: tx.clone(),
            conn: None,
            epoch: 0,
            ledger: Ledger::new(Checksums::On),
            aborting_since: Vec::new(),
            peer: peer_tx,
            counters: counters_tx,
        };
        tokio::spawn(link.run(rx));
        let tick = tx.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(50));
            loop {
                every.tick().await;
                if tick.send(LinkEvent::Tick).is_err() {
                    return;
                }
            }
        });
        DecodeWorker {
            engine,
            link: tx,
            peer,
            counters,
        }
    }

    /// The engine.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Transfer counters.
    pub fn counters(&self) -> TransferCounters {
        *self.counters.borrow()
    }

    /// The pair's limits: the smaller of this engine's and the prefill
    /// worker's (`None` until the prefill worker has introduced itself).
    pub fn limits(&self) -> Option<Limits> {
        let peer = (*self.peer.borrow())?;
        self.engine.info().limits.intersect(&peer)
    }

    /// Waits until the prefill worker has introduced itself, up to `wait`.
    pub async fn ready(&self, wait: Duration) -> bool {
        let mut peer = self.peer.clone();
        tokio::time::timeout(wait, peer.wait_for(Option::is_some))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Admits `request` against the pair's limits and starts its transfer
    /// once its pages are allocated. A rejection here happens before any
    /// page, bootstrap or transfer exists.
    pub fn submit(
        &self,
        tenant: TenantId,
        request: GenerateRequest,
    ) -> Result<RequestHandle, SubmitError> {
        let peer = (*self.peer.borrow()).ok_or(SubmitError::Unavailable)?;
        let transfer = TransferId::new(random_u64());
        let prompt = request.prompt.clone();
        let max_tokens = request.sampling.max_tokens;
        let (handle, grant) = self
            .engine
            .submit_landing(tenant, request, &peer, transfer)?;
        let link = self.link.clone();
        tokio::spawn(async move {
            // No grant means the request ended before its pages existed.
            if let Ok(g) = grant.await {
                let _ = link.send(LinkEvent::Open {
                    transfer,
                    tenant,
                    prompt,
                    max_tokens,
                    grant: bulkhead_transfer::Grant::new(transfer, g.generations),
                });
            }
        });
        Ok(handle)
    }
}

/// A grant as the transfer layer sees it.
type Grant = bulkhead_transfer::Grant;

struct Conn {
    writer: mpsc::UnboundedSender<Message>,
}

struct Link {
    engine: Arc<Engine>,
    hello: Hello,
    options: DecodeOptions,
    events: mpsc::UnboundedSender<LinkEvent>,
    conn: Option<Conn>,
    epoch: u64,
    ledger: Ledger,
    aborting_since: Vec<(TransferId, Instant)>,
    peer: watch::Sender<Option<Limits>>,
    counters: watch::Sender<TransferCounters>,
}

impl Link {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<LinkEvent>) {
        self.connect().await;
        while let Some(ev) = rx.recv().await {
            self.handle(ev).await;
            let _ = self.counters.send(self.ledger.counters());
        }
    }

    async fn connect(&mut self) -> bool {
        if self.conn.is_some() {
            return true;
        }
        let Ok(Ok(sock)) = tokio::time::timeout(
            Duration::from_secs(5),
            TcpStream::connect(&self.options.prefill),
        )
        .await
        else {
            return false;
        };
        let _ = sock.set_nodelay(true);
        let (mut rd, mut wr) = sock.into_split();
        if wr
            .write_all(&Message::Hello(self.hello).encode())
            .await
            .is_err()
        {
            return false;
        }
        let peer = match tokio::time::timeout(Duration::from_secs(10), Message::read(&mut rd)).await
        {
            Ok(Ok(Message::Hello(h))) => h,
            _ => return false,
        };
        let check = check_peer(&self.hello, &peer);
        if check != HelloCheck::Compatible {
            eprintln!(
                "bulkhead decode: prefill worker {} refused: {}",
                self.options.prefill,
                check.describe()
            );
            return false;
        }
        let _ = self.peer.send(Some(peer_limits(&peer)));
        self.epoch += 1;
        let epoch = self.epoch;
        let events = self.events.clone();
        tokio::spawn(async move {
            loop {
                match Message::read(&mut rd).await {
                    Ok(m) => {
                        if events.send(LinkEvent::Frame(epoch, m)).is_err() {
                            return;
                        }
                    }
                    Err(_) => {
                        let _ = events.send(LinkEvent::Closed(epoch));
                        return;
                    }
                }
            }
        });
        let (wtx, mut wrx) = mpsc::unbounded_channel::<Message>();
        let events = self.events.clone();
        tokio::spawn(async move {
            while let Some(m) = wrx.recv().await {
                if wr.write_all(&m.encode()).await.is_err() {
                    let _ = events.send(LinkEvent::Closed(epoch));
                    return;
                }
            }
        });
        self.conn = Some(Conn { writer: wtx });
        true
    }

    fn send(&self, m: Message) {
        if let Some(c) = &self.conn {
            let _ = c.writer.send(m);
        }
    }

    async fn handle(&mut self, ev: LinkEvent) {
        match ev {
            LinkEvent::Open {
                transfer,
                tenant,
                prompt,
                max_tokens,
                grant,
            } => {
                if !self.connect().await {
                    // Nothing was sent: no write can be in flight.
                    self.engine
                        .fence_transfer(transfer, TransferFault::ConnectionLost);
                    return;
                }
                let slots: Vec<_> = (0..grant.len())
                    .filter_map(|i| grant.slot(i).map(|s| s.generation()))
                    .collect();
                let page_bytes = self.page_bytes();
                let deadline = Instant::now() + self.options.transfer_timeout;
                if !self.ledger.open_transfer(
                    transfer,
                    slots.clone(),
                    prompt.len() as u64,
                    page_bytes,
                    deadline,
                ) {
                    self.engine.fence_transfer(transfer, TransferFault::Slot);
                    return;
                }
                self.send(Message::Prefill(PrefillRequest {
                    transfer,
                    tenant: tenant.get(),
                    max_tokens: max_tokens as u64,
                    prompt,
                    slots,
                }));
            }
            LinkEvent::Frame(epoch, m) if epoch == self.epoch => self.on_frame(m),
            LinkEvent::Frame(..) => {}
            LinkEvent::Closed(epoch) if epoch == self.epoch => self.lost(),
            LinkEvent::Closed(_) => {}
            LinkEvent::Tick => {
                let now = Instant::now();
                for t in self.ledger.expired(now) {
                    self.aborted(t, TransferFault::Timeout);
                }
                let overdue = self.aborting_since.iter().any(|(t, since)| {
                    self.ledger.is_open(*t) && now - *since > self.options.ack_timeout
                });
                if overdue {
                    // The peer does not acknowledge: closing the connection
                    // is the fence that makes release safe.
                    self.lost();
                }
                let ledger = &self.ledger;
                self.aborting_since.retain(|(t, _)| ledger.is_open(*t));
            }
        }
    }

    fn page_bytes(&self) -> usize {
        let h = &self.hello;
        (h.layers * 2 * h.kv_heads * h.head_dim * h.page_size) as usize * h.dtype_bytes as usize
    }

    fn abort(&mut self, t: TransferId, fault: TransferFault) {
        if self.ledger.abort(t) {
            self.aborted(t, fault);
        }
    }

    /// After the ledger moved `t` to aborting: fail the request (pages stay
    /// held) and tell the peer.
    fn aborted(&mut self, t: TransferId, fault: TransferFault) {
        self.engine.fail_transfer(t, fault);
        self.aborting_since.push((t, Instant::now()));
        self.send(Message::Abort { transfer: t });
    }

    fn on_frame(&mut self, m: Message) {
        match m {
            Message::Page(h, payload) => match self.ledger.on_page(&h, &payload) {
                PageVerdict::Write {
                    transfer,
                    slot,
                    generation,
                } => self.engine.import_page(transfer, slot, generation, payload),
                PageVerdict::Dropped => {}
                PageVerdict::Fail(t, fault) => self.abort(t, fault_of(fault)),
            },
            Message::Done(d) => match self.ledger.on_done(&d) {
                DoneVerdict::Commit(t) => {
                    self.engine.commit_transfer(t, d.logits);
                    self.send(Message::Release { transfer: t });
                }
                DoneVerdict::Dropped => {}
                DoneVerdict::Fail(t, fault) => self.abort(t, fault_of(fault)),
            },
            Message::Rejected { transfer, error } => {
                if self.ledger.on_rejected(transfer) {
                    self.engine.reject_transfer(transfer, error);
                }
            }
            Message::Abort { transfer } => {
                if self.ledger.on_peer_abort(transfer) {
                    // The peer wrote its last frame for it before this.
                    self.engine
                        .fence_transfer(transfer, TransferFault::PeerAborted);
                    self.send(Message::AbortAck { transfer });
                }
            }
            Message::AbortAck { transfer } => {
                if self.ledger.on_abort_ack(transfer) {
                    self.engine
                        .fence_transfer(transfer, TransferFault::PeerAborted);
                }
            }
            // A prefill worker never sends these: drop the connection.
            Message::Hello(_) | Message::Prefill(_) | Message::Release { .. } => self.lost(),
        }
    }

    /// The connection is gone (or we closed it): every open transfer is
    /// fenced, failed if still landing, and its pages released.
    fn lost(&mut self) {
        self.conn = None;
        self.epoch += 1;
        for t in self.ledger.connection_lost() {
            self.engine.fence_transfer(t, TransferFault::ConnectionLost);
        }
        self.aborting_since.clear();
    }
}

fn fault_of(f: Fault) -> TransferFault {
    match f {
        Fault::Checksum => TransferFault::Checksum,
        Fault::Slot => TransferFault::Slot,
        Fault::Duplicate => TransferFault::Duplicate,
        Fault::Incomplete => TransferFault::Incomplete,
    }
}

/// A random 64-bit id from the standard library's per-process random keys.
fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    );
    h.finish()
}
