//! Blocked attention over KV pages: a tile of consecutive query rows of one
//! sequence, times the query heads that share one KV head, against that
//! head's pages, summed in exactly the orders llama.cpp's CPU build uses
//! (`SumOrder`), for f16 or f32 page memory, with AVX-512 and AVX2 kernels
//! (`simd`) and a scalar path that defines the result.
//!
//! # Blocking
//! A tile is `rows × group` (row, head) pairs. Scores go page by page: each
//! key page (`[hd][width]`, 2 KiB for the default model) is loaded from
//! memory once for the whole tile and every pair is computed against it
//! from L1, several pairs (and on AVX2 two vectors of slots) per key
//! vector load, each lane's chain in a register and stored when done.
//! Softmax then runs per pair over that row's own context, in one fused
//! set of passes ([`crate::ops::attention_softmax`]). Values go in token
//! tiles of [`VALUE_TILE`] tokens: within a tile, each lane's chain walks
//! the value rows page by page, every row loaded once for several pairs,
//! with one independent accumulator chain per (pair, vector); the tile's
//! rows stay in cache for the next pairs, and the lane accumulators are
//! kept in f32 between tiles. K and V traffic from memory so falls by the
//! number of rows in a tile, and the f16 conversions by the pairs that
//! share each load. A one-row decode tile goes in value tiles too, so its
//! lanes (whose rows lie pages apart) sweep L2, not DRAM.
//!
//! A sequence's pages are not adjacent in memory, so the hardware
//! prefetchers do not follow a sweep: the kernel asks for the next key page
//! in L1 and the one [`KEY_PAGES_AHEAD`] further in L2, for the first value
//! pages in L2 while keys are scored, and for each value tile a tile ahead.
//!
//! # Numerics
//! Blocking shares loads and interleaves independent chains; it never
//! reorders one sum. A score is summed with dimension `d` in lane
//! `d % lanes` in ascending order and the lanes combined by
//! [`SumOrder::combine`]'s tree; an output dimension with token `t` in lane
//! `t % lanes`, ascending (a tile boundary stores the lane in f32 and
//! reloads it, which is exact), combined the same way. Every width computes
//! exactly these operations, so AVX-512, AVX2 and scalar agree bit for bit,
//! and with f16-rounded inputs they equal llama.cpp's.
//!
//! No kernel reads a key or value slot at or past the tile's last context
//! length: AVX-512 loads are masked, AVX2 takes whole groups of eight and
//! scores the rest from a zero-padded copy of just those slots (the scalar
//! path takes them past 128 head dimensions or 64 pairs), and value chains
//! stop at each pair's own context. The caller hands in only pages it has checked.

mod simd;

use crate::SimdLevel;
use crate::ops::attention_softmax;
pub use crate::sum_order::{LANES, SumOrder, reduce16};

/// Tokens a value tile spans (a multiple of every order's lanes).
pub const VALUE_TILE: usize = 512;

/// Key pages between the page being scored and the one prefetched into L2.
const KEY_PAGES_AHEAD: usize = 4;

/// Bytes of value pages prefetched into L2 while the keys are scored.
const VALUE_PREFETCH_BYTES: usize = 256 << 10;

/// An element type of KV page memory: `f32`, or `half::f16` as llama.cpp's
/// default cache stores keys and values.
pub trait KvElement: Copy + Send + Sync + 'static {
    /// Whether the element is an IEEE half (selects the SIMD loads).
    const IS_F16: bool;
    /// Zero.
    const ZERO: Self;
    /// The value as f32 (exact for both types).
    fn to_f32(self) -> f32;
}

impl KvElement for f32 {
    const IS_F16: bool = false;
    const ZERO: Self = 0.0;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl KvElement for half::f16 {
    const IS_F16: bool = true;
    const ZERO: Self = half::f16::ZERO;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
}

/// One KV head's pages as attention reads them, in token order.
#[derive(Debug, Clone, Copy)]
pub struct HeadPages<'a, E> {
    /// Per page, the head's keys dimension-major: `[head_dim][width]`.
    pub keys: &'a [&'a [E]],
    /// Per page, the head's values token-major: `[width][head_dim]`.
    pub values: &'a [&'a [E]],
    /// Tokens per page.
    pub width: usize,
}

/// Consecutive query rows of one sequence, and the query heads of each row
/// that share one KV head.
#[derive(Debug, Clone, Copy)]
pub struct QueryTile<'a> {
    /// Row `r`'s queries of head `g` are `q[r * row_stride + g * hd..][..hd]`
    /// (f16-rounded where the cache is f16).
    pub q: &'a [f32],
    /// Distance between two rows' queries in `q`.
    pub row_stride: usize,
    /// Query rows (at consecutive positions).
    pub rows: usize,
    /// Query heads per KV head.
    pub group: usize,
    /// Dimension of one head.
    pub hd: usize,
    /// Tokens row 0 attends to, itself included; row `r` attends to
    /// `first_ctx + r`.
    pub first_ctx: usize,
    /// The summation order of every dot product.
    pub order: SumOrder,
}

impl QueryTile<'_> {
    fn pairs(&self) -> usize {
        self.rows * self.group
    }

    fn last_ctx(&self) -> usize {
        self.first_ctx + self.rows - 1
    }

    /// Tokens pair `p` (row `p / group`) attends to.
    fn ctx(&self, p: usize) -> usize {
        self.first_ctx + p / self.group
    }

    /// Offset of pair `p`'s queries in `q`.
    fn q_at(&self, p: usize) -> usize {
        (p / self.group) * self.row_stride + (p % self.group) * self.hd
    }
}

/// How scores become probabilities.
#[derive(Debug, Clone, Copy)]
pub struct Softmax {
    /// Factor applied to every score first (`1 / sqrt(head_dim)`).
    pub scale: f32,
    /// Whether probabilities are rounded to f16 before weighting values
    /// (llama.cpp's default attention on an f16 cache).
    pub round_f16: bool,
}

/// Buffers a tile works in, reused from tile to tile.
#[derive(Debug, Default)]
pub struct TileScratch {
    scores: Vec<f32>,
    lanes: Vec<f32>,
}

/// Attention of `tile` over `pages`: pair `p = r * group + g` writes its
/// `hd` outputs to `out[p * hd..]`. Pages past the last row's context are
/// not read; neither is any slot of the last page past it.
///
/// # Panics
/// If the shapes do not fit (too few pages, short slices, empty tile).
pub fn attend_tile<E: KvElement>(
    tile: &QueryTile<'_>,
    pages: &HeadPages<'_, E>,
    softmax: Softmax,
    scratch: &mut TileScratch,
    out: &mut [f32],
) {
    attend_tile_at(crate::cpu::simd_level(), tile, pages, softmax, scratch, out);
}

/// [`attend_tile`] with the kernels of `level` (tests run every width).
pub(crate) fn attend_tile_at<E: KvElement>(
    level: SimdLevel,
    tile: &QueryTile<'_>,
    pages: &HeadPages<'_, E>,
    softmax: Softmax,
    scratch: &mut TileScratch,
    out: &mut [f32],
) {
    let (hd, w) = (tile.hd, pages.width);
    assert!(
        tile.rows > 0 && tile.group > 0 && hd > 0 && w > 0 && tile.first_ctx > 0,
        "attend_tile: empty tile"
    );
    let pairs = tile.pairs();
    let n_pages = tile.last_ctx().div_ceil(w);
    assert!(
        pages.keys.len() >= n_pages
            && pages.values.len() >= n_pages
            && pages.keys[..n_pages].iter().all(|k| k.len() >= hd * w)
            && pages.values[..n_pages].iter().all(|v| v.len() >= hd * w)
            && tile.q.len() >= (tile.rows - 1) * tile.row_stride + tile.group * hd
            && out.len() >= pairs * hd,
        "attend_tile shapes"
    );
    let stride = n_pages * w;
    if scratch.scores.len() < pairs * stride {
        scratch.scores.resize(pairs * stride, 0.0);
    }
    let TileScratch { scores, lanes: acc } = scratch;
    let scores = &mut scores[..pairs * stride];
    #[cfg(target_arch = "x86_64")]
    let qs: Vec<*const f32> = (0..pairs)
        .map(|p| tile.q[tile.q_at(p)..].as_ptr())
        .collect();
    #[cfg(not(target_arch = "x86_64"))]
    let qs: Vec<*const f32> = Vec::new();
    // Value pages that come into L2 while the keys are scored: a sweep's
    // worth that L2 holds beside them (all of a decode row's 2k context).
    let early_values = (VALUE_PREFETCH_BYTES / (hd * w * std::mem::size_of::<E>())).max(1);
    for (pi, keys) in pages.keys[..n_pages].iter().enumerate() {
        // Key pages are on their way from memory while this one is scored
        // (the pages of a sequence are not adjacent in memory, so the
        // hardware prefetchers do not follow them): the next into L1, one
        // further ahead into L2, which one page's scoring is too short to
        // cover from DRAM.
        if let Some(next) = pages.keys[..n_pages].get(pi + 1) {
            prefetch(&next[..hd * w], Level::L1);
        }
        if let Some(ahead) = pages.keys[..n_pages].get(pi + KEY_PAGES_AHEAD) {
            prefetch(&ahead[..hd * w], Level::L2);
        }
        if pi < early_values {
            prefetch(&pages.values[pi][..hd * w], Level::L2);
        }
        let m = w.min(tile.last_ctx() - pi * w);
        page_scores(level, tile, &qs, keys, PageAt { pi, w, m }, scores, stride);
    }
    // Value tiles for every tile shape: a decode row's lanes sweep the
    // tile's pages from L2 (prefetched one tile ahead), not its whole
    // context from DRAM, where each lane's rows lie pages apart. A tile
    // boundary stores each lane in f32 and reloads it, which is exact.
    let span_tokens = VALUE_TILE;
    // The first value tile comes in while the scores become probabilities.
    let ahead = VALUE_TILE;
    prefetch_values(
        &pages.values[..n_pages],
        0..ahead.min(tile.last_ctx()),
        hd,
        w,
    );
    for p in 0..pairs {
        let sc = &mut scores[p * stride..p * stride + tile.ctx(p)];
        attention_softmax(sc, softmax.scale, softmax.round_f16);
    }
    let lanes = tile.order.lanes();
    if acc.len() < pairs * lanes * hd {
        acc.resize(pairs * lanes * hd, 0.0);
    }
    let acc = &mut acc[..pairs * lanes * hd];
    let values = &pages.values[..n_pages];
    let mut lo = 0;
    while lo < tile.last_ctx() {
        let hi = (lo + span_tokens).min(tile.last_ctx());
        // The next value tile comes in while this one is summed.
        prefetch_values(values, hi..(hi + ahead).min(tile.last_ctx()), hd, w);
        let span = Span {
            lo,
            hi,
            width: w,
            hd,
            lanes,
        };
        tile_values(level, tile, values, span, scores, stride, acc);
        lo = hi;
    }
    reduce_lanes(level, tile.order, pairs, hd, acc, out);
}

/// The cache level a prefetch brings its lines to.
#[derive(Debug, Clone, Copy)]
enum Level {
    L1,
    L2,
}

/// Asks the CPU to bring `data` into cache; a hint, without effect on
/// results (and none off x86-64).
#[inline]
fn prefetch<E>(data: &[E], level: Level) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _MM_HINT_T1, _mm_prefetch};
        let (p, bytes) = (data.as_ptr().cast::<i8>(), std::mem::size_of_val(data));
        for off in (0..bytes).step_by(64) {
            // SAFETY: a prefetch reads nothing and cannot fault; the
            // address lies within `data`.
            unsafe {
                match level {
                    Level::L1 => _mm_prefetch::<_MM_HINT_T0>(p.add(off)),
                    Level::L2 => _mm_prefetch::<_MM_HINT_T1>(p.add(off)),
                }
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (data, level);
}

/// Prefetches (to L2) the value rows of `tokens` from pages of `w` rows
/// of `hd` values.
fn prefetch_values<E>(values: &[&[E]], tokens: std::ops::Range<usize>, hd: usize, w: usize) {
    if tokens.is_empty() {
        return;
    }
    for page in tokens.start / w..tokens.end.div_ceil(w) {
        let lo = tokens.start.max(page * w) - page * w;
        let hi = tokens.end.min((page + 1) * w) - page * w;
        if let Some(rows) = values.get(page).and_then(|v| v.get(lo * hd..hi * hd)) {
            prefetch(rows, Level::L2);
        }
    }
}

/// Where one key page sits: page `pi` of `w` slots, of which `m` count.
#[derive(Debug, Clone, Copy)]
struct PageAt {
    pi: usize,
    w: usize,
    m: usize,
}

/// Scores of every pair against slots `0..m` of one key page, into
/// `scores[p * stride + pi * w + t]`: the SIMD kernels (and, on AVX2, their
/// zero-padded copy of a last partial vector), the scalar sum for what
/// they leave.
fn page_scores<F: KvElement>(
    level: SimdLevel,
    tile: &QueryTile<'_>,
    qs: &[*const f32],
    keys: &[F],
    at: PageAt,
    scores: &mut [f32],
    stride: usize,
) {
    let (hd, PageAt { pi, w, m }) = (tile.hd, at);
    assert!(keys.len() >= hd * w && scores.len() >= (tile.pairs() - 1) * stride + pi * w + m);
    #[cfg(target_arch = "x86_64")]
    let done = {
        let page = simd::KeyPage {
            k: keys.as_ptr(),
            width: w,
            hd,
            m,
        };
        let out = scores[pi * w..].as_mut_ptr();
        // SAFETY: each query pointer has `hd` values; pair `p`'s slots
        // `p * stride + pi * w..+ m` lie in `scores` (asserted); the key
        // page holds `hd` rows of `w`; kernels read slots below `m`.
        unsafe {
            match level {
                SimdLevel::Avx512 => simd::avx512::page_scores(qs, &page, tile.order, out, stride),
                SimdLevel::Avx2 => simd::avx2::page_scores(qs, &page, tile.order, out, stride),
                SimdLevel::Scalar => 0,
            }
        }
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = {
        let _ = (level, qs);
        0
    };
    for p in 0..tile.pairs() {
        let q = &tile.q[tile.q_at(p)..tile.q_at(p) + hd];
        for t in done..m {
            scores[p * stride + pi * w + t] = score(q, keys, w, t, tile.order);
        }
    }
}

/// The tokens `lo..hi` of one value tile and the shapes around them.
#[derive(Debug, Clone, Copy)]
struct Span {
    lo: usize,
    hi: usize,
    width: usize,
    hd: usize,
    lanes: usize,
}

/// One score as the library sums it: `q[d] · k[d][t]`, dimension `d` into
/// lane `d % lanes`, the lanes combined by the order's tree.
fn score<E: KvElement>(q: &[f32], k: &[E], width: usize, t: usize, order: SumOrder) -> f32 {
    let lanes = order.lanes();
    let mut acc = [0f32; LANES];
    for (d, qd) in q.iter().enumerate() {
        let kv = k[d * width + t].to_f32();
        acc[d % lanes] = if d < lanes {
            qd * kv
        } else {
            qd.mul_add(kv, acc[d % lanes])
        };
    }
    order.combine(&acc)
}

/// The lane accumulators of every pair over the tokens of `span`: pair `p`'s
/// lane `l` at `acc[(p * lanes + l) * hd..][..hd]` sums `w_p[t] · v_t` over
/// its tokens `t ≡ l (mod lanes)`, `t < ctx(p)`, ascending; the first term
/// of a lane is a product, and a lane with no term is zero.
fn tile_values<E: KvElement>(
    level: SimdLevel,
    tile: &QueryTile<'_>,
    values: &[&[E]],
    span: Span,
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
) {
    let (pairs, hd, lanes) = (tile.pairs(), span.hd, span.lanes);
    #[cfg(target_arch = "x86_64")]
    if level >= SimdLevel::Avx2 && hd.is_multiple_of(8) {
        let rows: Vec<*const E> = values.iter().map(|v| v.as_ptr()).collect();
        let ws: Vec<*const f32> = (0..pairs).map(|p| weights[p * stride..].as_ptr()).collect();
        let ns: Vec<usize> = (0..pairs).map(|p| tile.ctx(p)).collect();
        let accs: Vec<*mut f32> = (0..pairs)
            .map(|p| acc[p * lanes * hd..].as_mut_ptr())
            .collect();
        let v = simd::ValueTile {
            rows: &rows,
            width: span.width,
            hd,
            lo: span.lo,
            hi: span.hi,
            lanes,
        };
        // SAFETY: every page holds `width` rows of `hd` values; each pair's
        // weights cover its context and its accumulators `lanes × hd`; the
        // kernels read rows only below each pair's context.
        unsafe {
            match level {
                SimdLevel::Avx512 if hd.is_multiple_of(16) => {
                    simd::avx512::tile_values(&v, &ws, &ns, &accs);
                    return;
                }
                _ => {
                    simd::avx2::tile_values(&v, &ws, &ns, &accs);
                    return;
                }
            }
        }
    }
    let _ = level;
    for p in 0..pairs {
        let n = tile.ctx(p).min(span.hi);
        let w = &weights[p * stride..];
        for l in 0..lanes {
            let lane = &mut acc[(p * lanes + l) * hd..(p * lanes + l + 1) * hd];
            if span.lo == 0 {
                lane.fill(0.0);
            }
            let mut t = span.lo + l;
            while t < n {
                let row = &values[t / span.width][(t % span.width) * hd..][..hd];
                for (a, v) in lane.iter_mut().zip(row) {
                    *a = if t < lanes {
                        w[t] * v.to_f32()
                    } else {
                        w[t].mul_add(v.to_f32(), *a)
                    };
                }
                t += lanes;
            }
        }
    }
}

/// Each pair's output: its lanes combined by the order's tree, one output
/// dimension at a time.
fn reduce_lanes(
    level: SimdLevel,
    order: SumOrder,
    pairs: usize,
    hd: usize,
    acc: &[f32],
    out: &mut [f32],
) {
    let lanes = order.lanes();
    #[cfg(target_arch = "x86_64")]
    if level >= SimdLevel::Avx2 && hd.is_multiple_of(8) {
        assert!(acc.len() >= pairs * lanes * hd && out.len() >= pairs * hd);
        let (acc, out) = (acc.as_ptr(), out.as_mut_ptr());
        // SAFETY: `acc` holds `pairs × lanes × hd` sums and `out` `pairs ×
        // hd`; AVX-512 takes whole vectors of sixteen.
        unsafe {
            if level == SimdLevel::Avx512 && hd.is_multiple_of(16) {
                simd::avx512::reduce_lanes(order, pairs, hd, acc, out);
            } else {
                simd::avx2::reduce_lanes(order, pairs, hd, acc, out);
            }
        }
        return;
    }
    let _ = level;
    for p in 0..pairs {
        for d in 0..hd {
            let l: [f32; LANES] = std::array::from_fn(|l| {
                if l < lanes {
                    acc[(p * lanes + l) * hd + d]
                } else {
                    0.0
                }
            });
            out[p * hd + d] = order.combine(&l);
        }
    }
}

#[cfg(test)]
mod tests;
