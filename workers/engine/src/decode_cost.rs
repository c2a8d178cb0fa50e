//! What a decode step costs, learned from the steps this engine ran: a line
//! `fixed + units × per_unit` (seconds) fitted to the steps that only
//! decoded, older steps weighing less. The step units are the prefill cost
//! model's ([`crate::speed`]); a decode token costs more than a prompt
//! token of the same units (the weights are read once per step, and every
//! decoded row computes the output head), and another process on the same
//! cores slows every step, so the figure is measured, not derived.
//!
//! Until two step sizes have been seen, the line is the average cost per
//! unit through the origin; until one step has been seen, decode is not
//! held to any time.

use std::time::Duration;

/// How much each older step weighs against the one after it.
const KEEP: f64 = 0.9;

/// The decode cost line of one engine.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DecodeCost {
    /// Decayed sums over observed steps: weight, units, seconds,
    /// units², units × seconds.
    w: f64,
    x: f64,
    y: f64,
    xx: f64,
    xy: f64,
}

impl DecodeCost {
    /// A step that decoded `units` worth of tokens and took `took`.
    pub(crate) fn observe(&mut self, took: Duration, units: usize) {
        if units == 0 {
            return;
        }
        #[allow(clippy::cast_precision_loss)]
        let x = units as f64;
        let y = took.as_secs_f64();
        self.w = self.w * KEEP + 1.0;
        self.x = self.x * KEEP + x;
        self.y = self.y * KEEP + y;
        self.xx = self.xx * KEEP + x * x;
        self.xy = self.xy * KEEP + x * y;
    }

    /// (fixed seconds, seconds per unit) of the fitted line; `None` before
    /// any step.
    fn line(&self) -> Option<(f64, f64)> {
        if self.w <= 0.0 || self.x <= 0.0 {
            return None;
        }
        let spread = self.w * self.xx - self.x * self.x;
        // Steps of (nearly) one size: the cost per unit at that size.
        let through_origin = (0.0, self.y / self.x);
        if spread <= 1e-9 * self.w * self.xx {
            return Some(through_origin);
        }
        let slope = (self.w * self.xy - self.x * self.y) / spread;
        let fixed = (self.y - slope * self.x) / self.w;
        if slope > 0.0 && fixed >= 0.0 {
            Some((fixed, slope))
        } else {
            Some(through_origin)
        }
    }

    /// The most decode units that fit `time`: unbounded before any step
    /// was seen, 0 when the fixed cost alone takes longer (the caller
    /// still decodes one sequence).
    pub(crate) fn units_in(&self, time: Duration) -> usize {
        match self.line() {
            None => usize::MAX,
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            Some((fixed, per_unit)) => ((time.as_secs_f64() - fixed).max(0.0) / per_unit) as usize,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_held_before_a_step_is_seen() {
        assert_eq!(
            DecodeCost::default().units_in(Duration::from_millis(1)),
            usize::MAX
        );
    }

    #[test]
    fn steps_of_one_size_give_their_cost_per_unit() {
        let mut c = DecodeCost::default();
        for _ in 0..5 {
            c.observe(Duration::from_millis(100), 400);
        }
        // 0.25 ms per unit: 50 ms holds 200 units.
        assert_eq!(c.units_in(Duration::from_millis(50)), 200);
    }

    #[test]
    fn two_sizes_separate_the_fixed_cost_from_the_cost_per_unit() {
        // 10 ms per step plus 0.1 ms per unit.
        let mut c = DecodeCost::default();
        for units in [100, 400, 100, 400, 250] {
            c.observe(
                Duration::from_secs_f64(0.010 + 0.0001 * f64::from(units)),
                units as usize,
            );
        }
        let fits = c.units_in(Duration::from_millis(50));
        assert!((399..=400).contains(&fits), "{fits}");
        // Less than the fixed cost: nothing fits.
        assert_eq!(c.units_in(Duration::from_millis(5)), 0);
    }

    #[test]
    fn later_steps_outweigh_older_ones() {
        let mut c = DecodeCost::default();
        for _ in 0..50 {
            c.observe(Duration::from_millis(10), 100);
        }
        // The machine got four times slower (another process on the cores).
        for _ in 0..50 {
            c.observe(Duration::from_millis(40), 100);
        }
        let fits = c.units_in(Duration::from_millis(40));
        assert!((95..=105).contains(&fits), "{fits}");
    }
}
