//! How fast this engine prefills: a cost model, measured once when the
//! engine starts, that turns prompt lengths into seconds and seconds into
//! step budgets and prompt limits.
//!
//! A prompt token costs its share of the weight matrices (the same for
//! every token) plus attention over every token before it, so prefilling
//! `n` tokens costs `a * (n + rho * n * (n - 1) / 2)` seconds: `a` is
//! measured on this machine at start ([`crate::EngineCore::calibrate`]),
//! `rho` (attention work per token pair against matrix work per token) is
//! the model's shape times [`ATTENTION_EFFICIENCY`].
//!
//! The engine times a 31-token pass on a scratch pool of its own when it
//! starts. Workers register both figures and their prefill deadline with the
//! control plane, which routes to a worker only if it prefills the active
//! config's whole context window within that deadline.

use crate::gguf::ModelConfig;
use std::time::Duration;

/// How much slower a multiply-add of attention runs than one of the
/// weight matrices (measured on the reference 2-vCPU machine: 2,001
/// tokens in 28 s and 8,001 in 307 s with the default model).
pub(crate) const ATTENTION_EFFICIENCY: f64 = 4.2;

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

    /// The model's shape with `secs_per_token` measured here.
    pub(crate) fn measured(config: &ModelConfig, secs_per_token: f64) -> Self {
        PrefillSpeed {
            secs_per_token,
            rho: rho(config),
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
