//! The prefill/decode transfer protocol, model-checked with stateright.
//!
//! Two actors over a network that drops, duplicates and reorders messages:
//! a decode worker that admits requests, grants landing pages and feeds
//! every frame to the real [`Ledger`] (the decode side's verdicts are the
//! ledger's, not a copy of them), and a prefill worker that admits again
//! with the real [`Limits`], computes, and sends pages tagged through the
//! real [`Slot::header`]. Deadlines, abort acknowledgement timeouts, a lost
//! connection and prefill's own aborts fire whenever they may; a crash of
//! the prefill worker loses its state. A page frame is received in two
//! steps, header then payload, as the real receiver reads a payload
//! straight into its landing page, so an abort can land in the middle of a
//! write.
//!
//! Checked, on every reachable state up to a depth bound:
//! - a page is readable on decode only if every frame of its transfer was
//!   verified, and then it holds only its own request's bytes;
//! - no page is freed or reused while a write to it may be in flight;
//! - an abort is acknowledged at most once, on both sides;
//! - once nothing is pending (no request, no timer, no write), every
//!   page on both sides is free.
//!
//! Three mutants, each behind a switch only tests can set, must each
//! produce a counterexample: the incident's over-long prompt replaced by a
//! placeholder and still transferred; landing pages released on abort
//! before the acknowledgement; a commit with a frame missing.

use bulkhead_kv::{
    AdmissionError, Generation, KvDtype, KvGeometry, KvPool, Limits, TenantId, TransferId,
};
use bulkhead_transfer::checksum::transfer_digest;
use bulkhead_transfer::wire::{Done, PageHeader};
use bulkhead_transfer::{Checksums, DoneVerdict, FrameKey, Grant, Ledger, PageVerdict};
use stateright::actor::{Actor, ActorModel, Id, LossyNetwork, Network, Out, model_timeout};
use stateright::{Checker, Expectation, HasDiscoveries, Model};
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

/// Bytes of a page in the model (the tags cover them as they cover real
/// pages).
const PAGE_BYTES: usize = 4;
/// Tokens per page.
const PAGE_TOKENS: usize = 16;
/// The tenant of every request.
const TENANT: u64 = 1;
/// Whose stale bytes every page holds at the start.
const STALE: [u8; PAGE_BYTES] = [2, 0xEE, 0xEE, 0xEE];
/// The decode worker's pool, in pages; the prefill worker's is smaller,
/// as in the incident.
const DECODE_PAGES: usize = 2;
const PREFILL_PAGES: usize = 1;
/// Prompts of the requests, in order: one longer than the prefill pool
/// (but not the decode pool), then one that fits.
const PROMPTS: [usize; 2] = [20, 10];

fn decode_id() -> Id {
    Id::from(0)
}
fn prefill_id() -> Id {
    Id::from(1)
}

/// The bytes request `transfer`'s prompt computes into a page.
fn bytes_of(transfer: u64) -> [u8; PAGE_BYTES] {
    [TENANT as u8, transfer as u8, 0xC0, 0xDE]
}

/// The key of transfer `t` (fixed, so that states repeat).
fn key_of(t: u64) -> [u8; 32] {
    [t as u8; 32]
}

fn pages_for(tokens: usize) -> usize {
    tokens.div_ceil(PAGE_TOKENS)
}

/// The limits of a pool of `pages` pages.
fn limits(pages: usize) -> Limits {
    let geometry = KvGeometry {
        layers: 1,
        kv_heads: 1,
        head_dim: 1,
        page_size: PAGE_TOKENS,
        dtype: KvDtype::F16,
    };
    KvPool::new(geometry, pages, false).limits(1 << 20)
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Msg {
    Prefill {
        epoch: u8,
        transfer: u64,
        tokens: u64,
        generations: Vec<u64>,
        key: [u8; 32],
    },
    Rejected {
        epoch: u8,
        transfer: u64,
    },
    Page {
        epoch: u8,
        transfer: u64,
        slot: u32,
        generation: u64,
        checksum: u64,
        mac: [u8; 16],
        payload: [u8; PAGE_BYTES],
    },
    Done {
        epoch: u8,
        transfer: u64,
        tokens: u64,
        digest: u64,
        mac: [u8; 16],
    },
    Release {
        epoch: u8,
        transfer: u64,
    },
    Abort {
        epoch: u8,
        transfer: u64,
    },
    AbortAck {
        epoch: u8,
        transfer: u64,
    },
}

impl Msg {
    fn epoch(&self) -> u8 {
        match self {
            Msg::Prefill { epoch, .. }
            | Msg::Rejected { epoch, .. }
            | Msg::Page { epoch, .. }
            | Msg::Done { epoch, .. }
            | Msg::Release { epoch, .. }
            | Msg::Abort { epoch, .. }
            | Msg::AbortAck { epoch, .. } => *epoch,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Timer {
    /// Decode: the transfer's deadline.
    Deadline(u64),
    /// Decode: the payload being read lands.
    PayloadDone,
    /// Decode: no acknowledgement came; give up on the connection.
    AckTimeout(u64),
    /// Decode: the connection breaks (once).
    ConnectionLost,
    /// Decode: generation ends; the pages go back.
    Finish(u64),
    /// Prefill: send the next frame.
    Send(u64),
    /// Prefill: its own failure or deadline aborts the transfer.
    PrefillAbort(u64),
}

/// The switches for the mutants; all off is Bulkhead as built.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Mutants {
    /// Prefill swaps a prompt its admission refuses for a one-token
    /// placeholder and still sends every granted slot and `Done`.
    placeholder: bool,
    /// Decode frees landing pages when it aborts, not on the ack.
    release_before_ack: bool,
    /// The ledger commits a transfer whose frames did not all arrive.
    commit_with_missing_frame: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum PageState {
    Free,
    Landing(u64),
    Readable(u64),
    Draining(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Page {
    state: PageState,
    generation: u64,
    bytes: [u8; PAGE_BYTES],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Req {
    Waiting,
    Transferring(u64),
    Decoding(u64),
    Served,
    Failed,
    Refused,
}

/// A payload being read into a landing page.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Writing {
    page: usize,
    transfer: u64,
    header: (u32, u64, u64, [u8; 16]),
    payload: [u8; PAGE_BYTES],
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct DecodeState {
    ledger: Ledger,
    epoch: u8,
    pages: Vec<Page>,
    requests: Vec<Req>,
    /// Each transfer's pages, in slot order.
    slots: BTreeMap<u64, Vec<usize>>,
    /// Each transfer's slots whose frame the ledger verified.
    verified: BTreeMap<u64, Vec<bool>>,
    writing: Option<Writing>,
    /// Frames read after the one being written (the receiver is serial).
    backlog: Vec<Msg>,
    /// Acknowledgements the ledger accepted, per transfer.
    acks: BTreeMap<u64, u8>,
    lost: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum JobState {
    Sending { sent: usize },
    AwaitingRelease,
    Aborting,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Job {
    epoch: u8,
    tokens: u64,
    generations: Vec<u64>,
    key: [u8; 32],
    pages: Vec<usize>,
    sums: Vec<(u64, u64)>,
    state: JobState,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct PrefillState {
    epoch: u8,
    /// Which job holds each page.
    pages: Vec<Option<u64>>,
    bytes: Vec<[u8; PAGE_BYTES]>,
    jobs: BTreeMap<u64, Job>,
    seen: BTreeSet<u64>,
    acks_sent: BTreeMap<u64, u8>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum State {
    Decode(Box<DecodeState>),
    Prefill(Box<PrefillState>),
}

#[derive(Clone, Debug)]
enum Node {
    Decode { limits: Limits, mutants: Mutants },
    Prefill { limits: Limits, mutants: Mutants },
}

impl Actor for Node {
    type Msg = Msg;
    type Timer = Timer;
    type State = State;
    type Storage = ();
    type Random = ();

    fn on_start(&self, _id: Id, _storage: &Option<()>, o: &mut Out<Self>) -> State {
        match self {
            Node::Decode { limits, mutants } => {
                let mut ledger = Ledger::new(Checksums::On);
                if mutants.commit_with_missing_frame {
                    ledger.plant_mutant_commit_with_missing_frame();
                }
                let mut s = DecodeState {
                    ledger,
                    epoch: 0,
                    pages: vec![
                        Page {
                            state: PageState::Free,
                            generation: 0,
                            bytes: STALE,
                        };
                        DECODE_PAGES
                    ],
                    requests: vec![Req::Waiting; PROMPTS.len()],
                    slots: BTreeMap::new(),
                    verified: BTreeMap::new(),
                    writing: None,
                    backlog: Vec::new(),
                    acks: BTreeMap::new(),
                    lost: false,
                };
                o.set_timer(Timer::ConnectionLost, model_timeout());
                start_next(limits, &mut s, o);
                State::Decode(Box::new(s))
            }
            Node::Prefill { .. } => State::Prefill(Box::new(PrefillState {
                epoch: 0,
                pages: vec![None; PREFILL_PAGES],
                bytes: vec![STALE; PREFILL_PAGES],
                jobs: BTreeMap::new(),
                seen: BTreeSet::new(),
                acks_sent: BTreeMap::new(),
            })),
        }
    }

    fn on_msg(&self, _id: Id, state: &mut Cow<'_, State>, _src: Id, msg: Msg, o: &mut Out<Self>) {
        match (self, state.to_mut()) {
            (Node::Decode { limits, mutants }, State::Decode(s)) => {
                if msg.epoch() != s.epoch {
                    return; // a frame of a connection that is gone
                }
                if s.writing.is_some() {
                    s.backlog.push(msg);
                    return;
                }
                decode_msg(limits, *mutants, s, msg, o);
            }
            (Node::Prefill { limits, mutants }, State::Prefill(s)) => {
                prefill_msg(limits, *mutants, s, msg, o);
            }
            _ => {}
        }
    }

    fn on_timeout(&self, _id: Id, state: &mut Cow<'_, State>, timer: &Timer, o: &mut Out<Self>) {
        match (self, state.to_mut()) {
            (Node::Decode { limits, mutants }, State::Decode(s)) => {
                decode_timer(limits, *mutants, s, timer, o);
            }
            (Node::Prefill { .. }, State::Prefill(s)) => prefill_timer(s, timer, o),
            _ => {}
        }
    }
}

/// Starts the next waiting request when no other is in flight and its
/// pages are free (one at a time keeps the state space small while pages
/// are still reused).
fn start_next(limits: &Limits, s: &mut DecodeState, o: &mut Out<Node>) {
    if s.requests
        .iter()
        .any(|r| matches!(r, Req::Transferring(_) | Req::Decoding(_)))
    {
        return;
    }
    let Some(i) = s.requests.iter().position(|r| *r == Req::Waiting) else {
        return;
    };
    let tokens = PROMPTS[i];
    if limits.admit(TenantId::new(TENANT), tokens, 1, ()).is_err() {
        s.requests[i] = Req::Refused;
        return start_next(limits, s, o);
    }
    let free: Vec<usize> = (0..s.pages.len())
        .filter(|p| s.pages[*p].state == PageState::Free)
        .take(pages_for(tokens))
        .collect();
    if free.len() < pages_for(tokens) {
        return; // waits for pages
    }
    let transfer = i as u64 + 1;
    let mut generations = Vec::new();
    for p in &free {
        let page = &mut s.pages[*p];
        page.generation += 1;
        page.state = PageState::Landing(transfer);
        generations.push(page.generation);
    }
    let key = key_of(transfer);
    let opened = s.ledger.open_transfer(
        TransferId::new(transfer),
        generations
            .iter()
            .map(|g| Generation::from_wire(*g))
            .collect(),
        tokens as u64,
        PAGE_BYTES,
        FrameKey::from_bytes(&key),
    );
    assert!(opened, "a fresh transfer id opens");
    s.slots.insert(transfer, free);
    s.verified.insert(transfer, vec![false; generations.len()]);
    s.requests[i] = Req::Transferring(transfer);
    o.send(
        prefill_id(),
        Msg::Prefill {
            epoch: s.epoch,
            transfer,
            tokens: tokens as u64,
            generations,
            key,
        },
    );
    o.set_timer(Timer::Deadline(transfer), model_timeout());
}

/// The request a transfer serves (transfer ids are request indexes + 1).
fn request_of(transfer: u64) -> usize {
    (transfer - 1) as usize
}

fn set_pages(s: &mut DecodeState, transfer: u64, state: PageState) {
    for p in s.slots.get(&transfer).cloned().unwrap_or_default() {
        let page = &mut s.pages[p];
        if matches!(page.state,
            PageState::Landing(t) | PageState::Readable(t) | PageState::Draining(t) if t == transfer)
        {
            page.state = state;
        }
    }
}

/// The peer ended `transfer` (refused or aborted it): its timers stop, its
/// pages are free at once (prefill writes nothing more), its request ends
/// as `how`, and the next one starts.
fn end(limits: &Limits, s: &mut DecodeState, transfer: u64, how: Req, o: &mut Out<Node>) {
    o.cancel_timer(Timer::Deadline(transfer));
    o.cancel_timer(Timer::AckTimeout(transfer));
    set_pages(s, transfer, PageState::Free);
    s.requests[request_of(transfer)] = how;
    start_next(limits, s, o);
}

/// This side aborts `transfer`: tell prefill, keep the pages until it
/// acknowledges (or free them at once, as the mutant does).
fn abort(mutants: Mutants, s: &mut DecodeState, transfer: u64, o: &mut Out<Node>) {
    let i = request_of(transfer);
    s.requests[i] = Req::Failed;
    o.cancel_timer(Timer::Deadline(transfer));
    o.send(
        prefill_id(),
        Msg::Abort {
            epoch: s.epoch,
            transfer,
        },
    );
    if mutants.release_before_ack {
        set_pages(s, transfer, PageState::Free);
    } else {
        set_pages(s, transfer, PageState::Draining(transfer));
    }
    o.set_timer(Timer::AckTimeout(transfer), model_timeout());
}

// Frames are handed over as the network and the backlog give them: by value.
#[allow(clippy::needless_pass_by_value)]
fn decode_msg(limits: &Limits, mutants: Mutants, s: &mut DecodeState, msg: Msg, o: &mut Out<Node>) {
    match msg {
        Msg::Page {
            transfer,
            slot,
            generation,
            checksum,
            mac,
            payload,
            ..
        } => {
            let h = PageHeader {
                transfer: TransferId::new(transfer),
                slot,
                generation: Generation::from_wire(generation),
                checksum,
                mac,
            };
            match s.ledger.landing_slot(&h, PAGE_BYTES) {
                Some(index) => {
                    let page = s.slots[&transfer][index];
                    s.writing = Some(Writing {
                        page,
                        transfer,
                        header: (slot, generation, checksum, mac),
                        payload,
                    });
                    o.set_timer(Timer::PayloadDone, model_timeout());
                }
                // Read into scratch memory; the ledger rules on it.
                None => {
                    let verdict = s.ledger.on_page(&h, &payload);
                    page_verdict(limits, mutants, s, verdict, o);
                }
            }
        }
        Msg::Done {
            transfer,
            tokens,
            digest,
            mac,
            ..
        } => {
            let d = Done {
                transfer: TransferId::new(transfer),
                tokens,
                digest,
                logits: Vec::new(),
                mac,
            };
            match s.ledger.on_done(&d) {
                DoneVerdict::Commit(_) => {
                    o.cancel_timer(Timer::Deadline(transfer));
                    set_pages(s, transfer, PageState::Readable(transfer));
                    let i = request_of(transfer);
                    s.requests[i] = Req::Decoding(transfer);
                    o.send(
                        prefill_id(),
                        Msg::Release {
                            epoch: s.epoch,
                            transfer,
                        },
                    );
                    o.set_timer(Timer::Finish(transfer), model_timeout());
                }
                DoneVerdict::Fail(t, _) => {
                    if s.ledger.abort(t) {
                        abort(mutants, s, t.get(), o);
                    }
                }
                DoneVerdict::Dropped => {}
            }
        }
        Msg::Rejected { transfer, .. } => {
            if s.ledger.on_rejected(TransferId::new(transfer)) {
                end(limits, s, transfer, Req::Refused, o);
            }
        }
        Msg::Abort { transfer, .. } => {
            if s.ledger.on_peer_abort(TransferId::new(transfer)) {
                o.send(
                    prefill_id(),
                    Msg::AbortAck {
                        epoch: s.epoch,
                        transfer,
                    },
                );
                end(limits, s, transfer, Req::Failed, o);
            }
        }
        Msg::AbortAck { transfer, .. } => {
            if s.ledger.on_abort_ack(TransferId::new(transfer)) {
                *s.acks.entry(transfer).or_default() += 1;
                o.cancel_timer(Timer::AckTimeout(transfer));
                set_pages(s, transfer, PageState::Free);
                start_next(limits, s, o);
            }
        }
        Msg::Prefill { .. } | Msg::Release { .. } => {}
    }
}

fn page_verdict(
    limits: &Limits,
    mutants: Mutants,
    s: &mut DecodeState,
    verdict: PageVerdict,
    o: &mut Out<Node>,
) {
    match verdict {
        PageVerdict::Write { transfer, slot, .. } => {
            if let Some(v) = s.verified.get_mut(&transfer.get()) {
                v[slot] = true;
            }
        }
        PageVerdict::Fail(t, _) => {
            if s.ledger.abort(t) {
                abort(mutants, s, t.get(), o);
            }
        }
        PageVerdict::Dropped => {}
    }
    let _ = limits;
}

/// The receiver is gone: every open transfer ends and its pages go back
/// (no write can arrive any more); a new connection starts.
fn lose_connection(limits: &Limits, s: &mut DecodeState, o: &mut Out<Node>) {
    s.epoch += 1;
    s.writing = None;
    s.backlog.clear();
    o.cancel_timer(Timer::PayloadDone);
    for t in s.ledger.connection_lost() {
        let t = t.get();
        o.cancel_timer(Timer::Deadline(t));
        o.cancel_timer(Timer::AckTimeout(t));
        set_pages(s, t, PageState::Free);
        let i = request_of(t);
        if matches!(s.requests[i], Req::Transferring(_)) {
            s.requests[i] = Req::Failed;
        }
    }
    // Pages kept for acknowledgements that can no longer come.
    for page in &mut s.pages {
        if matches!(page.state, PageState::Draining(_)) {
            page.state = PageState::Free;
        }
    }
    start_next(limits, s, o);
}

fn decode_timer(
    limits: &Limits,
    mutants: Mutants,
    s: &mut DecodeState,
    timer: &Timer,
    o: &mut Out<Node>,
) {
    match *timer {
        Timer::Deadline(t) => {
            if s.ledger.expire(TransferId::new(t)) {
                abort(mutants, s, t, o);
            }
        }
        Timer::PayloadDone => {
            let Some(w) = s.writing.take() else { return };
            s.pages[w.page].bytes = w.payload;
            let (slot, generation, checksum, mac) = w.header;
            let h = PageHeader {
                transfer: TransferId::new(w.transfer),
                slot,
                generation: Generation::from_wire(generation),
                checksum,
                mac,
            };
            let verdict = s.ledger.on_page(&h, &w.payload);
            page_verdict(limits, mutants, s, verdict, o);
            while s.writing.is_none() && !s.backlog.is_empty() {
                let next = s.backlog.remove(0);
                decode_msg(limits, mutants, s, next, o);
            }
        }
        Timer::AckTimeout(t) => {
            if s.pages.iter().any(|p| p.state == PageState::Draining(t)) {
                lose_connection(limits, s, o);
            }
        }
        Timer::ConnectionLost => {
            if !s.lost {
                s.lost = true;
                lose_connection(limits, s, o);
            }
        }
        Timer::Finish(t) => {
            set_pages(s, t, PageState::Free);
            let i = request_of(t);
            s.requests[i] = Req::Served;
            start_next(limits, s, o);
        }
        Timer::Send(_) | Timer::PrefillAbort(_) => {}
    }
}

fn free_job(s: &mut PrefillState, transfer: u64) {
    if let Some(job) = s.jobs.remove(&transfer) {
        for p in job.pages {
            s.pages[p] = None;
        }
    }
}

fn prefill_msg(
    limits: &Limits,
    mutants: Mutants,
    s: &mut PrefillState,
    msg: Msg,
    o: &mut Out<Node>,
) {
    let epoch = msg.epoch();
    if epoch < s.epoch {
        return; // from a connection that is gone
    }
    if epoch > s.epoch {
        // A new connection: the old one is gone, and its jobs with it.
        s.epoch = epoch;
        let old: Vec<u64> = s.jobs.keys().copied().collect();
        for t in old {
            free_job(s, t);
        }
    }
    match msg {
        Msg::Prefill {
            transfer,
            tokens,
            generations,
            key,
            ..
        } => {
            if !s.seen.insert(transfer) {
                return;
            }
            let computed = match limits.admit(TenantId::new(TENANT), tokens as usize, 1, ()) {
                Ok(_) => tokens as usize,
                Err(AdmissionError::EmptyPrompt | AdmissionError::NoOutputTokens) => {
                    unreachable!("the model's prompts are not empty")
                }
                // The incident: the prompt is swapped for a placeholder.
                Err(_) if mutants.placeholder => 1,
                Err(_) => {
                    o.send(decode_id(), Msg::Rejected { epoch, transfer });
                    return;
                }
            };
            let free: Vec<usize> = (0..s.pages.len())
                .filter(|p| s.pages[*p].is_none())
                .take(pages_for(computed))
                .collect();
            if free.len() < pages_for(computed) {
                // Busy: the real worker queues; here it refuses.
                o.send(decode_id(), Msg::Rejected { epoch, transfer });
                return;
            }
            for p in &free {
                s.pages[*p] = Some(transfer);
                s.bytes[*p] = bytes_of(transfer);
            }
            s.jobs.insert(
                transfer,
                Job {
                    epoch,
                    tokens,
                    generations,
                    key,
                    pages: free,
                    sums: Vec::new(),
                    state: JobState::Sending { sent: 0 },
                },
            );
            o.set_timer(Timer::Send(transfer), model_timeout());
            o.set_timer(Timer::PrefillAbort(transfer), model_timeout());
        }
        Msg::Release { transfer, .. } => {
            if s.jobs
                .get(&transfer)
                .is_some_and(|j| j.state == JobState::AwaitingRelease)
            {
                free_job(s, transfer);
            }
        }
        Msg::Abort { transfer, .. } => {
            // Acknowledge once: the last frame for it was written before.
            if s.jobs.contains_key(&transfer) && !s.acks_sent.contains_key(&transfer) {
                *s.acks_sent.entry(transfer).or_default() += 1;
                o.send(decode_id(), Msg::AbortAck { epoch, transfer });
                o.cancel_timer(Timer::Send(transfer));
                o.cancel_timer(Timer::PrefillAbort(transfer));
                free_job(s, transfer);
            }
        }
        Msg::AbortAck { transfer, .. } => {
            if s.jobs
                .get(&transfer)
                .is_some_and(|j| j.state == JobState::Aborting)
            {
                free_job(s, transfer);
            }
        }
        Msg::Rejected { .. } | Msg::Page { .. } | Msg::Done { .. } => {}
    }
}

fn prefill_timer(s: &mut PrefillState, timer: &Timer, o: &mut Out<Node>) {
    match *timer {
        Timer::Send(t) => {
            let Some(job) = s.jobs.get(&t) else { return };
            let JobState::Sending { sent } = job.state else {
                return;
            };
            let epoch = job.epoch;
            let key = FrameKey::from_bytes(&job.key);
            if sent < job.generations.len() {
                let grant = Grant::new(
                    TransferId::new(t),
                    job.generations
                        .iter()
                        .map(|g| Generation::from_wire(*g))
                        .collect(),
                    key.clone(),
                );
                // What the worker computed, or (past it, for the
                // placeholder) whatever its memory held.
                let payload = job.pages.get(sent).map_or(STALE, |p| s.bytes[*p]);
                let Some(slot) = grant.slot(sent) else { return };
                let h = slot.header(Checksums::On, &payload, &key);
                o.send(
                    decode_id(),
                    Msg::Page {
                        epoch,
                        transfer: t,
                        slot: h.slot,
                        generation: h.generation.get(),
                        checksum: h.checksum,
                        mac: h.mac,
                        payload,
                    },
                );
                let job = s.jobs.get_mut(&t).expect("the job");
                job.sums.push((h.generation.get(), h.checksum));
                job.state = JobState::Sending { sent: sent + 1 };
                o.set_timer(Timer::Send(t), model_timeout());
            } else {
                let sums: Vec<(Generation, u64)> = job
                    .sums
                    .iter()
                    .map(|(g, c)| (Generation::from_wire(*g), *c))
                    .collect();
                let digest = transfer_digest(&sums, job.tokens, &[]);
                let mac = key.done_tag(job.tokens, digest);
                o.send(
                    decode_id(),
                    Msg::Done {
                        epoch,
                        transfer: t,
                        tokens: job.tokens,
                        digest,
                        mac,
                    },
                );
                o.cancel_timer(Timer::PrefillAbort(t));
                s.jobs.get_mut(&t).expect("the job").state = JobState::AwaitingRelease;
            }
        }
        Timer::PrefillAbort(t) => {
            if let Some(job) = s.jobs.get_mut(&t)
                && matches!(job.state, JobState::Sending { .. })
            {
                job.state = JobState::Aborting;
                let epoch = job.epoch;
                o.cancel_timer(Timer::Send(t));
                o.send(decode_id(), Msg::Abort { epoch, transfer: t });
            }
        }
        _ => {}
    }
}

fn decode(state: &stateright::actor::ActorModelState<Node>) -> &DecodeState {
    match &*state.actor_states[0] {
        State::Decode(d) => d,
        State::Prefill(_) => unreachable!("actor 0 is decode"),
    }
}

fn prefill(state: &stateright::actor::ActorModelState<Node>) -> &PrefillState {
    match &*state.actor_states[1] {
        State::Prefill(p) => p,
        State::Decode(_) => unreachable!("actor 1 is prefill"),
    }
}

const ONLY_VERIFIED: &str = "a readable page's transfer had every frame verified";
const ONLY_OWN_BYTES: &str = "a readable page holds only its own request's bytes";
const NO_WRITE_AFTER_FREE: &str = "no page is freed or reused while a write to it is in flight";
const ONE_ACK: &str = "an abort is acknowledged at most once";
const QUIET_IS_FREE: &str = "once nothing is pending, every page is free";
const SERVED: &str = "a request is served";
const ACKED: &str = "an abort is acknowledged";

fn model(mutants: Mutants) -> ActorModel<Node> {
    ActorModel::new((), ())
        .actor(Node::Decode {
            limits: limits(DECODE_PAGES),
            mutants,
        })
        .actor(Node::Prefill {
            limits: limits(PREFILL_PAGES),
            mutants,
        })
        .init_network(Network::new_unordered_duplicating([]))
        .lossy_network(LossyNetwork::Yes)
        .max_crashes(1)
        .property(Expectation::Always, ONLY_VERIFIED, |_, state| {
            let d = decode(state);
            d.pages.iter().all(|p| match p.state {
                PageState::Readable(t) => d.verified.get(&t).is_some_and(|v| v.iter().all(|x| *x)),
                _ => true,
            })
        })
        .property(Expectation::Always, ONLY_OWN_BYTES, |_, state| {
            decode(state).pages.iter().all(|p| match p.state {
                PageState::Readable(t) => p.bytes == bytes_of(t),
                _ => true,
            })
        })
        .property(Expectation::Always, NO_WRITE_AFTER_FREE, |_, state| {
            let d = decode(state);
            d.writing.as_ref().is_none_or(|w| {
                matches!(d.pages[w.page].state,
                    PageState::Landing(t) | PageState::Draining(t) if t == w.transfer)
            })
        })
        .property(Expectation::Always, ONE_ACK, |_, state| {
            decode(state).acks.values().all(|n| *n <= 1)
                && prefill(state).acks_sent.values().all(|n| *n <= 1)
        })
        .property(Expectation::Always, QUIET_IS_FREE, |_, state| {
            // A crashed decode worker's pool went with its process.
            if state.crashed[0] {
                return true;
            }
            let d = decode(state);
            let quiet = state.timers_set[0].iter().next().is_none()
                && d.writing.is_none()
                && d.requests
                    .iter()
                    .all(|r| matches!(r, Req::Served | Req::Failed | Req::Refused));
            !quiet || d.pages.iter().all(|p| p.state == PageState::Free)
        })
        .property(Expectation::Sometimes, SERVED, |_, state| {
            decode(state).requests.contains(&Req::Served)
        })
        .property(Expectation::Sometimes, ACKED, |_, state| {
            decode(state).acks.values().any(|n| *n == 1)
        })
}

/// Breadth-first to `depth`, stopping early once `until` (if any) has a
/// discovery; returns the checker.
fn check(
    mutants: Mutants,
    depth: usize,
    until: Option<&'static str>,
) -> impl Checker<ActorModel<Node>> {
    let mut c = model(mutants).checker().threads(2).target_max_depth(depth);
    if let Some(p) = until {
        c = c.finish_when(HasDiscoveries::AnyOf([p].into_iter().collect()));
    }
    c.spawn_bfs().join()
}

/// How deep the check of the protocol as built goes
/// (`BULKHEAD_MODEL_DEPTH`; 11 in the suite, about a minute here).
fn depth() -> usize {
    std::env::var("BULKHEAD_MODEL_DEPTH")
        .ok()
        .and_then(|d| d.parse().ok())
        .unwrap_or(11)
}

/// Deep enough for every mutant's shortest counterexample (9 steps).
const MUTANT_DEPTH: usize = 12;

#[test]
fn the_protocol_as_built_holds_every_property() {
    let c = check(Mutants::default(), depth(), None);
    eprintln!(
        "protocol model: {} states ({} unique) to depth {}",
        c.state_count(),
        c.unique_state_count(),
        c.max_depth()
    );
    c.assert_properties();
}

#[test]
fn each_mutant_gives_a_counterexample() {
    let cases = [
        (
            Mutants {
                placeholder: true,
                ..Mutants::default()
            },
            ONLY_OWN_BYTES,
        ),
        (
            Mutants {
                release_before_ack: true,
                ..Mutants::default()
            },
            NO_WRITE_AFTER_FREE,
        ),
        (
            Mutants {
                commit_with_missing_frame: true,
                ..Mutants::default()
            },
            ONLY_VERIFIED,
        ),
    ];
    for (mutants, property) in cases {
        let c = check(mutants, MUTANT_DEPTH, Some(property));
        let path = c.discovery(property);
        assert!(
            path.is_some(),
            "{mutants:?}: no counterexample to \"{property}\" in {} states",
            c.unique_state_count()
        );
        eprintln!(
            "{mutants:?}: counterexample to \"{property}\" in {} steps ({} states)",
            path.map_or(0, |p| p.into_actions().len()),
            c.unique_state_count()
        );
    }
}
