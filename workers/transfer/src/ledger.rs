//! The decode side's record of its transfers: what each may write, what
//! has arrived, and which ids are finished (tombstones).
//!
//! The ledger decides; its caller acts. A page is accepted only if its
//! transfer is live, its slot granted, its generation the granted one, its
//! slot not yet written and its tag right (in a benchmark without tags,
//! its CRC). A transfer commits only if
//! every slot arrived, the token count is the granted one and the digest
//! matches. Anything else fails the transfer; the caller then aborts it
//! and keeps the landing pages until the sender acknowledges (deferred
//! release). Frames for finished ids are dropped and counted.

use crate::checksum::{Checksums, page_crc, transfer_digest};
use crate::mac::{FrameKey, LandedTag, PageTagger, tag_checksum, tags_equal};
use crate::wire::{Done, PageHeader};
use bulkhead_kv::{Generation, TransferId};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// How many finished ids are remembered.
const TOMBSTONES: usize = 65_536;

/// Why a transfer failed (mirrors what the client is told).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Payload CRC mismatch (only in a benchmark without tags).
    Checksum,
    /// A page or the end whose tag is not the transfer key's: corrupted, or
    /// a frame the prefill worker did not send.
    Tag,
    /// Slot, generation or length not granted.
    Slot,
    /// A slot arrived twice.
    Duplicate,
    /// Missing pages, wrong token count or wrong digest.
    Incomplete,
}

/// What to do with a page frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageVerdict {
    /// Verified: write it into the slot.
    Write {
        /// The transfer.
        transfer: TransferId,
        /// The slot.
        slot: usize,
        /// Its generation.
        generation: Generation,
    },
    /// Not for a live transfer (finished, aborting or unknown): dropped.
    Dropped,
    /// The transfer fails.
    Fail(TransferId, Fault),
}

/// What to do with a `Done` frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoneVerdict {
    /// Everything checks: make the pages readable and acknowledge.
    Commit(TransferId),
    /// Not for a live transfer: dropped.
    Dropped,
    /// The transfer fails.
    Fail(TransferId, Fault),
}

/// Transfer counters of one decode worker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct TransferCounters {
    /// Transfers opened.
    pub started: u64,
    /// Transfers verified and committed.
    pub committed: u64,
    /// Transfers refused by the prefill worker's admission.
    pub rejected: u64,
    /// Transfers failed by a check.
    pub failed: u64,
    /// Page CRC mismatches (only in a benchmark without tags).
    pub checksum_mismatches: u64,
    /// Frames (pages or ends) with a wrong tag: corrupted or forged.
    #[doc(alias = "mac")]
    pub tag_mismatches: u64,
    /// Frames naming a slot, generation or length not granted.
    pub slot_mismatches: u64,
    /// Slots that arrived twice.
    pub duplicate_pages: u64,
    /// Transfers short of pages or tokens, or with a wrong digest.
    pub incomplete: u64,
    /// Frames for finished, aborting or unknown transfers, dropped.
    pub dropped_frames: u64,
    /// Aborts this side sent.
    pub aborts_sent: u64,
    /// Aborts the peer sent.
    pub aborts_received: u64,
    /// Abort acknowledgements this side sent.
    pub acks_sent: u64,
    /// Abort acknowledgements received.
    pub acks_received: u64,
    /// Transfers that passed their deadline.
    pub timeouts: u64,
    /// Transfers cut off by a lost connection.
    pub connection_losses: u64,
    /// Page frames that passed every check and were written.
    pub pages_received: u64,
}

impl std::ops::Add for TransferCounters {
    type Output = TransferCounters;

    fn add(self, o: TransferCounters) -> TransferCounters {
        TransferCounters {
            started: self.started + o.started,
            committed: self.committed + o.committed,
            rejected: self.rejected + o.rejected,
            failed: self.failed + o.failed,
            checksum_mismatches: self.checksum_mismatches + o.checksum_mismatches,
            tag_mismatches: self.tag_mismatches + o.tag_mismatches,
            slot_mismatches: self.slot_mismatches + o.slot_mismatches,
            duplicate_pages: self.duplicate_pages + o.duplicate_pages,
            incomplete: self.incomplete + o.incomplete,
            dropped_frames: self.dropped_frames + o.dropped_frames,
            aborts_sent: self.aborts_sent + o.aborts_sent,
            aborts_received: self.aborts_received + o.aborts_received,
            acks_sent: self.acks_sent + o.acks_sent,
            acks_received: self.acks_received + o.acks_received,
            timeouts: self.timeouts + o.timeouts,
            connection_losses: self.connection_losses + o.connection_losses,
            pages_received: self.pages_received + o.pages_received,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum State {
    Live,
    /// This side sent an abort; frames are dropped until the ack.
    Aborting,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Expectation {
    key: FrameKey,
    generations: Vec<Generation>,
    received: Vec<Option<u64>>,
    tokens: u64,
    page_bytes: usize,
    state: State,
}

/// The decode side's transfers on one connection. Comparable and hashable
/// so that a model checker can drive it (`tests/protocol_model.rs`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Ledger {
    checksums: Checksums,
    live: BTreeMap<TransferId, Expectation>,
    tombstones: BTreeSet<TransferId>,
    order: VecDeque<TransferId>,
    counters: TransferCounters,
    /// A planted mutant: commit without every frame (tests only).
    commit_with_missing_frame: bool,
}

impl Ledger {
    /// An empty ledger.
    pub fn new(checksums: Checksums) -> Self {
        Ledger {
            checksums,
            live: BTreeMap::new(),
            tombstones: BTreeSet::new(),
            order: VecDeque::new(),
            counters: TransferCounters::default(),
            commit_with_missing_frame: false,
        }
    }

    /// Plants a mutant the model checker must catch: `Done` commits a
    /// transfer on its token count alone, frames missing or not. Exists
    /// only in test builds.
    #[cfg(feature = "test-hooks")]
    pub fn plant_mutant_commit_with_missing_frame(&mut self) {
        self.commit_with_missing_frame = true;
    }

    /// Counters so far.
    pub fn counters(&self) -> TransferCounters {
        self.counters
    }

    /// Opens a transfer into `generations.len()` slots for `tokens` prompt
    /// tokens of `page_bytes` each, tagged under `key`. Refused for an id
    /// already used.
    pub fn open_transfer(
        &mut self,
        transfer: TransferId,
        generations: Vec<Generation>,
        tokens: u64,
        page_bytes: usize,
        key: FrameKey,
    ) -> bool {
        if self.live.contains_key(&transfer) || self.tombstones.contains(&transfer) {
            return false;
        }
        self.counters.started += 1;
        let received = vec![None; generations.len()];
        self.live.insert(
            transfer,
            Expectation {
                key,
                generations,
                received,
                tokens,
                page_bytes,
                state: State::Live,
            },
        );
        true
    }

    /// Where a page frame with header `h` and `len` payload bytes may be read
    /// to: its landing slot, if the transfer is live and the slot granted at
    /// that generation and length and not yet written. Otherwise the payload
    /// goes to scratch memory and [`Ledger::on_page`] rules on it.
    pub fn landing_slot(&self, h: &PageHeader, len: usize) -> Option<usize> {
        let e = self.live.get(&h.transfer)?;
        let slot = h.slot as usize;
        (matches!(e.state, State::Live)
            && slot < e.generations.len()
            && e.generations[slot] == h.generation
            && len == e.page_bytes
            && e.received[slot].is_none())
        .then_some(slot)
    }

    /// A tagger for the payload of page frame `h` under its transfer's
    /// key, to feed as the bytes land and hand to [`Ledger::on_landed_page`];
    /// none where frames carry no tags or the transfer is not live.
    pub fn page_tagger(&self, h: &PageHeader) -> Option<PageTagger<'_>> {
        let e = self.live.get(&h.transfer)?;
        (self.checksums.tags() && matches!(e.state, State::Live))
            .then(|| e.key.page_tagger(h.slot, h.generation))
    }

    /// Checks one page frame.
    pub fn on_page(&mut self, h: &PageHeader, payload: &[u8]) -> PageVerdict {
        self.on_landed_page(h, payload, None)
    }

    /// Checks one page frame whose payload was tagged as it landed
    /// (`landed`, from [`Ledger::page_tagger`]): the same checks as
    /// [`Ledger::on_page`], the tag taken from `landed` where it covers
    /// exactly this frame's slot, generation and bytes (else computed
    /// again from the payload).
    pub fn on_landed_page(
        &mut self,
        h: &PageHeader,
        payload: &[u8],
        landed: Option<LandedTag>,
    ) -> PageVerdict {
        // A finished or aborting transfer's page is late.
        let live = self.live.get_mut(&h.transfer);
        let Some(e) = live.filter(|e| matches!(e.state, State::Live)) else {
            self.counters.dropped_frames += 1;
            return PageVerdict::Dropped;
        };
        let slot = h.slot as usize;
        let fault = if slot >= e.generations.len()
            || e.generations[slot] != h.generation
            || payload.len() != e.page_bytes
        {
            self.counters.slot_mismatches += 1;
            Fault::Slot
        } else if e.received[slot].is_some() {
            self.counters.duplicate_pages += 1;
            Fault::Duplicate
        } else if let Some(fault) = integrity_fault(
            self.checksums,
            &mut self.counters,
            (&e.key, landed),
            h,
            payload,
        ) {
            fault
        } else {
            e.received[slot] = Some(h.checksum);
            self.counters.pages_received += 1;
            return PageVerdict::Write {
                transfer: h.transfer,
                slot,
                generation: h.generation,
            };
        };
        PageVerdict::Fail(h.transfer, fault)
    }

    /// Checks the end of a transfer: every slot, the token count, the digest.
    pub fn on_done(&mut self, d: &Done) -> DoneVerdict {
        // A finished or aborting transfer's end is late.
        let Some(e) = self
            .live
            .get(&d.transfer)
            .filter(|e| matches!(e.state, State::Live))
        else {
            self.counters.dropped_frames += 1;
            return DoneVerdict::Dropped;
        };
        let pages: Option<Vec<(Generation, u64)>> = e
            .generations
            .iter()
            .zip(&e.received)
            .map(|(g, c)| c.map(|c| (*g, c)))
            .collect();
        let ok = pages.is_some_and(|pages| {
            d.tokens == e.tokens && transfer_digest(&pages, d.tokens, &d.logits) == d.digest
        }) || (self.commit_with_missing_frame && d.tokens == e.tokens);
        if ok && self.checksums.tags() && !tags_equal(&e.key.done_tag(d.tokens, d.digest), &d.mac) {
            self.counters.tag_mismatches += 1;
            return DoneVerdict::Fail(d.transfer, Fault::Tag);
        }
        if !ok {
            self.counters.incomplete += 1;
            return DoneVerdict::Fail(d.transfer, Fault::Incomplete);
        }
        self.counters.committed += 1;
        self.bury(d.transfer);
        DoneVerdict::Commit(d.transfer)
    }

    /// This side aborts `transfer` (a failed check or a deadline). Returns
    /// whether an abort must be sent (it was live).
    pub fn abort(&mut self, transfer: TransferId) -> bool {
        match self.live.get_mut(&transfer) {
            Some(e) if matches!(e.state, State::Live) => {
                e.state = State::Aborting;
                self.counters.failed += 1;
                self.counters.aborts_sent += 1;
                true
            }
            _ => false,
        }
    }

    /// The peer acknowledged our abort: no write for it can follow. Returns
    /// whether the landing pages can now be released.
    pub fn on_abort_ack(&mut self, transfer: TransferId) -> bool {
        let aborting =
            matches!(self.live.get(&transfer), Some(e) if matches!(e.state, State::Aborting));
        self.end_if(transfer, aborting, |c| c.acks_received += 1)
    }

    /// The peer aborted `transfer`. Returns whether to acknowledge (exactly
    /// once) and release: the peer wrote its last frame for it before this.
    pub fn on_peer_abort(&mut self, transfer: TransferId) -> bool {
        let live = self.live.contains_key(&transfer);
        self.end_if(transfer, live, |c| {
            c.aborts_received += 1;
            c.acks_sent += 1;
        })
    }

    /// The peer refused the request at admission; nothing was written.
    pub fn on_rejected(&mut self, transfer: TransferId) -> bool {
        // Also when we were aborting it: prefill wrote nothing and will not.
        let live = self.live.contains_key(&transfer);
        self.end_if(transfer, live, |c| c.rejected += 1)
    }

    /// This side gave up on `transfer` (its deadline passed) and already
    /// told the peer: frames for it are dropped from now on. Returns whether
    /// it was live.
    pub fn expire(&mut self, transfer: TransferId) -> bool {
        let live = self.abort(transfer);
        if live {
            self.counters.timeouts += 1;
        }
        live
    }

    /// The connection is gone: no write can arrive. Every open transfer
    /// ends; returns them, each to be failed and released.
    pub fn connection_lost(&mut self) -> Vec<TransferId> {
        let ids: Vec<TransferId> = self.live.keys().copied().collect();
        for t in &ids {
            self.counters.connection_losses += 1;
            self.bury(*t);
        }
        ids
    }

    /// When `ends` holds, counts the ending and buries `transfer`; else the
    /// frame that would have ended it is dropped. Returns `ends`.
    fn end_if(
        &mut self,
        transfer: TransferId,
        ends: bool,
        count: impl FnOnce(&mut TransferCounters),
    ) -> bool {
        if ends {
            count(&mut self.counters);
            self.bury(transfer);
        } else {
            self.counters.dropped_frames += 1;
        }
        ends
    }

    fn bury(&mut self, transfer: TransferId) {
        self.live.remove(&transfer);
        if self.tombstones.insert(transfer) {
            self.order.push_back(transfer);
            if self.order.len() > TOMBSTONES
                && let Some(old) = self.order.pop_front()
            {
                self.tombstones.remove(&old);
            }
        }
    }
}

/// The fault of a page whose bytes fail the check `checksums` selects,
/// counted.
fn integrity_fault(
    checksums: Checksums,
    counters: &mut TransferCounters,
    (key, landed): (&FrameKey, Option<LandedTag>),
    h: &PageHeader,
    payload: &[u8],
) -> Option<Fault> {
    match checksums {
        Checksums::On => {
            let tag = match landed {
                Some(l)
                    if l.slot == h.slot
                        && l.generation == h.generation
                        && l.len == payload.len() as u64 =>
                {
                    l.tag
                }
                _ => key.page_tag(h.slot, h.generation, payload),
            };
            if tags_equal(&tag, &h.mac) && tag_checksum(&tag) == h.checksum {
                return None;
            }
            counters.tag_mismatches += 1;
            Some(Fault::Tag)
        }
        Checksums::CrcOnlyForBenchmark if page_crc(payload) != h.checksum => {
            counters.checksum_mismatches += 1;
            Some(Fault::Checksum)
        }
        Checksums::CrcOnlyForBenchmark | Checksums::OffForBenchmark => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key of every transfer in these tests.
    fn key() -> FrameKey {
        FrameKey::from_bytes(&[9; crate::mac::KEY_LEN])
    }

    fn header(t: u64, slot: u32, g: u64, payload: &[u8]) -> PageHeader {
        PageHeader {
            transfer: TransferId::new(t),
            slot,
            generation: Generation::from_wire(g),
            checksum: tag_checksum(&key().page_tag(slot, Generation::from_wire(g), payload)),
            mac: key().page_tag(slot, Generation::from_wire(g), payload),
        }
    }

    fn open(l: &mut Ledger, t: u64) {
        let gens = vec![Generation::from_wire(10), Generation::from_wire(11)];
        assert!(l.open_transfer(TransferId::new(t), gens, 20, 4, key()));
    }

    fn done(t: u64, pages: &[(u64, &[u8])], tokens: u64) -> Done {
        let pages: Vec<_> = pages
            .iter()
            .enumerate()
            .map(|(slot, (g, p))| {
                let g = Generation::from_wire(*g);
                let slot = u32::try_from(slot).expect("a small slot");
                (g, tag_checksum(&key().page_tag(slot, g, p)))
            })
            .collect();
        let digest = transfer_digest(&pages, tokens, &[1.0]);
        Done {
            transfer: TransferId::new(t),
            tokens,
            digest,
            logits: vec![1.0],
            mac: key().done_tag(tokens, digest),
        }
    }

    #[test]
    fn a_frame_with_a_right_crc_but_a_wrong_tag_fails_the_transfer() {
        let mut l = Ledger::new(Checksums::On);
        open(&mut l, 1);
        let (a, b) = ([1u8; 4], [2u8; 4]);
        // A forger rewrites the payload, puts its CRC where the checksum
        // goes and tags it under a key of its own.
        let mut forged = header(1, 0, 10, &a);
        forged.checksum = page_crc(&b);
        let (_, own) = FrameKey::generate();
        forged.mac = own.page_tag(0, Generation::from_wire(10), &b);
        assert_eq!(
            l.on_page(&forged, &b),
            PageVerdict::Fail(TransferId::new(1), Fault::Tag)
        );
        assert_eq!(l.counters().tag_mismatches, 1);
        // The end's tag is checked too.
        open(&mut l, 2);
        for (slot, g, p) in [(0, 10, &a), (1, 11, &b)] {
            assert!(matches!(
                l.on_page(&header(2, slot, g, p), p),
                PageVerdict::Write { .. }
            ));
        }
        let mut d = done(2, &[(10, &a), (11, &b)], 20);
        d.mac[0] ^= 1;
        assert_eq!(
            l.on_done(&d),
            DoneVerdict::Fail(TransferId::new(2), Fault::Tag)
        );
        assert_eq!(l.counters().tag_mismatches, 2);
    }

    /// A ledger with transfer 1 open, and the tag of frame `h`'s payload
    /// hashed from `fed`, a byte at a time, as if it landed so.
    fn landed(h: &PageHeader, fed: &[u8]) -> (Ledger, LandedTag) {
        let mut l = Ledger::new(Checksums::On);
        open(&mut l, 1);
        let mut t = l.page_tagger(h).expect("a live tagged transfer");
        for b in fed.chunks(1) {
            t.update(b);
        }
        let tag = t.finish();
        (l, tag)
    }

    #[test]
    fn a_tag_hashed_as_the_bytes_landed_is_checked_like_any_other() {
        let b = vec![5u8; 4];
        let h = header(1, 0, 10, &b);
        // Hashed in pieces as they landed: accepted.
        let (mut l, tag) = landed(&h, &b);
        assert!(matches!(
            l.on_landed_page(&h, &b, Some(tag)),
            PageVerdict::Write { slot: 0, .. }
        ));
        // A landed tag over other bytes than the frame's fails it, as a
        // wrong payload would: the landing code cannot vouch for bytes.
        let (mut l, other) = landed(&h, &[6u8; 4]);
        assert_eq!(
            l.on_landed_page(&h, &b, Some(other)),
            PageVerdict::Fail(TransferId::new(1), Fault::Tag)
        );
        assert_eq!(l.counters().tag_mismatches, 1);
        // One that covers fewer bytes than the frame is not used: the
        // payload is hashed again, and a right payload passes.
        let (mut l, short) = landed(&h, &b[..3]);
        assert!(matches!(
            l.on_landed_page(&h, &b, Some(short)),
            PageVerdict::Write { slot: 0, .. }
        ));
        // Nor one made for another slot, or another generation.
        for (slot, g) in [(1, 10), (0, 11)] {
            let (mut l, elsewhere) = landed(&header(1, slot, g, &b), &b);
            assert!(matches!(
                l.on_landed_page(&h, &b, Some(elsewhere)),
                PageVerdict::Write { slot: 0, .. }
            ));
        }
        // No tagger where frames carry no tags.
        let mut l = Ledger::new(Checksums::CrcOnlyForBenchmark);
        open(&mut l, 1);
        assert!(l.page_tagger(&h).is_none());
    }

    #[test]
    fn a_clean_transfer_commits_and_is_tombstoned() {
        let mut l = Ledger::new(Checksums::On);
        open(&mut l, 1);
        let (a, b) = ([1u8; 4], [2u8; 4]);
        assert_eq!(l.landing_slot(&header(1, 1, 11, &b), 4), Some(1));
        assert_eq!(l.landing_slot(&header(1, 1, 12, &b), 4), None);
        assert_eq!(l.landing_slot(&header(1, 1, 11, &b), 3), None);
        assert!(matches!(
            l.on_page(&header(1, 0, 10, &a), &a),
            PageVerdict::Write { slot: 0, .. }
        ));
        assert!(matches!(
            l.on_page(&header(1, 1, 11, &b), &b),
            PageVerdict::Write { slot: 1, .. }
        ));
        let d = done(1, &[(10, &a), (11, &b)], 20);
        assert_eq!(l.on_done(&d), DoneVerdict::Commit(TransferId::new(1)));
        // Duplicate and late frames for a finished id are dropped and counted.
        assert_eq!(l.on_page(&header(1, 1, 11, &b), &b), PageVerdict::Dropped);
        assert_eq!(l.on_done(&d), DoneVerdict::Dropped);
        assert_eq!(l.counters().dropped_frames, 2);
        // The id cannot be opened again.
        assert!(!l.open_transfer(TransferId::new(1), vec![], 0, 4, key()));
    }

    #[test]
    fn every_mismatch_fails_the_transfer() {
        let p = [7u8; 4];
        let cases: Vec<(PageHeader, Vec<u8>, Fault)> = vec![
            (header(1, 0, 10, &p), vec![8u8; 4], Fault::Tag),
            (header(1, 2, 10, &p), p.to_vec(), Fault::Slot),
            (header(1, 0, 99, &p), p.to_vec(), Fault::Slot),
            (header(1, 0, 10, &p[..3]), p[..3].to_vec(), Fault::Slot),
        ];
        for (h, payload, fault) in cases {
            let mut l = Ledger::new(Checksums::On);
            open(&mut l, 1);
            assert_eq!(
                l.on_page(&h, &payload),
                PageVerdict::Fail(TransferId::new(1), fault)
            );
        }
        let mut l = Ledger::new(Checksums::On);
        open(&mut l, 1);
        l.on_page(&header(1, 0, 10, &p), &p);
        assert_eq!(
            l.on_page(&header(1, 0, 10, &p), &p),
            PageVerdict::Fail(TransferId::new(1), Fault::Duplicate)
        );
        // Truncated: one page of two, then Done.
        let mut l = Ledger::new(Checksums::On);
        open(&mut l, 2);
        l.on_page(&header(2, 0, 10, &p), &p);
        assert_eq!(
            l.on_done(&done(2, &[(10, &p)], 20)),
            DoneVerdict::Fail(TransferId::new(2), Fault::Incomplete)
        );
        // All pages but a wrong token count.
        let mut l = Ledger::new(Checksums::On);
        open(&mut l, 3);
        l.on_page(&header(3, 0, 10, &p), &p);
        l.on_page(&header(3, 1, 11, &p), &p);
        assert_eq!(
            l.on_done(&done(3, &[(10, &p), (11, &p)], 19)),
            DoneVerdict::Fail(TransferId::new(3), Fault::Incomplete)
        );
    }

    #[test]
    fn aborts_are_acknowledged_once_and_pages_wait_for_the_ack() {
        let mut l = Ledger::new(Checksums::On);
        open(&mut l, 1);
        assert!(l.abort(TransferId::new(1)));
        assert!(!l.abort(TransferId::new(1)));
        // Writes in flight after our abort are dropped, pages still held.
        let p = [1u8; 4];
        assert_eq!(l.on_page(&header(1, 0, 10, &p), &p), PageVerdict::Dropped);
        assert!(l.on_abort_ack(TransferId::new(1)));
        assert!(!l.on_abort_ack(TransferId::new(1)));

        open(&mut l, 2);
        assert!(l.on_peer_abort(TransferId::new(2)));
        assert!(!l.on_peer_abort(TransferId::new(2)));
        assert_eq!(l.counters().acks_sent, 1);

        open(&mut l, 3);
        assert!(l.expire(TransferId::new(3)));
        assert!(!l.expire(TransferId::new(3)));
        let p = [1u8; 4];
        let h = header(3, 0, 10, &p);
        assert_eq!(l.landing_slot(&h, 4), None);
        open(&mut l, 4);
        let lost = l.connection_lost();
        assert_eq!(lost.len(), 2);
        assert!(l.connection_lost().is_empty());

        // A rejection that crosses our abort ends the transfer: prefill
        // wrote nothing, so no acknowledgement is needed.
        open(&mut l, 5);
        assert!(l.abort(TransferId::new(5)));
        assert!(l.on_rejected(TransferId::new(5)));
        assert!(!l.on_abort_ack(TransferId::new(5)));
    }
}
