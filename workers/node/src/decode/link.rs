//! One decode worker's link to one prefill worker.
//!
//! Two owners per connection:
//! - the link task owns the connection's lifecycle, the writer and every
//!   transfer's deadline, fed by a closed enum of events;
//! - the receiver task owns the [`Ledger`] and the landing pages, lent by
//!   the engine: it reads each page frame's payload straight into its slot
//!   (after checking the header against the grant), verifies it, and gives
//!   the pages back only when no write for them can arrive any more (the
//!   transfer committed, the peer acknowledged an abort, or the connection
//!   is gone). A landing page is never readable before the whole transfer
//!   is verified, and never reused while it is out.
//!
//! A link publishes the peer's capacity only while it is connected to a
//! compatible peer and wanted: a retired link (its prefill worker left the
//! fleet) takes no new transfer, lets the open ones finish, then closes.
//!
//! A transfer's deadline (`--transfer-timeout-ms`) runs from its last sign of
//! life: the prefill worker sends a `Progress` frame after every step, so a
//! long prompt being computed, or waiting behind others, is never timed out. A
//! deadline that passes fails the client at once and aborts the transfer; it
//! never frees pages, which stay out until the abort is acknowledged or the
//! connection is gone (closing it is the fence after an ack timeout,
//! `--ack-timeout-ms`).

use super::landing::Landing;
use super::{DecodeOptions, LoadGuard};
use crate::hello::{HelloCheck, check_peer, page_bytes, peer_limits};
use bulkhead_engine::{Engine, TransferFault};
use bulkhead_kv::{Capacity, LentPage, TenantId, TransferId};
use bulkhead_transfer::{
    Checksums, DoneVerdict, Fault, FrameKey, Head, Hello, Ledger, Message, PageVerdict,
    PrefillRequest, TransferCounters,
};
use bulkhead_trust::Role as CertRole;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// A transfer connection: mutual TLS over TCP.
type TlsConn = bulkhead_trust::tokio_rustls::client::TlsStream<bulkhead_trust::Wire>;
type OwnedReadHalf = tokio::io::ReadHalf<TlsConn>;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// Where a connection's inbound frames come from.
enum Source {
    /// Frames on the TCP connection; page payloads read in place.
    Tcp(OwnedReadHalf),
    /// Frames as RDMA receives; the TCP half only tells that the peer is gone.
    #[cfg(feature = "rdma")]
    Rdma(bulkhead_transfer::rdma::RdmaReceiver, OwnedReadHalf),
}

/// A transfer to open on a link: what prefill is asked for, and the
/// landing pages granted for it.
#[derive(Debug)]
pub(super) struct Opening {
    pub(super) transfer: TransferId,
    pub(super) tenant: TenantId,
    pub(super) prompt: Vec<u32>,
    pub(super) max_tokens: usize,
    /// The request's prefix-cache scope, for prefill to reuse from.
    pub(super) cache: Option<bulkhead_kv::CacheScope>,
    /// The gateway's signed context, forwarded for prefill to verify.
    pub(super) context: String,
    pub(super) grant: bulkhead_engine::Grant,
    /// The transfer's span: its `traceparent` goes to prefill, and it ends
    /// with the transfer.
    pub(super) span: tracing::Span,
    /// Counts the transfer against this link until it ends.
    pub(super) load: LoadGuard,
    /// The request's prompt progress, advanced from prefill's reports.
    pub(super) progress: bulkhead_engine::PromptProgress,
}

#[derive(Debug)]
pub(super) enum LinkEvent {
    Open(Opening),
    /// Whether the prefill worker is in the fleet (new transfers may come).
    Want(bool),
    /// The receiver aborted a transfer after a failed check.
    Aborting(u64, TransferId),
    /// The receiver finished with a transfer (its pages are home), and how.
    Ended(u64, TransferId, &'static str),
    /// The prefill worker reported progress on a transfer (prompt tokens
    /// computed): it is alive.
    Progress(u64, TransferId, u64),
    /// The receiver saw the connection end.
    Closed(u64),
    Tick,
}

/// What the link tells a connection's receiver.
#[derive(Debug)]
enum Inbox {
    Open {
        transfer: TransferId,
        pages: Vec<LentPage>,
        generations: Vec<bulkhead_kv::Generation>,
        tokens: u64,
        key: FrameKey,
    },
    /// The deadline passed; the link already failed the request and sent
    /// the abort. Drop frames for it until the acknowledgement.
    Expire(TransferId),
}

/// What the rest of the decode worker holds of a link.
#[derive(Debug)]
pub(super) struct LinkHandle {
    pub(super) address: String,
    pub(super) events: mpsc::UnboundedSender<LinkEvent>,
    /// The peer's capacity while connected, compatible and wanted.
    pub(super) peer: watch::Receiver<Option<Capacity>>,
    pub(super) counters: watch::Receiver<TransferCounters>,
    /// Transfers chosen for this link and not yet ended.
    pub(super) load: Arc<std::sync::atomic::AtomicUsize>,
}

/// Starts the link task to `address` (and its clock).
pub(super) fn start(
    engine: Arc<Engine>,
    hello: Hello,
    options: DecodeOptions,
    address: String,
) -> LinkHandle {
    let (tx, rx) = mpsc::unbounded_channel();
    let (peer_tx, peer) = watch::channel(None);
    let (counters_tx, counters) = watch::channel(TransferCounters::default());
    let link = Link {
        engine,
        hello,
        options,
        address: address.clone(),
        wanted: true,
        retry_at: Instant::now(),
        backoff: RETRY_MIN,
        events: tx.clone(),
        conn: None,
        epoch: 0,
        open: HashMap::new(),
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
    LinkHandle {
        address,
        events: tx,
        peer,
        counters,
        load: Arc::default(),
    }
}

/// The first wait before connecting again to a peer that is gone.
const RETRY_MIN: Duration = Duration::from_millis(200);
/// The longest such wait.
const RETRY_MAX: Duration = Duration::from_secs(5);

struct Conn {
    writer: mpsc::UnboundedSender<Message>,
    inbox: mpsc::UnboundedSender<Inbox>,
    receiver: JoinHandle<()>,
}

#[derive(Debug)]
struct Deadline {
    _load: LoadGuard,
    until: Instant,
    /// The request's prompt progress.
    progress: bulkhead_engine::PromptProgress,
    /// When this side aborted it (waiting for the acknowledgement).
    aborting_since: Option<Instant>,
    /// What decided the transfer before the receiver ended it.
    outcome: Option<&'static str>,
    span: tracing::Span,
}

struct Link {
    address: String,
    /// Whether the peer is in the fleet; when not, no new connection.
    wanted: bool,
    /// When to try connecting again after a failure.
    retry_at: Instant,
    backoff: Duration,
    engine: Arc<Engine>,
    hello: Hello,
    options: DecodeOptions,
    events: mpsc::UnboundedSender<LinkEvent>,
    conn: Option<Conn>,
    epoch: u64,
    /// Transfers open on the current connection.
    open: HashMap<TransferId, Deadline>,
    peer: watch::Sender<Option<Capacity>>,
    counters: watch::Sender<TransferCounters>,
}

impl Link {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<LinkEvent>) {
        self.connect().await;
        while let Some(ev) = rx.recv().await {
            self.handle(ev).await;
        }
    }

    /// Connects (if not connected) and, on success, publishes the peer's
    /// capacity; a failure sets the next attempt back.
    async fn connect(&mut self) -> bool {
        if self.conn.is_some() {
            return true;
        }
        if !self.wanted {
            return false;
        }
        let ok = self.try_connect().await;
        let now = Instant::now();
        if ok {
            self.backoff = RETRY_MIN;
        } else {
            self.retry_at = now + self.backoff;
            self.backoff = (self.backoff * 2).min(RETRY_MAX);
        }
        ok
    }

    async fn try_connect(&mut self) -> bool {
        let tls = match self
            .options
            .identity
            .connector_for_model(&[CertRole::Prefill], &self.options.model)
        {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(prefill = %self.address, error = %e, "no TLS connector for the prefill worker");
                return false;
            }
        };
        let mut sock = match bulkhead_trust::connect::dial(&tls, CertRole::Prefill, &self.address)
            .await
        {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(prefill = %self.address, error = %e, "transfer connection failed");
                return false;
            }
        };
        let hello = Message::Hello(self.hello).encode();
        if sock.write_all(&hello).await.is_err() || sock.flush().await.is_err() {
            return false;
        }
        let peer =
            match tokio::time::timeout(Duration::from_secs(10), Message::read(&mut sock)).await {
                Ok(Ok(Message::Hello(h))) => h,
                _ => return false,
            };
        let check = check_peer(&self.hello, &peer);
        if check != HelloCheck::Compatible {
            tracing::error!(
                prefill = %self.address,
                why = %check.describe(),
                "the prefill worker is not compatible"
            );
            return false;
        }
        let (source, mut wr) = match &self.options.transport {
            #[cfg(feature = "rdma")]
            crate::TransportKind::Rdma { device } => {
                let logits = self.engine.info().model.vocab * 4 + 64;
                let frame = (page_bytes(&self.hello) + bulkhead_transfer::wire::PAGE_HEADER_LEN)
                    .max(logits);
                let Ok(r) = crate::rdma::receiver(&mut sock, device.clone(), frame).await else {
                    return false;
                };
                let (rd, wr) = tokio::io::split(sock);
                (Source::Rdma(r, rd), wr)
            }
            _ => {
                let (rd, wr) = tokio::io::split(sock);
                (Source::Tcp(rd), wr)
            }
        };
        if self.wanted {
            let _ = self.peer.send(Some(peer_limits(&peer)));
        }
        self.epoch += 1;
        let epoch = self.epoch;
        let (wtx, mut wrx) = mpsc::unbounded_channel::<Message>();
        let events = self.events.clone();
        tokio::spawn(async move {
            while let Some(m) = wrx.recv().await {
                if wr.write_all(&m.encode()).await.is_err() || wr.flush().await.is_err() {
                    let _ = events.send(LinkEvent::Closed(epoch));
                    return;
                }
            }
        });
        let (inbox, inbox_rx) = mpsc::unbounded_channel();
        let receiver = Receiver {
            epoch,
            engine: Arc::clone(&self.engine),
            landing: Landing::new(Ledger::new(Checksums::On)),
            inbox: inbox_rx,
            writer: wtx.clone(),
            events: self.events.clone(),
            counters: self.counters.clone(),
            base: *self.counters.borrow(),
            page_bytes: page_bytes(&self.hello),
        };
        let receiver = tokio::spawn(receiver.run(source));
        self.conn = Some(Conn {
            writer: wtx,
            inbox,
            receiver,
        });
        true
    }

    /// Opens a transfer: connects if need be, readies its landing pages
    /// under a fresh frame key, and asks prefill for it.
    async fn open_transfer(&mut self, o: Opening) {
        if !self.connect().await {
            o.span
                .record("bulkhead.transfer.outcome", "connection_lost");
            drop(o.grant); // the landing pages go home first
            self.engine
                .fence_transfer(o.transfer, TransferFault::ConnectionLost);
            return;
        }
        let Some(conn) = &self.conn else { return };
        let slots = o.grant.generations.clone();
        // This transfer's key: prefill tags every frame with it.
        let (key_bytes, key) = FrameKey::generate();
        let opened = conn.inbox.send(Inbox::Open {
            transfer: o.transfer,
            pages: o.grant.pages,
            generations: o.grant.generations,
            tokens: o.prompt.len() as u64,
            key,
        });
        if opened.is_err() {
            self.engine
                .fence_transfer(o.transfer, TransferFault::ConnectionLost);
            return;
        }
        let traceparent = bulkhead_telemetry::traceparent_of(&o.span);
        self.open.insert(
            o.transfer,
            Deadline {
                _load: o.load,
                until: Instant::now() + self.options.transfer_timeout,
                progress: o.progress,
                aborting_since: None,
                outcome: None,
                span: o.span,
            },
        );
        let _ = conn.writer.send(Message::Prefill(PrefillRequest {
            transfer: o.transfer,
            tenant: o.tenant.get(),
            max_tokens: o.max_tokens as u64,
            prompt: o.prompt,
            slots,
            context: o.context,
            traceparent,
            key: key_bytes,
            cache: o.cache,
        }));
    }

    async fn handle(&mut self, ev: LinkEvent) {
        match ev {
            LinkEvent::Open(o) => self.open_transfer(o).await,
            LinkEvent::Aborting(epoch, t) if epoch == self.epoch => {
                if let Some(d) = self.open.get_mut(&t) {
                    d.aborting_since = Some(Instant::now());
                    d.outcome.get_or_insert("aborted");
                }
            }
            LinkEvent::Ended(epoch, t, how) if epoch == self.epoch => {
                if let Some(d) = self.open.remove(&t) {
                    // The first thing that decided it: a timeout or our
                    // abort, else how the receiver ended it.
                    d.span
                        .record("bulkhead.transfer.outcome", d.outcome.unwrap_or(how));
                }
            }
            LinkEvent::Progress(epoch, t, computed) if epoch == self.epoch => {
                // The deadline runs from the last sign of life, so a long
                // prompt being computed is never timed out.
                if let Some(d) = self.open.get_mut(&t)
                    && d.aborting_since.is_none()
                {
                    d.until = Instant::now() + self.options.transfer_timeout;
                    d.progress
                        .advance(usize::try_from(computed).unwrap_or(usize::MAX));
                }
            }
            LinkEvent::Closed(epoch) if epoch == self.epoch => self.close().await,
            LinkEvent::Aborting(..)
            | LinkEvent::Ended(..)
            | LinkEvent::Progress(..)
            | LinkEvent::Closed(_) => {}
            LinkEvent::Want(wanted) => {
                self.wanted = wanted;
                if wanted {
                    self.retry_at = Instant::now();
                } else {
                    let _ = self.peer.send(None);
                }
            }
            LinkEvent::Tick => self.tick().await,
        }
    }

    async fn tick(&mut self) {
        let now = Instant::now();
        if self.conn.is_none() {
            if self.wanted && now >= self.retry_at {
                self.connect().await;
            }
            return;
        }
        if !self.wanted && self.open.is_empty() {
            // Retired and idle: nothing in flight can be cut.
            self.close().await;
            return;
        }
        let Some(conn) = &self.conn else { return };
        let mut overdue = false;
        for (t, d) in &mut self.open {
            match d.aborting_since {
                None if d.until <= now => {
                    // Fail the client now; the pages stay out (held) until
                    // the peer acknowledges or the connection is gone.
                    d.aborting_since = Some(now);
                    d.outcome.get_or_insert("timeout");
                    self.engine.fail_transfer(*t, TransferFault::Timeout);
                    let _ = conn.inbox.send(Inbox::Expire(*t));
                    let _ = conn.writer.send(Message::Abort { transfer: *t });
                }
                Some(since) if now - since > self.options.ack_timeout => overdue = true,
                _ => {}
            }
        }
        if overdue {
            // The peer does not acknowledge: closing the connection is the
            // fence that makes release safe.
            self.close().await;
        }
    }

    /// Ends the current connection: the receiver (and every landing page it
    /// holds) is dropped first, then every transfer still open is fenced.
    async fn close(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        let _ = self.peer.send(None);
        self.retry_at = Instant::now() + RETRY_MIN;
        self.epoch += 1;
        conn.receiver.abort();
        let _ = conn.receiver.await;
        for (t, d) in self.open.drain() {
            d.span.record(
                "bulkhead.transfer.outcome",
                d.outcome.unwrap_or("connection_lost"),
            );
            self.engine.fence_transfer(t, TransferFault::ConnectionLost);
        }
    }
}

/// The receiving half of one connection.
struct Receiver {
    epoch: u64,
    engine: Arc<Engine>,
    landing: Landing,
    inbox: mpsc::UnboundedReceiver<Inbox>,
    writer: mpsc::UnboundedSender<Message>,
    events: mpsc::UnboundedSender<LinkEvent>,
    counters: watch::Sender<TransferCounters>,
    /// Counters of earlier connections, added to this ledger's.
    base: TransferCounters,
    page_bytes: usize,
}

impl Receiver {
    async fn run(mut self, mut source: Source) {
        loop {
            let ok = match &mut source {
                Source::Tcp(rd) => {
                    let head = Message::read_head(rd).await;
                    // Transfers opened before this frame was sent are in the inbox.
                    self.drain_inbox();
                    match head {
                        Ok(Head::Page(h, len)) => self.page(rd, &h, len).await,
                        Ok(Head::Message(m)) => self.message(m),
                        Err(_) => false,
                    }
                }
                #[cfg(feature = "rdma")]
                Source::Rdma(frames, control) => {
                    use tokio::io::AsyncReadExt;
                    let frame = tokio::select! {
                        f = frames.next() => f,
                        _ = control.read_u8() => None,
                    };
                    self.drain_inbox();
                    match frame {
                        Some(Ok(Message::Page(h, payload))) => self.received_page(&h, &payload),
                        Some(Ok(m)) => self.message(m),
                        _ => false,
                    }
                }
            };
            self.publish();
            if !ok {
                break;
            }
        }
        // The connection is gone: no write can arrive. Pages go home, then
        // every open transfer is fenced.
        self.landing.clear();
        for t in self.landing.ledger.connection_lost() {
            self.engine.fence_transfer(t, TransferFault::ConnectionLost);
            let _ = self
                .events
                .send(LinkEvent::Ended(self.epoch, t, "connection_lost"));
        }
        self.publish();
        let _ = self.events.send(LinkEvent::Closed(self.epoch));
    }

    fn publish(&self) {
        let _ = self
            .counters
            .send(self.base + self.landing.ledger.counters());
    }

    fn drain_inbox(&mut self) {
        while let Ok(m) = self.inbox.try_recv() {
            match m {
                Inbox::Open {
                    transfer,
                    pages,
                    generations,
                    tokens,
                    key,
                } => {
                    self.landing
                        .open(transfer, pages, (generations, tokens), self.page_bytes, key);
                }
                Inbox::Expire(t) => {
                    self.landing.ledger.expire(t);
                }
            }
        }
    }

    /// A page frame, landed ([`Landing::page`]); then the ledger rules.
    async fn page(
        &mut self,
        rd: &mut OwnedReadHalf,
        h: &bulkhead_transfer::PageHeader,
        len: usize,
    ) -> bool {
        match self.landing.page(rd, h, len).await {
            Ok(verdict) => {
                self.rule(verdict);
                true
            }
            Err(_) => false,
        }
    }

    fn rule(&mut self, verdict: PageVerdict) {
        if let PageVerdict::Fail(t, fault) = verdict {
            self.abort(t, fault_of(fault));
        }
    }

    /// A page that arrived whole (RDMA), landed; then the ledger rules.
    #[cfg(feature = "rdma")]
    fn received_page(&mut self, h: &bulkhead_transfer::PageHeader, payload: &[u8]) -> bool {
        let verdict = self.landing.received_page(h, payload);
        self.rule(verdict);
        true
    }

    fn message(&mut self, m: Message) -> bool {
        match m {
            Message::Done(d) => match self.landing.ledger.on_done(&d) {
                DoneVerdict::Commit(t) => {
                    // Pages home first, then the commit (same channel, in order).
                    self.end(t, "committed");
                    self.engine.commit_transfer(t, d.logits);
                    let _ = self.writer.send(Message::Release { transfer: t });
                }
                DoneVerdict::Dropped => {}
                DoneVerdict::Fail(t, fault) => self.abort(t, fault_of(fault)),
            },
            Message::Rejected { transfer, error } => {
                if self.landing.ledger.on_rejected(transfer) {
                    self.end(transfer, "rejected");
                    self.engine.reject_transfer(transfer, error);
                }
            }
            Message::Abort { transfer } => {
                if self.landing.ledger.on_peer_abort(transfer) {
                    // The peer wrote its last frame for it before this.
                    self.end(transfer, "aborted_by_prefill");
                    self.engine
                        .fence_transfer(transfer, TransferFault::PeerAborted);
                    let _ = self.writer.send(Message::AbortAck { transfer });
                }
            }
            Message::Progress {
                transfer, computed, ..
            } => {
                let _ = self
                    .events
                    .send(LinkEvent::Progress(self.epoch, transfer, computed));
            }
            Message::AbortAck { transfer } => {
                if self.landing.ledger.on_abort_ack(transfer) {
                    self.end(transfer, "aborted");
                    self.engine
                        .fence_transfer(transfer, TransferFault::PeerAborted);
                }
            }
            // A prefill worker never sends these: drop the connection.
            Message::Hello(_)
            | Message::Prefill(_)
            | Message::Release { .. }
            | Message::Page(..) => {
                return false;
            }
        }
        true
    }

    /// No write for `t` can arrive any more: its landing pages go home
    /// (before whatever the caller tells the engine next) and the link
    /// forgets its deadline.
    fn end(&mut self, t: TransferId, how: &'static str) {
        drop(self.landing.end(t));
        let _ = self.events.send(LinkEvent::Ended(self.epoch, t, how));
    }

    /// A check failed: fail the request now, keep the pages until the peer
    /// acknowledges the abort.
    fn abort(&mut self, t: TransferId, fault: TransferFault) {
        if self.landing.ledger.abort(t) {
            self.engine.fail_transfer(t, fault);
            let _ = self.writer.send(Message::Abort { transfer: t });
            let _ = self.events.send(LinkEvent::Aborting(self.epoch, t));
        }
    }
}

fn fault_of(f: Fault) -> TransferFault {
    match f {
        Fault::Checksum => TransferFault::Checksum,
        Fault::Tag => TransferFault::Tag,
        Fault::Slot => TransferFault::Slot,
        Fault::Duplicate => TransferFault::Duplicate,
        Fault::Incomplete => TransferFault::Incomplete,
    }
}
