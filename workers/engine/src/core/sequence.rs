//! A running sequence's own state changes: whether it decodes or still
//! prefills, what resuming it needs, finishing and failing it, lending a
//! prefill's pages, and accepting a sampled token.

use super::*;
use crate::detok::Piece;

impl Sequence {
    /// Its prompt moved on to `computed`: its handle's progress says so,
    /// and its share of the prefill queue is what its prompt still costs
    /// (none once the prompt is computed).
    pub(super) fn note_computed(&mut self, speed: &crate::speed::PrefillSpeed) {
        if let Some(p) = &self.progress {
            p.advance(self.computed.min(self.prompt_len));
        }
        if self.computed >= self.prompt_len {
            self.charge = None;
        } else if let Some(c) = &mut self.charge {
            c.pay_down_to(crate::queue::remaining_us(
                speed,
                self.prompt_len,
                self.computed,
            ));
        }
    }

    /// Whether its next token is computed alone, as a decode step: its
    /// prompt is in the pages. A resumed sequence replays the tokens it had
    /// generated this way, one a step, so its pages hold exactly what they
    /// held before it was preempted and it goes on with the same tokens.
    pub(super) fn decoding(&self) -> bool {
        self.computed >= self.prompt_len && self.computed < self.tokens.len()
    }

    /// Whether it may be preempted: a generating sequence not landing a
    /// transfer (a prefill job holds only its prompt and hands it over).
    pub(super) fn preemptable(&self) -> bool {
        !self.done && matches!(self.role, Role::Generate(Generator { landing: None, .. }))
    }

    /// Pages a preempted sequence takes to resume: what it had and a first
    /// slice of what it may still generate.
    pub(super) fn pages_to_resume(&self, slice: usize, page_size: usize) -> usize {
        let left = match &self.role {
            Role::Generate(g) => g
                .max_tokens
                .saturating_sub(self.tokens.len() - self.prompt_len),
            Role::Prefill { .. } => 0,
        };
        (self.tokens.len() + slice.min(left)).div_ceil(page_size)
    }

    /// The refusal of a sequence that can no longer fit a pool of `limit` tokens.
    pub(super) fn never_fits(&self, limit: usize) -> EngineError {
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
    pub(super) fn runnable(&self) -> bool {
        !matches!(
            self.role,
            Role::Generate(Generator {
                landing: Some(_),
                ..
            })
        )
    }

    pub(super) fn finish(&mut self, reason: FinishReason) {
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
        self.charge = None;
    }

    pub(super) fn fail(&mut self, error: EngineError) {
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
        self.charge = None;
    }

    /// Prefill role, once the whole prompt is computed: lends every prompt
    /// page to the sender, in slot order (the logits follow).
    pub(super) fn lend_pages(&mut self, pool: &mut KvPool, home: Option<&Home>) {
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
    pub(super) fn accept(&mut self, logits: &mut [f32], tokenizer: &crate::Tokenizer) {
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
