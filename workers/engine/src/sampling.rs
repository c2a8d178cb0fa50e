//! Choosing the next token: greedy, or temperature / top-k / top-p with a
//! seeded generator, after an optional repetition penalty; within an output
//! grammar when the request has one (JSON mode, a JSON schema), and with the
//! log-probabilities of the model's own distribution when asked.
//!
//! Constrained sampling masks before it samples: a token whose bytes the
//! grammar's matcher refuses is never picked, end-of-sequence only where the
//! output may end, and top-k / top-p apply to the tokens that remain.

use bulkhead_grammar::{Grammar, Matcher};
use std::sync::Arc;

/// How to pick tokens, and how many.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Maximum tokens to generate.
    pub max_tokens: usize,
    /// 0 means greedy.
    pub temperature: f32,
    /// Nucleus sampling mass, in (0, 1]; 1 disables it.
    pub top_p: f32,
    /// Keep only the k most likely tokens; 0 disables it.
    pub top_k: usize,
    /// Penalty for tokens already in the sequence; 1 disables it.
    pub repetition_penalty: f32,
    /// Seed of the sampler: the same seed gives the same output.
    pub seed: u64,
    /// The grammar the output must follow, if any.
    pub constraint: Option<Arc<Grammar>>,
    /// Log-probabilities to report with each token: `Some(n)` gives the
    /// chosen token's and the `n` most likely (at most [`MAX_TOP_LOGPROBS`]).
    pub logprobs: Option<u8>,
}

/// The most alternatives `logprobs` reports per token (OpenAI's bound).
pub const MAX_TOP_LOGPROBS: u8 = 20;

/// One token's log-probability under the model's distribution (the logits
/// before penalty, temperature or grammar).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token.
    pub id: u32,
    /// Its bytes (empty for a special token).
    pub bytes: Vec<u8>,
    /// Natural log of its probability.
    pub logprob: f32,
}

/// The log-probabilities reported with a generated token.
#[derive(Debug, Clone, PartialEq)]
pub struct Logprobs {
    /// The chosen token.
    pub chosen: TokenLogprob,
    /// The most likely tokens, most likely first.
    pub top: Vec<TokenLogprob>,
}

impl SamplingParams {
    /// Greedy decoding of up to `max_tokens` tokens.
    pub fn greedy(max_tokens: usize) -> Self {
        SamplingParams {
            max_tokens,
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            repetition_penalty: 1.0,
            seed: 0,
            constraint: None,
            logprobs: None,
        }
    }
}

/// What the sampler picked.
#[derive(Debug)]
pub(crate) struct Pick {
    pub(crate) id: u32,
    pub(crate) logprobs: Option<Logprobs>,
}

/// Per-sequence sampler state.
#[derive(Debug)]
pub(crate) struct Sampler {
    params: SamplingParams,
    rng: SplitMix64,
    scratch: Vec<(u32, f32)>,
    matcher: Option<Matcher>,
}

/// Most tokens the greedy path tries, best first, before it checks the
/// whole vocabulary against the grammar instead.
const GREEDY_TRIES: usize = 32;

impl Sampler {
    pub(crate) fn new(params: SamplingParams) -> Self {
        let rng = SplitMix64(params.seed);
        let matcher = params.constraint.clone().map(Matcher::new);
        Sampler {
            params,
            rng,
            scratch: Vec::new(),
            matcher,
        }
    }

    /// The output is a complete value of its grammar: nothing may follow.
    pub(crate) fn grammar_done(&self) -> bool {
        self.matcher.as_ref().is_some_and(Matcher::is_done)
    }

    /// Picks a token from `logits` (modified in place), given the tokens so
    /// far, and moves the grammar past it.
    pub(crate) fn pick(
        &mut self,
        logits: &mut [f32],
        history: &[u32],
        tokenizer: &crate::Tokenizer,
    ) -> Pick {
        // The model's own distribution, before anything changes the logits.
        let raw = self.params.logprobs.map(|n| {
            let (lse, top) = top_logprobs(logits, n.min(MAX_TOP_LOGPROBS), tokenizer);
            (lse, top, logits.to_vec())
        });
        let id = match self.matcher.take() {
            None => self.sample(logits, history),
            Some(mut m) => {
                let id = self.constrained(logits, history, &m, tokenizer);
                if id != tokenizer.eos()
                    && let Some(b) = tokenizer.token_bytes(id)
                {
                    m.feed(b);
                }
                self.matcher = Some(m);
                id
            }
        };
        let logprobs = raw.map(|(lse, top, raw)| Logprobs {
            chosen: TokenLogprob {
                id,
                bytes: tokenizer
                    .token_bytes(id)
                    .map(<[u8]>::to_vec)
                    .unwrap_or_default(),
                logprob: raw.get(id as usize).map_or(f32::NEG_INFINITY, |l| l - lse),
            },
            top,
        });
        Pick { id, logprobs }
    }

    /// A token the grammar accepts (end-of-sequence where the output may
    /// end). With nothing acceptable (only a vocabulary without one-byte
    /// tokens could leave that), end-of-sequence.
    fn constrained(
        &mut self,
        logits: &mut [f32],
        history: &[u32],
        m: &Matcher,
        tokenizer: &crate::Tokenizer,
    ) -> u32 {
        let eos = tokenizer.eos();
        let ok = |id: u32| {
            if id == eos {
                m.can_end()
            } else {
                tokenizer.token_bytes(id).is_some_and(|b| m.accepts(b))
            }
        };
        self.penalize(logits, history);
        if self.params.temperature <= 0.0 {
            // Greedy: the best token is usually acceptable; try a few, best
            // first, before checking the whole vocabulary.
            let mut trial = logits.to_vec();
            for _ in 0..GREEDY_TRIES {
                let id = argmax(&trial);
                if trial[id as usize] == f32::NEG_INFINITY {
                    return eos;
                }
                if ok(id) {
                    return id;
                }
                trial[id as usize] = f32::NEG_INFINITY;
            }
        }
        // Which tokens the grammar takes: one walk of the vocabulary sorted
        // by bytes, sharing each prefix's matcher state.
        let mut accepted = tokenizer.accepted_by(m);
        accepted.resize(logits.len(), false);
        if let Some(e) = accepted.get_mut(eos as usize) {
            *e = m.can_end();
        }
        let mut any = false;
        for (l, ok) in logits.iter_mut().zip(&accepted) {
            if *l == f32::NEG_INFINITY || !ok {
                *l = f32::NEG_INFINITY;
            } else {
                any = true;
            }
        }
        if !any {
            return eos;
        }
        self.choose(logits)
    }

    /// Picks a token from `logits` (modified in place), given the tokens so far.
    pub(crate) fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        self.penalize(logits, history);
        self.choose(logits)
    }

    /// The repetition penalty, applied to `logits` in place.
    fn penalize(&self, logits: &mut [f32], history: &[u32]) {
        let p = &self.params;
        if p.repetition_penalty != 1.0 && p.repetition_penalty > 0.0 {
            let mut seen = history.to_vec();
            seen.sort_unstable();
            seen.dedup();
            for t in seen {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 {
                        *l / p.repetition_penalty
                    } else {
                        *l * p.repetition_penalty
                    };
                }
            }
        }
    }

    /// Greedy, or a draw after temperature, top-k and top-p.
    fn choose(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
        if p.temperature <= 0.0 {
            return argmax(logits);
        }
        let c = &mut self.scratch;
        c.clear();
        c.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, l)| **l > f32::NEG_INFINITY)
                .map(|(i, l)| (u32::try_from(i).unwrap_or(u32::MAX), l / p.temperature)),
        );
        if c.is_empty() {
            return argmax(logits);
        }
        c.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if p.top_k > 0 {
            c.truncate(p.top_k);
        }
        let max = c[0].1;
        let mut sum = 0f32;
        for e in c.iter_mut() {
            e.1 = (e.1 - max).exp();
            sum += e.1;
        }
        if p.top_p < 1.0 && p.top_p > 0.0 {
            let mut mass = 0f32;
            let mut keep = c.len();
            for (i, e) in c.iter().enumerate() {
                mass += e.1 / sum;
                if mass >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
            c.truncate(keep);
            sum = c.iter().map(|e| e.1).sum();
        }
        let mut target = self.rng.next_f32() * sum;
        for e in c.iter() {
            target -= e.1;
            if target <= 0.0 {
                return e.0;
            }
        }
        c.last().map_or(0, |e| e.0)
    }
}

/// The log-sum-exp of `logits` and the `n` most likely tokens with their
/// log-probabilities, most likely first (ties by id).
fn top_logprobs(logits: &[f32], n: u8, tokenizer: &crate::Tokenizer) -> (f32, Vec<TokenLogprob>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits.iter().map(|l| (l - max).exp()).sum();
    let lse = max + sum.ln();
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(usize::from(n) + 1);
    if n > 0 {
        for (i, l) in logits.iter().enumerate() {
            let worst = best.last().map_or(f32::NEG_INFINITY, |b| b.1);
            if best.len() < usize::from(n) || *l > worst {
                let at = best.partition_point(|b| b.1 >= *l);
                best.insert(at, (u32::try_from(i).unwrap_or(u32::MAX), *l));
                best.truncate(usize::from(n));
            }
        }
    }
    let top = best
        .into_iter()
        .map(|(id, l)| TokenLogprob {
            id,
            bytes: tokenizer
                .token_bytes(id)
                .map(<[u8]>::to_vec)
                .unwrap_or_default(),
            logprob: l - lse,
        })
        .collect();
    (lse, top)
}

/// Index of the largest value; the first one on ties.
pub(crate) fn argmax(xs: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in xs.iter().enumerate() {
        if *v > xs[best] {
            best = i;
        }
    }
    u32::try_from(best).unwrap_or(u32::MAX)
}

/// A small, fast, seedable generator (SplitMix64): stable across versions.
#[derive(Debug)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn next_f32(&mut self) -> f32 {
        #[allow(clippy::cast_precision_loss)]
        let v = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> SamplingParams {
        SamplingParams {
            max_tokens: 1,
            temperature,
            top_p,
            top_k,
            repetition_penalty: 1.0,
            seed,
            constraint: None,
            logprobs: None,
        }
    }

    #[test]
    fn greedy_topk_and_seed_behave() {
        let logits = vec![0.1, 3.0, 2.9, -1.0];
        assert_eq!(
            Sampler::new(SamplingParams::greedy(1)).sample(&mut logits.clone(), &[]),
            1
        );
        // top_k = 1 is greedy whatever the temperature.
        assert_eq!(
            Sampler::new(params(5.0, 1, 1.0, 3)).sample(&mut logits.clone(), &[]),
            1
        );
        // Same seed, same draws; different seeds eventually differ.
        let draw = |seed| {
            let mut s = Sampler::new(params(2.0, 0, 1.0, seed));
            (0..32)
                .map(|_| s.sample(&mut logits.clone(), &[]))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        // A strong repetition penalty moves greedy off a repeated token.
        let mut p = SamplingParams::greedy(1);
        p.repetition_penalty = 2.0;
        assert_eq!(Sampler::new(p).sample(&mut logits.clone(), &[1]), 2);
    }
}
