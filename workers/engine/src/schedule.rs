//! How one step's prefill budget is shared: fairly across tenants, not by
//! arrival. A tenant with a long prompt gets the same share of a step as a
//! tenant with a short one, so a short prompt starts in the next step
//! instead of waiting for every long prompt ahead of it to finish.
//!
//! Shares are of compute, not of tokens: a token deep in a long prompt
//! attends to every token before it and costs more than one near the
//! start ([`PrefillWork::unit`]), so a tenant's share buys fewer of them.
//!
//! Tenants get equal shares of the step's cost (water-filling, oldest sequence
//! first within a tenant), and the tenant served least lately (decayed every
//! step) first finishes its oldest prompt if the whole step can hold it: a
//! short prompt behind long ones is computed within about one step, and a long
//! prompt progresses by its share. No chunk leaves a one-token remainder
//! (llama.cpp computes a prompt's last token with the others, and the sums must
//! match). Prompt work always moves: when the shares are too small to buy any
//! tenant two tokens (many tenants, a short step measured under load), the
//! whole step goes to the tenant served least lately, so a step is never empty
//! while prompts wait.
//!
//! Work comes in two classes ([`WorkClass`]): batch prompts (OpenAI's
//! `service_tier: "flex"`, batch lines) share only steps that carry no
//! interactive prompt work ([`tiered_chunks`]). Filling an interactive
//! prompt's step with batch work would make that step, and so the prompt's
//! first token, as long as the whole budget; alone, the step is as long as
//! the prompt needs, and batch work moves in the steps between.

use bulkhead_kv::{RequestId, TenantId};

/// Whether a request's prompt work goes first, or after every interactive
/// prompt's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WorkClass {
    /// Served first.
    #[default]
    Interactive,
    /// Served from what interactive work leaves of each step.
    Batch,
}

/// One sequence with prompt tokens still to compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PrefillWork {
    /// Whose it is.
    pub(crate) tenant: TenantId,
    /// Its request (admission order: older ids first within a tenant).
    pub(crate) request: RequestId,
    /// Prompt tokens not yet computed.
    pub(crate) remaining: usize,
    /// What one of its next tokens costs, in budget units (at least 1).
    pub(crate) unit: usize,
    /// Its class.
    pub(crate) class: WorkClass,
}

/// [`fair_chunks`] over the interactive entries while there are any (the
/// batch entries get nothing this step), else over the batch entries.
pub(crate) fn tiered_chunks(
    work: &[PrefillWork],
    budget: usize,
    max_tokens: usize,
    turn: usize,
    first: Option<TenantId>,
) -> Vec<usize> {
    let (interactive, batch): (Vec<usize>, Vec<usize>) =
        (0..work.len()).partition(|&i| work[i].class == WorkClass::Interactive);
    if interactive.is_empty() || batch.is_empty() {
        return fair_chunks(work, budget, max_tokens, turn, first);
    }
    let entries: Vec<PrefillWork> = interactive.iter().map(|&i| work[i]).collect();
    let leader = first.filter(|t| entries.iter().any(|w| w.tenant == *t));
    let mut chunks = vec![0; work.len()];
    for (&i, c) in interactive
        .iter()
        .zip(fair_chunks(&entries, budget, max_tokens, turn, leader))
    {
        chunks[i] = c;
    }
    chunks
}

/// Splits a `budget` (in cost units) among `work` and returns each
/// entry's chunk in tokens (0 for none), about `max_tokens` in all (a
/// prompt's last two tokens may go over it together).
///
/// Tenants take turns: each round, every tenant with work left gets an
/// equal quantum of what is left of the budget (water-filling, so a tenant
/// that needs less leaves the rest to the others), spent on its oldest
/// sequences first, each token at its entry's [`PrefillWork::unit`].
/// `turn` rotates which tenant goes first, so leftovers do not always
/// favour the same one. A chunk of one token is given only to a sequence
/// with one token left (a single-token chunk is summed in another order
/// than a longer one), and no chunk leaves a one-token remainder behind.
pub(crate) fn fair_chunks(
    work: &[PrefillWork],
    budget: usize,
    max_tokens: usize,
    turn: usize,
    first: Option<TenantId>,
) -> Vec<usize> {
    let mut chunks = vec![0; work.len()];
    let (mut budget, mut tokens_left) = (budget, max_tokens);
    // The tenant served least lately finishes its oldest prompt in this
    // step if the whole step can hold it: a short request that arrives
    // behind long ones waits for one step, not for its share of several.
    if let Some(i) = first.and_then(|t| oldest_of(work, t))
        && work[i].remaining * work[i].unit.max(1) <= budget
        && work[i].remaining <= tokens_left
    {
        chunks[i] = work[i].remaining;
        budget -= work[i].remaining * work[i].unit.max(1);
        tokens_left -= work[i].remaining;
    }
    let (tenants, queues) = tenant_queues(work, turn);
    if tenants.is_empty() {
        return chunks;
    }
    water_fill(work, &mut chunks, queues, budget, tokens_left);
    // Shares too small to buy any tenant two tokens (many tenants, a short
    // step): the step goes whole to one tenant, the one served least lately
    // (else the first in turn), so prompt work always moves. An empty plan
    // would leave the engine waiting for an event that may never come.
    if chunks.iter().all(|&c| c == 0)
        && let Some(t) = first
            .filter(|t| tenants.contains(t))
            .or_else(|| tenants.first().copied())
        && let Some(i) = oldest_of(work, t)
    {
        let (remaining, unit) = (work[i].remaining, work[i].unit.max(1));
        let give = whole_remainder((budget / unit).min(remaining).min(tokens_left), remaining);
        if give > 1 || (give == 1 && remaining == 1) {
            chunks[i] = give;
        }
    }
    chunks
}

/// The index of `tenant`'s oldest entry.
fn oldest_of(work: &[PrefillWork], tenant: TenantId) -> Option<usize> {
    (0..work.len())
        .filter(|&i| work[i].tenant == tenant)
        .min_by_key(|&i| work[i].request)
}

/// Tenants in a stable order rotated by `turn`, and each one's entries
/// oldest first.
fn tenant_queues(work: &[PrefillWork], turn: usize) -> (Vec<TenantId>, Vec<Vec<usize>>) {
    let mut tenants: Vec<TenantId> = work.iter().map(|w| w.tenant).collect();
    tenants.sort_unstable();
    tenants.dedup();
    if !tenants.is_empty() {
        let start = turn % tenants.len();
        tenants.rotate_left(start);
    }
    let queues = tenants
        .iter()
        .map(|t| {
            let mut q: Vec<usize> = (0..work.len()).filter(|&i| work[i].tenant == *t).collect();
            q.sort_by_key(|&i| work[i].request);
            q
        })
        .collect();
    (tenants, queues)
}

/// A chunk of `give` tokens that never leaves a one-token remainder of a
/// prompt with `remaining` tokens: one fewer when it can spare one, else
/// the last token too.
fn whole_remainder(give: usize, remaining: usize) -> usize {
    if remaining - give == 1 {
        if give >= 3 { give - 1 } else { remaining }
    } else {
        give
    }
}

/// Rounds of equal quanta of what is left of `budget` to every tenant with
/// work left, each spent on its oldest entries first.
fn water_fill(
    work: &[PrefillWork],
    chunks: &mut [usize],
    mut queues: Vec<Vec<usize>>,
    budget: usize,
    mut tokens_left: usize,
) {
    let mut left = budget;
    loop {
        let active: Vec<usize> = (0..queues.len())
            .filter(|&t| queues[t].iter().any(|&i| chunks[i] < work[i].remaining))
            .collect();
        if active.is_empty() || left == 0 || tokens_left == 0 {
            break;
        }
        let quantum = (left / active.len()).max(2);
        let mut gave = 0;
        for t in active {
            let mut share = quantum.min(left);
            for &i in &queues[t] {
                let want = work[i].remaining - chunks[i];
                let unit = work[i].unit.max(1);
                let mut give = want.min(share / unit).min(tokens_left);
                // Never leave a one-token remainder for the next step: a
                // one-token chunk is summed in another order than a longer
                // one, and llama.cpp computes such a prompt's last token
                // with the others.
                // (Judged on the whole chunk, which may grow over rounds.)
                let total = chunks[i] + give;
                if work[i].remaining - total == 1 {
                    if total >= 3 {
                        give -= 1;
                    } else {
                        give = want; // the last token goes with these
                    }
                }
                // No one-token chunk in the middle of a prompt.
                if give == 0 || (give == 1 && want > 1 && chunks[i] == 0) {
                    continue;
                }
                chunks[i] += give;
                tokens_left = tokens_left.saturating_sub(give);
                share = share.saturating_sub(give * unit);
                left = left.saturating_sub(give * unit);
                gave += give;
                if share == 0 {
                    break;
                }
            }
            if left == 0 {
                break;
            }
        }
        if gave == 0 {
            break;
        }
        queues.retain(|q| q.iter().any(|&i| chunks[i] < work[i].remaining));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work(entries: &[(u64, usize)]) -> Vec<PrefillWork> {
        // Request ids in admission order: mint them through real admissions.
        let pool = bulkhead_kv::KvPool::new(
            bulkhead_kv::KvGeometry {
                layers: 1,
                kv_heads: 1,
                head_dim: 1,
                page_size: 1,
                dtype: bulkhead_kv::KvDtype::F32,
            },
            2,
            false,
        );
        let limits = pool.limits(1 << 20);
        entries
            .iter()
            .map(|&(tenant, remaining)| {
                let a = limits
                    .admit(TenantId::new(tenant), 1, 1, ())
                    .unwrap_or_else(|e| panic!("{e}"));
                PrefillWork {
                    tenant: TenantId::new(tenant),
                    request: a.owner().request(),
                    remaining,
                    unit: 1,
                    class: WorkClass::Interactive,
                }
            })
            .collect()
    }

    #[test]
    fn batch_work_shares_no_step_with_interactive_work() {
        // Tenant 2's batch prompt was queued first, then tenant 1's
        // interactive one and tenant 3's.
        let mut w = work(&[(2, 5_000), (1, 300), (3, 1_000)]);
        w[0].class = WorkClass::Batch;
        // A step the interactive prompts fill: the batch prompt waits.
        let c = tiered_chunks(&w, 512, usize::MAX, 0, Some(TenantId::new(2)));
        assert_eq!(c[0], 0, "{c:?}");
        assert_eq!(c[1] + c[2], 512, "{c:?}");
        // Room left over is not filled with it: the step ends when the
        // interactive prompts are computed.
        let c = tiered_chunks(&w, 2_000, usize::MAX, 0, None);
        assert_eq!(c, vec![0, 300, 1_000], "{c:?}");
        let c = tiered_chunks(&w, 10_000, 1_500, 0, None);
        assert_eq!(c, vec![0, 300, 1_000], "{c:?}");
        // Once they are, it moves.
        let c = tiered_chunks(&w[..1], 2_000, usize::MAX, 0, None);
        assert_eq!(c, vec![2_000], "{c:?}");
        // Alone, batch work is shared like any.
        let mut alone = work(&[(2, 5_000), (4, 5_000)]);
        for e in &mut alone {
            e.class = WorkClass::Batch;
        }
        assert_eq!(
            tiered_chunks(&alone, 512, usize::MAX, 0, None),
            fair_chunks(&alone, 512, usize::MAX, 0, None)
        );
        // With no batch work, the same plan as before the tiers.
        let w = work(&[(1, 1_000), (2, 1_000), (3, 1_000)]);
        assert_eq!(
            tiered_chunks(&w, 512, usize::MAX, 1, None),
            fair_chunks(&w, 512, usize::MAX, 1, None)
        );
    }

    #[test]
    fn one_tenant_gets_the_whole_budget_oldest_first() {
        let w = work(&[(1, 600), (1, 300)]);
        assert_eq!(fair_chunks(&w, 512, usize::MAX, 0, None), vec![512, 0]);
        let w = work(&[(1, 100), (1, 300)]);
        assert_eq!(fair_chunks(&w, 512, usize::MAX, 3, None), vec![100, 300]);
    }

    #[test]
    fn a_short_prompt_is_not_stuck_behind_another_tenants_long_ones() {
        // B queued four long prompts before A's four tokens.
        let w = work(&[(2, 5_000), (2, 5_000), (2, 5_000), (2, 5_000), (1, 4)]);
        for turn in 0..4 {
            let c = fair_chunks(&w, 512, usize::MAX, turn, None);
            assert_eq!(c[4], 4, "A's prompt runs this step (turn {turn})");
            assert_eq!(c.iter().sum::<usize>(), 512, "the budget is used");
            assert_eq!(c[0], 508, "B's oldest gets the rest");
        }
    }

    #[test]
    fn tenants_split_the_budget_evenly_and_turns_rotate_the_leftover() {
        let w = work(&[(1, 1_000), (2, 1_000), (3, 1_000)]);
        let a = fair_chunks(&w, 512, usize::MAX, 0, None);
        assert_eq!(a.iter().sum::<usize>(), 512);
        assert!(a.iter().all(|c| (170..=172).contains(c)), "{a:?}");
        let b = fair_chunks(&w, 512, usize::MAX, 1, None);
        assert_ne!(a, b, "another tenant gets the leftover");
        // No single-token chunk in the middle of a prompt.
        let w = work(&[(1, 10), (2, 10), (3, 10)]);
        let c = fair_chunks(&w, 7, usize::MAX, 0, None);
        assert!(c.iter().all(|&x| x != 1), "{c:?}");
        assert!(c.iter().sum::<usize>() <= 7);
        // A one-token remainder may take a one-token chunk.
        let w = work(&[(1, 1), (2, 1)]);
        assert_eq!(fair_chunks(&w, 512, usize::MAX, 0, None), vec![1, 1]);
        // Sharing leaves no one-token remainder for the next step.
        let w = work(&[(1, 257), (2, 257)]);
        let c = fair_chunks(&w, 512, usize::MAX, 0, None);
        assert!(c.iter().all(|&x| 257 - x != 1), "{c:?}");
        // A budget of one moves nothing mid-prompt, and gives up.
        let w = work(&[(1, 10), (2, 10)]);
        assert_eq!(fair_chunks(&w, 1, usize::MAX, 0, None), vec![0, 0]);
    }

    #[test]
    fn prompt_work_moves_however_many_tenants_share_a_small_step() {
        // Sixteen tenants and a step of two tokens at depth 0 (units of 16,
        // as the engine counts): no share buys two tokens, yet one moves.
        let mut w = work(
            &(1..=16)
                .map(|t| (t, 10 + 7 * t as usize))
                .collect::<Vec<_>>(),
        );
        for e in &mut w {
            e.unit = 16;
        }
        let c = fair_chunks(&w, 32, usize::MAX, 0, None);
        assert_eq!(c.iter().filter(|&&x| x > 0).count(), 1, "{c:?}");
        assert_eq!(c.iter().sum::<usize>(), 2, "{c:?}");
        let c = fair_chunks(&w, 32, usize::MAX, 0, Some(TenantId::new(5)));
        assert_eq!(c[4], 2, "the tenant served least lately moves: {c:?}");
        // Stepped to the end, every prompt finishes, with no chunk of one
        // mid-prompt and no one-token remainder.
        for budget in [32, 48, 100, 250] {
            let mut w = w.clone();
            for turn in 0..10_000 {
                if w.iter().all(|e| e.remaining == 0) {
                    break;
                }
                let live: Vec<PrefillWork> =
                    w.iter().copied().filter(|e| e.remaining > 0).collect();
                let c = fair_chunks(&live, budget, usize::MAX, turn, None);
                assert!(
                    c.iter().any(|&x| x > 0),
                    "budget {budget}: stalled at turn {turn}"
                );
                for (e, x) in live.iter().zip(c) {
                    assert!(
                        e.remaining - x != 1,
                        "budget {budget}: {x} of {}",
                        e.remaining
                    );
                    let slot = w.iter_mut().find(|s| s.request == e.request);
                    if let Some(s) = slot {
                        s.remaining -= x;
                    }
                }
            }
            assert!(w.iter().all(|e| e.remaining == 0), "budget {budget}: {w:?}");
        }
    }

    #[test]
    fn the_tenant_served_least_lately_finishes_a_prompt_that_fits_the_step() {
        // B's long prompt is deep; A's 24 tokens cost more than half the step.
        let mut w = work(&[(2, 5_000), (1, 24)]);
        w[0].unit = 3;
        w[1].unit = 1;
        assert_eq!(
            fair_chunks(&w, 40, usize::MAX, 0, None),
            vec![6, 22],
            "shares alone"
        );
        let c = fair_chunks(&w, 40, usize::MAX, 0, Some(TenantId::new(1)));
        assert_eq!(c, vec![5, 24], "A finishes now; B gets the rest");
        // A prompt that does not fit the step gets its share only.
        let w = work(&[(2, 5_000), (1, 500)]);
        assert_eq!(
            fair_chunks(&w, 40, usize::MAX, 0, Some(TenantId::new(1))),
            vec![20, 20]
        );
    }

    #[test]
    fn no_chunk_leaves_one_token_however_the_rounds_fall() {
        for budget in 2..80 {
            for len in 2..40 {
                let w = work(&[(1, len)]);
                let c = fair_chunks(&w, budget, usize::MAX, 0, None)[0];
                assert!(len - c != 1, "budget {budget}, prompt {len}: chunk {c}");
                let w = work(&[(1, len), (2, 500)]);
                let c = fair_chunks(&w, budget, usize::MAX, 0, None);
                assert!(len - c[0] != 1 && 500 - c[1] != 1, "budget {budget}: {c:?}");
            }
        }
    }

    #[test]
    fn the_token_cap_holds_and_leaves_no_one_token_remainder() {
        let w = work(&[(1, 300), (2, 300)]);
        let c = fair_chunks(&w, 10_000, 40, 0, None);
        assert_eq!(c.iter().sum::<usize>(), 40, "{c:?}");
        for len in 2..30 {
            let w = work(&[(1, len)]);
            for cap in 1..30 {
                let c = fair_chunks(&w, 10_000, cap, 0, Some(TenantId::new(1)))[0];
                assert!(
                    len - c != 1 && c <= cap.max(len.min(cap + 2)),
                    "prompt {len}, cap {cap}: {c}"
                );
            }
        }
    }

    #[test]
    fn a_share_buys_fewer_deep_tokens_than_shallow_ones() {
        // B's prompt is deep (each token costs 5 units), A's is fresh.
        let mut w = work(&[(2, 5_000), (1, 100)]);
        w[0].unit = 5;
        w[1].unit = 1;
        let c = fair_chunks(&w, 100, usize::MAX, 0, None);
        assert_eq!(c, vec![10, 50], "equal compute, not equal tokens");
        // Alone, B gets the whole budget's worth.
        assert_eq!(fair_chunks(&w[..1], 100, usize::MAX, 0, None), vec![20]);
    }
}
