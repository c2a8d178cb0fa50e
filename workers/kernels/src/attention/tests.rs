//! Every width of the blocked kernel against attention written plainly:
//! ragged last pages, one-token chunks (both orders), GQA groups, several
//! value tiles, f16 and f32 pages, and pages of other widths.

use super::*;
use crate::ops::{round_f16_slice, softmax_ggml};

fn lcg(seed: &mut u64) -> f32 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// A sum as the library defines it: term `i` into lane `i % lanes`, the
/// first of each lane a product, the lanes combined by the order's tree.
fn library_sum(terms: impl Iterator<Item = (f32, f32)>, order: SumOrder) -> f32 {
    let lanes = order.lanes();
    let mut acc = [0f32; LANES];
    for (i, (a, b)) in terms.enumerate() {
        acc[i % lanes] = if i < lanes {
            a * b
        } else {
            a.mul_add(b, acc[i % lanes])
        };
    }
    order.combine(&acc)
}

/// One KV head's context written plainly: `keys[t][d]`, `values[t][d]`.
struct Context {
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

impl Context {
    fn new(seed: &mut u64, ctx: usize, hd: usize) -> Self {
        let mut row = |s: f32| -> Vec<f32> {
            let mut r: Vec<f32> = (0..hd).map(|_| lcg(seed) * s).collect();
            round_f16_slice(&mut r);
            r
        };
        Context {
            keys: (0..ctx).map(|_| row(3.0)).collect(),
            values: (0..ctx).map(|_| row(1.0)).collect(),
        }
    }

    /// The context as pages: keys `[hd][width]`, values `[width][hd]`; slots
    /// past the context hold NaN, so reading one poisons the result.
    fn pages<E: KvElement>(
        &self,
        width: usize,
        conv: impl Fn(f32) -> E,
    ) -> (Vec<Vec<E>>, Vec<Vec<E>>) {
        let hd = self.keys[0].len();
        let n_pages = self.keys.len().div_ceil(width);
        let (mut ks, mut vs) = (Vec::new(), Vec::new());
        for pi in 0..n_pages {
            let mut k = vec![conv(f32::NAN); hd * width];
            let mut v = vec![conv(f32::NAN); hd * width];
            for slot in 0..width {
                let Some(t) = Some(pi * width + slot).filter(|t| *t < self.keys.len()) else {
                    continue;
                };
                for d in 0..hd {
                    k[d * width + slot] = conv(self.keys[t][d]);
                    v[slot * hd + d] = conv(self.values[t][d]);
                }
            }
            ks.push(k);
            vs.push(v);
        }
        (ks, vs)
    }
}

/// Attention written plainly for every (row, head) pair of a tile.
fn plain(ctx: &Context, tile: &QueryTile<'_>, softmax: Softmax) -> Vec<f32> {
    let hd = tile.hd;
    let mut out = Vec::new();
    for p in 0..tile.pairs() {
        let q = &tile.q[tile.q_at(p)..tile.q_at(p) + hd];
        let n = tile.ctx(p);
        let mut s: Vec<f32> = (0..n)
            .map(|t| {
                library_sum(
                    q.iter().copied().zip(ctx.keys[t].iter().copied()),
                    tile.order,
                )
            })
            .collect();
        for x in &mut s {
            *x *= softmax.scale;
        }
        softmax_ggml(&mut s);
        if softmax.round_f16 {
            round_f16_slice(&mut s);
        }
        for d in 0..hd {
            out.push(library_sum(
                (0..n).map(|t| (s[t], ctx.values[t][d])),
                tile.order,
            ));
        }
    }
    out
}

fn levels() -> Vec<SimdLevel> {
    [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512]
        .into_iter()
        .filter(|l| *l <= crate::simd_level())
        .collect()
}

/// One case: `rows` query rows whose first attends to `first_ctx` tokens,
/// `group` heads per KV head, pages of `width`.
fn check(case: (usize, usize, usize, usize, usize), order: SumOrder, seed: &mut u64) {
    let (rows, first_ctx, group, hd, width) = case;
    let ctx = Context::new(seed, first_ctx + rows - 1, hd);
    let row_stride = group * hd + 5;
    let mut q: Vec<f32> = (0..rows * row_stride).map(|_| lcg(seed) * 4.0).collect();
    round_f16_slice(&mut q);
    let tile = QueryTile {
        q: &q,
        row_stride,
        rows,
        group,
        hd,
        first_ctx,
        order,
    };
    #[allow(clippy::cast_precision_loss)]
    let softmax = Softmax {
        scale: 1.0 / (hd as f32).sqrt(),
        round_f16: true,
    };
    let want = plain(&ctx, &tile, softmax);
    let (k16, v16) = ctx.pages(width, half::f16::from_f32);
    let (k32, v32) = ctx.pages(width, |x| x);
    let what =
        format!("{order:?} rows={rows} first_ctx={first_ctx} group={group} hd={hd} width={width}");
    for level in levels() {
        let mut scratch = TileScratch::default();
        // The same scratch for both element types: nothing carries over.
        attend_and_compare(
            level,
            &tile,
            (&k16, &v16, width),
            softmax,
            &mut scratch,
            &want,
            &what,
        );
        attend_and_compare(
            level,
            &tile,
            (&k32, &v32, width),
            softmax,
            &mut scratch,
            &want,
            &what,
        );
    }
}

/// Attention of `tile` over pages `(keys, values, width)` at `level` is
/// `want`, bit for bit.
fn attend_and_compare<E: KvElement>(
    level: SimdLevel,
    tile: &QueryTile<'_>,
    (k, v, width): (&[Vec<E>], &[Vec<E>], usize),
    softmax: Softmax,
    scratch: &mut TileScratch,
    want: &[f32],
    what: &str,
) {
    let keys: Vec<&[E]> = k.iter().map(Vec::as_slice).collect();
    let values: Vec<&[E]> = v.iter().map(Vec::as_slice).collect();
    let pages = HeadPages {
        keys: &keys,
        values: &values,
        width,
    };
    let mut got = vec![0f32; want.len()];
    attend_tile_at(level, tile, &pages, softmax, scratch, &mut got);
    assert!(
        got.iter()
            .zip(want)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "{level:?} f16={} {what}",
        E::IS_F16
    );
}

#[test]
fn every_width_equals_attention_written_plainly() {
    let mut seed = 3;
    // (rows, first_ctx, group, hd, width)
    let cases = [
        // One-token chunks (decode), a ragged last page, GQA groups.
        (1, 1, 3, 64, 16),
        (1, 7, 3, 64, 16),
        (1, 70, 3, 64, 16),
        (1, 16, 1, 64, 16),
        (1, 33, 8, 64, 16),
        // Chunks whose rows end inside and at page boundaries.
        (2, 1, 3, 64, 16),
        (5, 12, 3, 64, 16),
        (8, 9, 3, 64, 16),
        (16, 17, 3, 64, 16),
        (7, 40, 2, 64, 16),
        // Several value tiles, the last one ragged.
        (3, 1100, 3, 64, 16),
        (1, 1030, 3, 64, 16),
        // Other page widths and head dimensions.
        (4, 21, 3, 64, 32),
        (3, 13, 3, 64, 12),
        (3, 25, 2, 32, 16),
        (2, 9, 3, 24, 8),
        (2, 19, 1, 72, 16),
        // Past the padded partial vector's bounds (the scalar path takes
        // the last slots): a 160-dimension head, and 66 pairs.
        (1, 21, 3, 160, 16),
        (22, 5, 3, 64, 16),
    ];
    for case in cases {
        for order in [SumOrder::Sgemm, SumOrder::VecDot] {
            check(case, order, &mut seed);
        }
    }
}

#[test]
fn the_stale_tail_of_the_last_page_is_never_read() {
    // `Context::pages` fills every slot past the context with NaN: one
    // read of it would make every output NaN and the comparison fail.
    let mut seed = 11;
    for first_ctx in [1, 5, 15, 17, 31] {
        for rows in [1, 3] {
            let order = if rows == 1 {
                SumOrder::VecDot
            } else {
                SumOrder::Sgemm
            };
            check((rows, first_ctx, 3, 64, 16), order, &mut seed);
        }
    }
}
