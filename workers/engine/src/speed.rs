//! How fast this engine prefills: a cost model, measured once when the
//! engine starts, that turns prompt lengths into seconds and seconds into
//! step budgets and prompt limits.
//!
//! A prompt token costs its share of the weight matrices (the same for
//! every token) plus attention over every token before it, so prefilling
//! `n` tokens costs `a * (n + rho * n * (n - 1) / 2)` seconds: `a` (seconds
//! per token) and `a * rho` (seconds per token pair) are both measured on
//! this machine when the engine starts ([`crate::EngineCore::calibrate`]).
//!
//! The pair cost is timed at depth ([`measure_pair_secs`]): the blocked
//! attention kernel, as prefill runs it (tiles of rows, every KV head, the
//! engine's threads), over [`CALIBRATION_DEPTH`] tokens of synthetic pages,
//! so the figure holds where it matters, for long prompts. The token cost
//! is a 31-token pass on a scratch pool of the engine's own, less the
//! attention in it. Before measuring, the model's shape at the reference
//! machine's pace stands in ([`PrefillSpeed::nominal`]). Workers register
//! both figures and their prefill deadline with the control plane, which
//! routes to a worker only if it prefills the active config's whole
//! context window within that deadline.

use crate::gguf::ModelConfig;
use bulkhead_kernels::attention::{
    HeadPages, KvElement, QueryTile, Softmax, SumOrder, TileScratch, attend_tile,
};
use bulkhead_kv::KvDtype;
use rayon::prelude::*;
use std::time::{Duration, Instant};

/// How much slower a multiply-add of attention runs than one of the
/// weight matrices before the engine has measured its own (the reference
/// 2-vCPU machine with the row-at-a-time kernel: 2,001 tokens in 28 s and
/// 8,001 in 307 s with the default model).
pub(crate) const ATTENTION_EFFICIENCY: f64 = 4.2;

/// Context depth at which the attention cost is measured.
pub(crate) const CALIBRATION_DEPTH: usize = 4_096;

/// Seconds per weight multiply-add assumed until the engine has measured
/// its own (the reference machine's figure).
const NOMINAL_SECS_PER_MAC: f64 = 5.6e-11;

/// A cost unit of a step's budget: one prompt token with nothing before it
/// costs [`UNIT`] units.
pub(crate) const UNIT: f64 = 16.0;

/// The prefill cost model of one engine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefillSpeed {
    /// Seconds per prompt token for the weight matrices.
    secs_per_token: f64,
    /// Attention cost of one token pair, relative to `secs_per_token`.
    rho: f64,
}

impl PrefillSpeed {
    /// The model's shape at a nominal speed (before measuring).
    pub(crate) fn nominal(config: &ModelConfig) -> Self {
        PrefillSpeed {
            secs_per_token: matrix_macs(config) * NOMINAL_SECS_PER_MAC,
            rho: rho(config),
        }
    }

    /// Both costs measured here: seconds per token of matrix work and per
    /// token pair of attention.
    pub(crate) fn measured(secs_per_token: f64, secs_per_pair: f64) -> Self {
        PrefillSpeed {
            secs_per_token,
            rho: secs_per_pair / secs_per_token,
        }
    }

    /// Seconds per prompt token for the weight matrices.
    pub fn secs_per_token(&self) -> f64 {
        self.secs_per_token
    }

    /// Seconds of attention per token pair.
    pub fn secs_per_pair(&self) -> f64 {
        self.secs_per_token * self.rho
    }

    /// Estimated seconds to prefill `n` tokens alone.
    pub fn prompt_secs(&self, n: usize) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let n = n as f64;
        self.secs_per_token * (n + self.rho * n * (n - 1.0).max(0.0) / 2.0)
    }

    /// The longest prompt prefilled alone within `deadline`.
    pub fn max_prompt_within(&self, deadline: Duration) -> usize {
        let (mut lo, mut hi) = (0usize, 1usize << 24);
        let limit = deadline.as_secs_f64();
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if self.prompt_secs(mid) <= limit {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }

    /// What one prompt token at position `depth` costs, in step units.
    pub(crate) fn unit_at(&self, depth: usize) -> usize {
        #[allow(clippy::cast_precision_loss)]
        let d = depth as f64;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let u = (UNIT * (1.0 + self.rho * d)).round() as usize;
        u.max(1)
    }

    /// What `work` beyond the model (sampling) costs in step units,
    /// rounded up: any such work is charged at least one unit.
    pub(crate) fn units_charged(&self, work: Duration) -> usize {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let u = (UNIT * work.as_secs_f64() / self.secs_per_token).ceil() as usize;
        u
    }

    /// A step budget that takes about `step` to compute, in step units.
    pub(crate) fn units_in(&self, step: Duration) -> usize {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let u = (UNIT * step.as_secs_f64() / self.secs_per_token) as usize;
        u
    }
}

/// Weight multiply-adds per token (every matrix but the output head, which
/// runs only for the rows that want logits).
fn matrix_macs(c: &ModelConfig) -> f64 {
    let kv = c.kv_heads * c.head_dim;
    let per_layer = 2 * c.hidden * c.hidden + 2 * c.hidden * kv + 3 * c.hidden * c.ffn;
    #[allow(clippy::cast_precision_loss)]
    let macs = (c.layers * per_layer) as f64;
    macs
}

/// Attention multiply-adds per token pair (keys and values, every query
/// head of every layer), relative to the matrices', scaled by how much
/// slower they run.
fn rho(c: &ModelConfig) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let pair = (2 * c.layers * c.heads * c.head_dim) as f64;
    ATTENTION_EFFICIENCY * pair / matrix_macs(c)
}

/// Seconds of attention per token pair (all layers, all heads), timed at
/// [`CALIBRATION_DEPTH`]: `rows` consecutive query rows in tiles of
/// `tile_rows`, every KV head, on the current rayon pool, over synthetic
/// pages of `dtype` (the cost does not depend on the values). The best of
/// `rounds`.
pub(crate) fn measure_pair_secs(
    c: &ModelConfig,
    dtype: KvDtype,
    page_size: usize,
    (rows, tile_rows): (usize, usize),
    rounds: usize,
) -> f64 {
    match dtype {
        KvDtype::F16 => pair_secs::<half::f16>(c, page_size, (rows, tile_rows), rounds),
        KvDtype::F32 => pair_secs::<f32>(c, page_size, (rows, tile_rows), rounds),
    }
}

fn pair_secs<E: KvElement + From<u8>>(
    c: &ModelConfig,
    ps: usize,
    (rows, tile_rows): (usize, usize),
    rounds: usize,
) -> f64 {
    let (hd, group) = (c.head_dim, c.heads / c.kv_heads.max(1));
    let depth = CALIBRATION_DEPTH.min(c.context_window.max(rows + 1));
    let pages = depth.div_ceil(ps);
    // Laid out as the pool lays out one layer of its pages: every page a
    // block of its own, the layer's keys then values, so a sweep touches
    // one short run of each page block as serving does (the cost depends
    // on where the bytes are, not on what they are). The pool's blocks
    // hold every layer; one layer apart is as many distinct cache lines
    // and memory pages per sweep, at a small part of the memory.
    let head = hd * ps;
    let stride = 2 * c.kv_heads * head;
    let mut memory = vec![E::from(0); pages * stride];
    for (i, v) in memory.iter_mut().enumerate() {
        *v = E::from((i % 7) as u8);
    }
    let block = |page: usize, at: usize| &memory[page * stride + at..page * stride + at + head];
    let heads: Vec<crate::forward::HeadSlices<'_, E>> = (0..c.kv_heads)
        .map(|kvh| {
            (
                (0..pages).map(|p| block(p, kvh * head)).collect(),
                (0..pages)
                    .map(|p| block(p, (c.kv_heads + kvh) * head))
                    .collect(),
            )
        })
        .collect();
    let q: Vec<f32> = (0..rows * group * hd)
        .map(|i| ((i % 5) as f32) * 0.01)
        .collect();
    let tiles: Vec<(usize, usize)> = (0..c.kv_heads)
        .flat_map(|kvh| (0..rows).step_by(tile_rows).map(move |r| (kvh, r)))
        .collect();
    let mut best = f64::INFINITY;
    for _ in 0..rounds.max(1) {
        let t = Instant::now();
        tiles.par_iter().for_each(|&(kvh, r)| {
            let n = tile_rows.min(rows - r);
            let tile = QueryTile {
                q: &q[r * group * hd..],
                row_stride: group * hd,
                rows: n,
                group,
                hd,
                first_ctx: depth - rows + r + 1,
                order: SumOrder::Sgemm,
            };
            let pages = HeadPages {
                keys: &heads[kvh].0,
                values: &heads[kvh].1,
                width: ps,
            };
            let mut out = vec![0f32; n * group * hd];
            let mut scratch = TileScratch::default();
            #[allow(clippy::cast_precision_loss)]
            let softmax = Softmax {
                scale: 1.0 / (hd as f32).sqrt(),
                round_f16: true,
            };
            attend_tile(&tile, &pages, softmax, &mut scratch, &mut out);
        });
        best = best.min(t.elapsed().as_secs_f64());
    }
    // One layer's pairs: every row against about `depth` tokens.
    #[allow(clippy::cast_precision_loss)]
    let pairs = (rows * depth) as f64;
    #[allow(clippy::cast_precision_loss)]
    let layers = c.layers as f64;
    best * layers / pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smollm2() -> ModelConfig {
        ModelConfig {
            name: String::new(),
            layers: 30,
            hidden: 576,
            ffn: 1536,
            heads: 9,
            kv_heads: 3,
            head_dim: 64,
            rms_eps: 1e-5,
            rope_base: 1e5,
            context_window: 8192,
            vocab: 49_152,
            quantization: String::new(),
        }
    }

    #[test]
    fn the_nominal_model_matches_the_reference_measurements() {
        let s = PrefillSpeed::nominal(&smollm2());
        // Measured on the reference machine: 28 s and 307 s.
        let (short, long) = (s.prompt_secs(2_001), s.prompt_secs(8_001));
        assert!((20.0..36.0).contains(&short), "{short}");
        assert!((250.0..370.0).contains(&long), "{long}");
        let n = s.max_prompt_within(Duration::from_secs(60));
        assert!((2_800..3_600).contains(&n), "{n}");
        assert!(s.prompt_secs(n) <= 60.0 && s.prompt_secs(n + 1) > 60.0);
        assert_eq!(s.unit_at(0), UNIT as usize);
        assert!(s.unit_at(3_000) > 4 * s.unit_at(0));
        let pairs = 2_001.0 * 2_000.0 / 2.0;
        let from = s.secs_per_token() * 2_001.0 + s.secs_per_pair() * pairs;
        assert!(
            (from - short).abs() < 1e-9,
            "the two registered figures give the same estimate"
        );
    }
}
