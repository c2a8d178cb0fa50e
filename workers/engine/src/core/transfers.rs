//! The core's side of KV transfers: where lent pages come home, and what a
//! landing's commit, failure, refusal or fence does to its sequence and
//! pages, and when a prefill's lent pages are released. A landing's pages
//! are read only after its commit; a failed table waits in `draining`
//! until fenced, so no page goes back while a write may still land.

use super::*;
use crate::error::TransferFault;

impl EngineCore {
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
        if let Some(p) = &seq.progress {
            p.advance(seq.prompt_len);
        }
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

    pub(super) fn landing_index(&self, transfer: TransferId) -> Option<usize> {
        self.running.iter().position(|s| {
            matches!(&s.role, Role::Generate(Generator { landing: Some(l), .. }) if l.transfer == transfer)
        })
    }
}
