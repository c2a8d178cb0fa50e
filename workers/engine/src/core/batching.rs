//! One step of continuous batching: the plan (every decoding sequence's
//! next token, then prefill chunks shared fairly across tenants within the
//! step's budget), the forward pass, and what its output does to each
//! sequence; growing decoding sequences a page at a time, preempting when
//! the pool or a tenant's share says so, and reaping what ended.

use super::*;
use crate::WorkClass;
use crate::schedule::{PrefillWork, tiered_chunks};
use crate::speed::UNIT;

/// A prompt with at most this many tokens left to compute goes before the
/// next decode tokens ([`EngineCore::plan`]).
const SHORT_PROMPT_TOKENS: usize = 64;

impl EngineCore {
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
        // Units of a step that only decoded, to learn what they cost.
        let decode_only = plan
            .iter()
            .all(|&(i, _, len)| len == 1 && self.running[i].decoding())
            .then(|| {
                plan.iter()
                    .map(|&(_, start, _)| self.speed.unit_at(start))
                    .sum::<usize>()
            });
        let started = Instant::now();
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
        if let Some(units) = decode_only {
            self.decode_cost.observe(started.elapsed(), units);
        }

        self.apply(&plan, out);
        self.reap();
        true
    }

    /// This step's work: decode tokens first, then prefill chunks, within a
    /// budget of about `step_time` of compute at the measured speed, shared
    /// fairly across tenants by cost, interactive work before batch work
    /// (`schedule::tiered_chunks`). While an interactive request waits for
    /// its first token ([`EngineCore::interactive_pending`]), batch
    /// sequences neither decode nor compute their prompts: the step that
    /// serves its prompt is no longer than it needs, and a prefill worker
    /// computing it beside this engine has the cores (and a shared step
    /// of batch work only is short: [`EngineCore::step_time_now`]).
    /// Decoding sequences whose tokens together
    /// would take longer than the step (at the cost measured on earlier
    /// steps, [`DecodeCost`]; half the step while prompts wait or tenants
    /// share the engine) decode in
    /// turns, so a request that arrives waits about one step however many
    /// long contexts decode. A short interactive prompt gets a step of its
    /// own (not two in a row), so its first token does not wait for
    /// everyone's next one. Each entry is (sequence, start, length).
    pub(super) fn plan(&mut self, stalled: &[RequestId]) -> Vec<(usize, usize, usize)> {
        let ps = self.pool.geometry().page_size;
        let step_time = self.step_time_now();
        let budget = self
            .speed
            .units_in(step_time)
            .clamp(2 * UNIT as usize, self.step_tokens * UNIT as usize);
        let mut decode_units = 0;
        let mut plan: Vec<(usize, usize, usize)> = Vec::new(); // (seq, start, len)
        let batch_yields = self.interactive_pending();
        // Batch prompts wait too while an interactive request waits for its
        // first token: its prompt may be computing on a prefill worker
        // beside this engine, on the same cores.
        let prefilling: Vec<usize> = (0..self.running.len())
            .filter(|&i| {
                let s = &self.running[i];
                s.runnable()
                    && s.computed < s.prompt_len
                    && !(batch_yields && s.class == WorkClass::Batch)
            })
            .collect();
        let prompts_wait = !prefilling.is_empty();
        // Half the step while prompts wait (they get the other half), and
        // while tenants share the engine: a decode-only step is what a new
        // request most often arrives during, and waits out.
        let decode_time = if prompts_wait || self.sharing() {
            step_time / 2
        } else {
            step_time
        };
        let decode_cap = self.decode_cost.units_in(decode_time);
        // A short interactive prompt goes before everyone's next token, one
        // step in two at most, so decoding never stops.
        let short_first = !self.last_prompt_first
            && prefilling.iter().any(|&i| {
                let s = &self.running[i];
                matches!(s.role, Role::Generate(_))
                    && s.class == WorkClass::Interactive
                    && s.prompt_len - s.computed <= SHORT_PROMPT_TOKENS
            });
        self.last_prompt_first = short_first;
        let n = if short_first { 0 } else { self.running.len() };
        let first = self.decode_turn % n.max(1);
        let mut next_turn = first;
        for i in (first..n).chain(0..first.min(n)) {
            let s = &self.running[i];
            if s.runnable()
                && s.decoding()
                && !(batch_yields && s.class == WorkClass::Batch)
                && plan.len() < self.step_tokens
                && s.table.len() * ps >= s.tokens.len()
                && !stalled.contains(&s.owner.request())
            {
                let unit = self.speed.unit_at(s.computed);
                if !plan.is_empty() && decode_units + unit > decode_cap {
                    // Its turn comes first next step.
                    next_turn = i;
                    break;
                }
                plan.push((i, s.computed, 1));
                decode_units += unit;
            }
        }
        self.decode_turn = next_turn;
        let work: Vec<PrefillWork> = prefilling
            .iter()
            .map(|&i| {
                let s = &self.running[i];
                PrefillWork {
                    tenant: s.owner.tenant(),
                    request: s.owner.request(),
                    remaining: s.prompt_len - s.computed,
                    unit: self.speed.unit_at(s.computed),
                    class: s.class,
                }
            })
            .collect();
        // Decode never takes more than half the step from prompts, and every
        // prompt can always move by two tokens.
        let deepest = work.iter().map(|w| w.unit).max().unwrap_or(0);
        // A short prompt's own step computes all of it.
        let short_units: usize = if short_first {
            work.iter()
                .filter(|w| w.class == WorkClass::Interactive && w.remaining <= SHORT_PROMPT_TOKENS)
                .map(|w| w.remaining * w.unit)
                .sum()
        } else {
            0
        };
        let prefill_budget = budget
            .saturating_sub(decode_units)
            .max(budget / 2)
            .max(2 * deepest)
            .max(short_units);
        // The tenant with prompt work that was served least lately.
        let least = work
            .iter()
            .map(|w| w.tenant)
            .min_by_key(|t| self.served.get(t).copied().unwrap_or(0));
        let chunks = tiered_chunks(
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

    /// Whether any interactive sequence is running (its prompt or its
    /// decode): a shared step without one holds batch work only.
    pub(super) fn interactive_running(&self) -> bool {
        self.running
            .iter()
            .any(|s| s.class == WorkClass::Interactive && !s.done)
    }

    /// Whether a running interactive request has yet to get its first
    /// token: its prompt computing here or landing from a prefill worker.
    /// (One still waiting to join waits for pages, which batch sequences
    /// free only by going on.)
    pub(super) fn interactive_pending(&self) -> bool {
        self.running
            .iter()
            .any(|s| s.class == WorkClass::Interactive && !s.done && s.computed < s.prompt_len)
    }

    /// What a forward pass of `plan` gave: violations quarantined and
    /// failed, progress counted and pages lent, tokens sampled, prefilled
    /// sequences held for their decode side.
    pub(super) fn apply(
        &mut self,
        plan: &[(usize, usize, usize)],
        out: crate::forward::ForwardOutput,
    ) {
        for (b, violation) in out.violations {
            self.pool.quarantine(&violation);
            self.running[plan[b].0].fail(EngineError::Integrity(violation));
        }
        for &(i, _, len) in plan {
            let seq = &mut self.running[i];
            seq.computed += len;
            seq.note_computed(&self.speed);
            if let Role::Prefill { events, .. } = &seq.role
                && !seq.done
                && seq.computed < seq.prompt_len
            {
                let _ = events.send(PrefillEvent::Progress {
                    computed: seq.computed,
                    place: 0,
                });
            }
            seq.lend_pages(&mut self.pool, self.home.as_ref());
        }
        let tokenizer = self.model.tokenizer();
        let vocab = self.model.config.vocab;
        // Sampling is work beyond the model that a request chooses (a
        // grammar, stop strings): its time is charged to the tenant's fair
        // share, as its prompt compute is.
        let mut sampled: Vec<(TenantId, std::time::Duration)> = Vec::new();
        for (b, logits) in out.logits.iter().zip(self.buffers.logits.chunks_mut(vocab)) {
            let seq = &mut self.running[plan[*b].0];
            if !seq.done {
                let start = std::time::Instant::now();
                seq.accept(logits, tokenizer);
                sampled.push((seq.owner.tenant(), start.elapsed()));
            }
        }
        for (tenant, took) in sampled {
            let units = self.speed.units_charged(took);
            if units > 0 {
                *self.served.entry(tenant).or_default() += units;
                self.sampling_units += units as u64;
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

    /// Gives every decoding sequence the page its next token needs. When
    /// none is free, or its tenant holds more than its cap while another
    /// tenant waits, a sequence is preempted: of the tenant holding the
    /// most pages (of this tenant, in the second case), its youngest. Returns
    /// the requests that found no page this step (nothing preemptable).
    pub(super) fn grow_decoding(&mut self) -> Vec<RequestId> {
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
    pub(super) fn preempt_one(&mut self, eligible: impl Fn(TenantId, usize) -> bool) -> bool {
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
    pub(super) fn reap(&mut self) {
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
}

#[cfg(test)]
mod tests;
