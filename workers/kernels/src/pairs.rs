//! Activation rows laid out for the 512-bit matmul tiles: groups of eight
//! rows, two rows side by side per 64-byte vector.
//!
//! A 512-bit tile multiplies one weight block (broadcast to both halves) by
//! two activation rows' blocks at once. Built once per matmul input, this
//! layout lets every operand of the tile's inner loop be one plain load
//! (the two rows' quants, their scales spread over eight lanes each, the
//! offset correction of unsigned weights), where building them inside the
//! loop cost a shuffle per pair and weight row. It changes no arithmetic:
//! the tiles form exactly the integers and products they formed before.

use crate::block::{BLOCK, sized};

/// Rows per group: four pairs.
pub(crate) const GROUP: usize = 8;
/// Pairs per group.
pub(crate) const PAIRS: usize = GROUP / 2;

/// Activation rows `0..rows / 8 * 8` in groups of eight; every array is
/// indexed `[group][block][pair]` (or `[group][block]` for `s8`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Pairs8 {
    /// The 32 quants of the pair's first row's block, then the second's.
    pub(crate) y: Vec<i8>,
    /// The two rows' block scales, each repeated over eight lanes.
    pub(crate) d: Vec<f32>,
    /// Minus the sum of each four consecutive quants (one per 32-bit lane
    /// of a VNNI dot product), first row's eight lanes then the second's:
    /// scaled by a weight format's offset, the correction that makes a dot
    /// product with offset (unsigned) weights exact.
    pub(crate) neg_sums: Vec<i32>,
    /// The eight rows' `d · Σq` of the block (Q4_1's minimum terms).
    pub(crate) s8: Vec<f32>,
}

impl Pairs8 {
    /// Packs the first `groups` groups of eight rows of `nb` blocks
    /// (quants, scales and `d · Σq` of the rows, row-major), reusing the
    /// buffers' capacity.
    pub(crate) fn pack(&mut self, qs: &[i8], d: &[f32], s: &[f32], groups: usize, nb: usize) {
        let pairs = groups * nb * PAIRS;
        let (py, pd, pn, ps) = (
            sized(&mut self.y, pairs * 2 * BLOCK),
            sized(&mut self.d, pairs * 16),
            sized(&mut self.neg_sums, pairs * 16),
            sized(&mut self.s8, groups * nb * GROUP),
        );
        for g in 0..groups {
            for b in 0..nb {
                let gb = g * nb + b;
                for t in 0..GROUP {
                    let row = (g * GROUP + t) * nb + b;
                    let slot = (gb * PAIRS + t / 2) * 2 + t % 2;
                    let q = &qs[row * BLOCK..(row + 1) * BLOCK];
                    py[slot * BLOCK..(slot + 1) * BLOCK].copy_from_slice(q);
                    pd[slot * 8..(slot + 1) * 8].fill(d[row]);
                    for (lane, four) in q.chunks_exact(4).enumerate() {
                        let sum: i32 = four.iter().map(|v| i32::from(*v)).sum();
                        pn[slot * 8 + lane] = -sum;
                    }
                    ps[gb * GROUP + t] = s[row];
                }
            }
        }
    }

    /// Groups of eight rows packed.
    pub(crate) fn groups(&self, nb: usize) -> usize {
        if nb == 0 {
            0
        } else {
            self.s8.len() / (nb * GROUP)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_holds_two_rows_blocks_side_by_side() {
        // 9 rows of 2 blocks: one group, the ninth row left out.
        let (rows, nb) = (9, 2);
        let qs: Vec<i8> = (0..rows * nb * BLOCK).map(|i| (i % 251) as i8).collect();
        let d: Vec<f32> = (0..rows * nb).map(|i| i as f32).collect();
        let s: Vec<f32> = (0..rows * nb).map(|i| -(i as f32)).collect();
        let mut p = Pairs8::default();
        p.pack(&qs, &d, &s, rows / GROUP, nb);
        assert_eq!(p.groups(nb), 1);
        // Group 0, block 1, pair 2: rows 4 and 5.
        let gb = 1; // group 0, block 1
        let slot = gb * PAIRS + 2;
        let row4 = 4 * nb + 1;
        let row5 = 5 * nb + 1;
        assert_eq!(
            &p.y[slot * 64..slot * 64 + 32],
            &qs[row4 * BLOCK..(row4 + 1) * BLOCK]
        );
        assert_eq!(
            &p.y[slot * 64 + 32..slot * 64 + 64],
            &qs[row5 * BLOCK..(row5 + 1) * BLOCK]
        );
        assert_eq!(
            &p.d[slot * 16..slot * 16 + 16],
            &[[d[row4]; 8], [d[row5]; 8]].concat()[..]
        );
        let lane3: i32 = qs[row5 * BLOCK + 12..row5 * BLOCK + 16]
            .iter()
            .map(|v| i32::from(*v))
            .sum();
        assert_eq!(p.neg_sums[slot * 16 + 8 + 3], -lane3);
        assert_eq!(p.s8[gb * GROUP + 5], s[row5]);
    }
}
