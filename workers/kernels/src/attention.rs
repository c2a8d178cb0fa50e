//! Attention over KV pages: scores of queries against keys, softmax-weighted
//! sums of values, summed in exactly the orders llama.cpp's CPU build uses
//! (`SumOrder`), for f16 or f32 page memory, with AVX-512 and AVX2 kernels
//! and a scalar path that defines the result.
//!
//! The query heads that share one KV head are computed together
//! ([`attention_scores_group`], [`attention_values_group`]): each key and value
//! row is loaded once for all of them. No kernel reads a slot past the ones it
//! is given, so the stale tail of a page is never read: AVX-512 loads are
//! masked, and AVX2 takes whole groups of eight and leaves the rest to the
//! scalar path.

/// The summation order of one of llama.cpp's f16 dot products, as its
/// AVX-512 build runs them. With f16-rounded inputs every product is exact
/// in f32, so following the same order gives bit-identical sums on any CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SumOrder {
    /// tinyBLAS (llamafile sgemm), used for two or more query rows: element
    /// `i` goes to lane `i % 16`, lanes combined as `_mm512_reduce_add_ps`.
    Sgemm,
    /// `ggml_vec_dot_f16`, used for a single query row: element `i` goes to
    /// accumulator `(i % 64) / 16`, lane `i % 16`.
    VecDot,
}

/// Accumulator lanes a [`SumOrder`] needs at most.
pub const LANES: usize = 64;

/// `_mm512_reduce_add_ps` as GCC defines it: halves added pairwise, 256,
/// then 128 bits, then `(l0 + l2) + (l1 + l3)`.
#[inline(always)]
pub fn reduce16(l: &[f32; 16]) -> f32 {
    let t3: [f32; 8] = std::array::from_fn(|j| l[j + 8] + l[j]);
    let t6: [f32; 4] = std::array::from_fn(|j| t3[j + 4] + t3[j]);
    (t6[0] + t6[2]) + (t6[1] + t6[3])
}

impl SumOrder {
    /// Number of partial sums.
    pub fn lanes(self) -> usize {
        match self {
            SumOrder::Sgemm => 16,
            SumOrder::VecDot => 64,
        }
    }

    /// Combines partial sums `l[..self.lanes()]` in the library's order.
    #[inline(always)]
    pub fn combine(self, l: &[f32; LANES]) -> f32 {
        match self {
            SumOrder::Sgemm => reduce16(&std::array::from_fn(|j| l[j])),
            // GGML_F32x16_REDUCE: (acc0 + acc2) + (acc1 + acc3), then reduce.
            SumOrder::VecDot => reduce16(&std::array::from_fn(|j| {
                (l[j] + l[32 + j]) + (l[16 + j] + l[48 + j])
            })),
        }
    }
}

/// An element type of KV page memory: `f32`, or `half::f16` as llama.cpp's
/// default cache stores keys and values.
pub trait KvElement: Copy + Send + Sync + 'static {
    /// Whether the element is an IEEE half (selects the SIMD loads).
    const IS_F16: bool;
    /// The value as f32 (exact for both types).
    fn to_f32(self) -> f32;
}

impl KvElement for f32 {
    const IS_F16: bool = false;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl KvElement for half::f16 {
    const IS_F16: bool = true;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
}

/// Attention scores of one query against one page of keys stored
/// dimension-major (`[dim][width]`): `out[t] = Σ_d q[d] · k[d, t]` for
/// `t < out.len()`, summed in `order` (dimension `d` into lane `d % lanes`).
/// Slots past `out.len()` are never read.
pub fn attention_scores<E: KvElement>(
    q: &[f32],
    k: &[E],
    width: usize,
    out: &mut [f32],
    order: SumOrder,
) {
    assert!(
        k.len() >= q.len() * width && out.len() <= width,
        "attention_scores shapes"
    );
    let mut t0 = 0;
    #[cfg(target_arch = "x86_64")]
    if attn_avx512::available() {
        while t0 < out.len() {
            let len = 16.min(out.len() - t0);
            // SAFETY: AVX-512 is present; the masked loads read only slots
            // t0..t0 + len < width of rows inside `k`.
            unsafe {
                attn_avx512::scores(
                    q,
                    k.as_ptr(),
                    width,
                    t0,
                    attn_avx512::mask(len),
                    order,
                    out[t0..].as_mut_ptr(),
                )
            };
            t0 += len;
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::simd_available() {
        while t0 + 8 <= out.len() {
            // SAFETY: AVX2, FMA and F16C are present; rows `d * width + t0
            // .. + 8` lie inside `k` because t0 + 8 <= out.len() <= width.
            unsafe {
                attn_avx2::scores(
                    q,
                    k.as_ptr(),
                    width,
                    t0,
                    attn_avx2::ALL,
                    order,
                    out[t0..].as_mut_ptr(),
                )
            };
            t0 += 8;
        }
    }
    let lanes = order.lanes();
    for t in t0..out.len() {
        let mut acc = [0f32; LANES];
        for (d, qd) in q.iter().enumerate() {
            let kv = k[d * width + t].to_f32();
            acc[d % lanes] = if d < lanes {
                qd * kv
            } else {
                qd.mul_add(kv, acc[d % lanes])
            };
        }
        out[t] = order.combine(&acc);
    }
}

/// Attention output of one query head: `out[d] = Σ_t p[t] · v_t[d]` over the
/// pages `values` (each `[width][head_dim]`, token-major), summed in `order`
/// (token `t` into lane `t % lanes`). Only tokens `t < p.len()` are read.
pub fn attention_values<E: KvElement>(
    p: &[f32],
    values: &[&[E]],
    width: usize,
    out: &mut [f32],
    order: SumOrder,
) {
    let hd = out.len();
    assert!(
        values.len() * width >= p.len() && values.iter().all(|v| v.len() >= width * hd),
        "attention_values shapes"
    );
    // Row of each token, computed once (no division in the inner loops).
    let rows: Vec<&[E]> = (0..p.len())
        .map(|t| &values[t / width][(t % width) * hd..(t % width + 1) * hd])
        .collect();
    let mut d0 = 0;
    #[cfg(target_arch = "x86_64")]
    {
        let ptrs: Vec<*const E> = rows.iter().map(|r| r.as_ptr()).collect();
        if attn_avx512::available() {
            while d0 + 16 <= hd {
                // SAFETY: AVX-512 is present; every row holds hd >= d0 + 16 values.
                unsafe { attn_avx512::values(p, &ptrs, d0, order, out[d0..].as_mut_ptr()) };
                d0 += 16;
            }
        }
        if crate::simd_available() {
            while d0 + 8 <= hd {
                // SAFETY: AVX2, FMA and F16C are present; every row holds hd >= d0 + 8 values.
                unsafe { attn_avx2::values(p, &ptrs, d0, order, out[d0..].as_mut_ptr()) };
                d0 += 8;
            }
        }
    }
    let lanes = order.lanes();
    for d in d0..hd {
        let mut acc = [0f32; LANES];
        for (t, pt) in p.iter().enumerate() {
            let v = rows[t][d].to_f32();
            acc[t % lanes] = if t < lanes {
                pt * v
            } else {
                pt.mul_add(v, acc[t % lanes])
            };
        }
        out[d] = order.combine(&acc);
    }
}

/// Query heads the grouped SIMD kernels handle in one pass; larger groups
/// take one head at a time.
pub const MAX_GROUP: usize = 8;

/// [`attention_scores`] for the `q.len() / hd` query heads that share one KV
/// head (grouped-query attention): each key row is loaded once for all of
/// them. Head `g` writes `out[g * out_stride..][..n]`.
#[allow(clippy::too_many_arguments)]
pub fn attention_scores_group<E: KvElement>(
    q: &[f32],
    hd: usize,
    k: &[E],
    width: usize,
    out: &mut [f32],
    out_stride: usize,
    n: usize,
    order: SumOrder,
) {
    let group = q.len() / hd;
    assert!(
        k.len() >= hd * width && n <= width && out.len() >= (group.max(1) - 1) * out_stride + n,
        "attention_scores_group shapes"
    );
    #[cfg(target_arch = "x86_64")]
    if group <= MAX_GROUP && attn_avx512::available() {
        let mut t0 = 0;
        while t0 < n {
            let len = 16.min(n - t0);
            // SAFETY: AVX-512 is present; the masked loads read only slots
            // t0..t0 + len < width of rows inside `k`; every head's output
            // row has room for n values.
            unsafe {
                attn_avx512::scores16_group(
                    q,
                    group,
                    hd,
                    k.as_ptr(),
                    width,
                    t0,
                    len,
                    order,
                    out.as_mut_ptr(),
                    out_stride,
                )
            };
            t0 += len;
        }
        return;
    }
    for g in 0..group {
        attention_scores(
            &q[g * hd..(g + 1) * hd],
            k,
            width,
            &mut out[g * out_stride..g * out_stride + n],
            order,
        );
    }
}

/// [`attention_values`] for `out.len() / hd` query heads sharing one KV
/// head: head `g`'s weights are `p[g * p_stride..][..n]`, its output
/// `out[g * hd..][..hd]`. Each value row is loaded once for all heads.
#[allow(clippy::too_many_arguments)]
pub fn attention_values_group<E: KvElement>(
    p: &[f32],
    p_stride: usize,
    n: usize,
    values: &[&[E]],
    width: usize,
    out: &mut [f32],
    hd: usize,
    order: SumOrder,
) {
    let group = out.len() / hd;
    assert!(
        values.len() * width >= n
            && values.iter().all(|v| v.len() >= width * hd)
            && p.len() >= (group.max(1) - 1) * p_stride + n,
        "attention_values_group shapes"
    );
    #[cfg(target_arch = "x86_64")]
    if group <= MAX_GROUP && hd.is_multiple_of(16) && attn_avx512::available() {
        let rows: Vec<*const E> = (0..n)
            .map(|t| values[t / width][(t % width) * hd..].as_ptr())
            .collect();
        for d0 in (0..hd).step_by(16) {
            // SAFETY: AVX-512 is present; every row holds hd >= d0 + 16
            // values; p and out have the rows the asserts above checked.
            unsafe {
                attn_avx512::values16_group(
                    p,
                    p_stride,
                    group,
                    &rows,
                    d0,
                    order,
                    out.as_mut_ptr(),
                    hd,
                )
            };
        }
        return;
    }
    for g in 0..group {
        attention_values(
            &p[g * p_stride..g * p_stride + n],
            values,
            width,
            &mut out[g * hd..(g + 1) * hd],
            order,
        );
    }
}

/// One vector width's kernels, written once for AVX-512 (sixteen f32 a
/// vector) and AVX2 (eight): the lane reduction, and one head's scores and
/// weighted values. The invoking module supplies `Mask`, `ALL`, `load` and
/// `store` for its width, and the target features as a string.
#[cfg(target_arch = "x86_64")]
macro_rules! width_kernels {
    ($features:literal, $v:ty, $zero:ident, $add:ident, $mul:ident, $splat:ident, $fma:ident) => {
        /// Reduces the library's partial sums (`lane[l]`, one vector of
        /// outputs at once) in `order`; see [`SumOrder::combine`].
        ///
        /// # Safety
        /// `lane[..order.lanes()]` must be initialized.
        #[inline(always)]
        unsafe fn reduce(order: SumOrder, lane: &[MaybeUninit<$v>; 64]) -> $v {
            unsafe {
                let at = |l: usize| lane[l].assume_init();
                let mut x = [$zero(); 16];
                for j in 0..16 {
                    x[j] = match order {
                        SumOrder::Sgemm => at(j),
                        SumOrder::VecDot => {
                            $add($add(at(j), at(32 + j)), $add(at(16 + j), at(48 + j)))
                        }
                    };
                }
                let mut t3 = [$zero(); 8];
                for i in 0..8 {
                    t3[i] = $add(x[i + 8], x[i]);
                }
                let mut t6 = [$zero(); 4];
                for i in 0..4 {
                    t6[i] = $add(t3[i + 4], t3[i]);
                }
                $add($add(t6[0], t6[2]), $add(t6[1], t6[3]))
            }
        }

        /// The library's sum of `w[i] · x(i)` over `i < w.len()`: term `i`
        /// into lane `i % lanes` (the first a product, the rest fused), the
        /// lanes combined by `reduce`.
        ///
        /// # Safety
        /// `x(i)` is safe to call for every `i < w.len()`.
        #[inline(always)]
        unsafe fn weighted(w: &[f32], order: SumOrder, x: impl Fn(usize) -> $v) -> $v {
            let lanes = order.lanes();
            // SAFETY: `i < w.len()` for every weight read; every lane below
            // `lanes` is written before `reduce` reads it.
            unsafe {
                let mut lane = [MaybeUninit::<$v>::uninit(); 64];
                for l in w.len().min(lanes)..lanes {
                    lane[l] = MaybeUninit::new($zero());
                }
                for l in 0..lanes.min(w.len()) {
                    let mut a = $mul($splat(*w.get_unchecked(l)), x(l));
                    let mut i = l + lanes;
                    while i < w.len() {
                        a = $fma($splat(*w.get_unchecked(i)), x(i), a);
                        i += lanes;
                    }
                    lane[l] = MaybeUninit::new(a);
                }
                reduce(order, &lane)
            }
        }

        /// One vector of scores: the tokens from `t0` that `mask` selects,
        /// of the page at `k`.
        ///
        /// # Safety
        /// The CPU has this module's features; `k` points to `q.len()` rows
        /// of `width` elements, of which the slots from `t0` that `mask`
        /// selects are readable; `out` is writable for those slots.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn scores<E: KvElement>(
            q: &[f32],
            k: *const E,
            width: usize,
            t0: usize,
            mask: Mask,
            order: SumOrder,
            out: *mut f32,
        ) {
            // SAFETY: the caller guarantees the selected slots of every row
            // exist.
            unsafe {
                let sum = weighted(q, order, |d| load(k.add(d * width + t0), mask));
                store(out, mask, sum);
            }
        }

        /// One vector of output dimensions from `d0` of the weighted sum of
        /// values.
        ///
        /// # Safety
        /// The CPU has this module's features; `rows` holds `p.len()`
        /// pointers, each with one vector of elements from `d0` readable;
        /// `out` is writable for one vector.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn values<E: KvElement>(
            p: &[f32],
            rows: &[*const E],
            d0: usize,
            order: SumOrder,
            out: *mut f32,
        ) {
            // SAFETY: the caller guarantees every row read exists.
            unsafe {
                let sum = weighted(p, order, |t| load(rows.get_unchecked(t).add(d0), ALL));
                store(out, ALL, sum);
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod attn_avx512 {
    use super::{KvElement, SumOrder};
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;
    use std::sync::OnceLock;

    /// Whether AVX-512 F/BW/VL is available (checked once).
    pub(super) fn available() -> bool {
        static AVX512: OnceLock<bool> = OnceLock::new();
        *AVX512.get_or_init(|| {
            is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("fma")
        })
    }

    /// Sixteen elements from `p` as f32; masked-off elements are not read.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VL and every element of `p` that `mask`
    /// selects is readable.
    #[inline(always)]
    unsafe fn load<E: KvElement>(p: *const E, mask: Mask) -> __m512 {
        unsafe {
            if E::IS_F16 {
                _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p.cast()))
            } else {
                _mm512_maskz_loadu_ps(mask, p.cast())
            }
        }
    }

    /// Which of a vector's sixteen slots an access touches.
    pub(super) type Mask = __mmask16;

    /// All sixteen slots.
    const ALL: Mask = 0xFFFF;

    /// The first `len` slots (all sixteen from 16 on).
    pub(super) fn mask(len: usize) -> Mask {
        if len >= 16 { ALL } else { (1u16 << len) - 1 }
    }

    /// Writes the slots of `v` that `mask` selects to `out`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F; the selected slots of `out` are writable.
    #[inline(always)]
    unsafe fn store(out: *mut f32, mask: Mask, v: __m512) {
        unsafe { _mm512_mask_storeu_ps(out, mask, v) }
    }

    width_kernels!(
        "avx512f,avx512bw,avx512vl,fma",
        __m512,
        _mm512_setzero_ps,
        _mm512_add_ps,
        _mm512_mul_ps,
        _mm512_set1_ps,
        _mm512_fmadd_ps
    );

    /// Scores of tokens `t0..t0 + len` for `group` heads sharing the keys.
    ///
    /// # Safety
    /// The CPU has the features of [`available`]; `q` holds `group × hd`
    /// values; `k` points to `hd` rows of `width` elements each, of which
    /// slots `t0..t0 + min(len, 16)` are readable; `out` is writable at
    /// `g × stride + t0 ..` for the same slots of every head `g < group`.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
    pub(super) unsafe fn scores16_group<E: KvElement>(
        q: &[f32],
        group: usize,
        hd: usize,
        k: *const E,
        width: usize,
        t0: usize,
        len: usize,
        order: SumOrder,
        out: *mut f32,
        stride: usize,
    ) {
        let mask = mask(len);
        // SAFETY: the caller guarantees every slot read and written exists.
        unsafe {
            weighted_group(
                (hd, group, order),
                |g, d| *q.get_unchecked(g * hd + d),
                |d| load(k.add(d * width + t0), mask),
                |g, sum| store(out.add(g * stride + t0), mask, sum),
            );
        }
    }

    /// Sixteen output dimensions from `d0` for `group` heads sharing the values.
    ///
    /// # Safety
    /// The CPU has the features of [`available`]; `p` holds `group` rows of
    /// `rows.len()` weights `p_stride` apart; every pointer in `rows` has
    /// elements `d0..d0 + 16` readable; `out` is writable at `g × hd + d0`
    /// for sixteen elements of every head `g < group`.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
    pub(super) unsafe fn values16_group<E: KvElement>(
        p: &[f32],
        p_stride: usize,
        group: usize,
        rows: &[*const E],
        d0: usize,
        order: SumOrder,
        out: *mut f32,
        hd: usize,
    ) {
        // SAFETY: the caller guarantees every row and weight read, and every
        // output written, exists.
        unsafe {
            weighted_group(
                (rows.len(), group, order),
                |g, t| *p.get_unchecked(g * p_stride + t),
                |t| load(rows.get_unchecked(t).add(d0), ALL),
                |g, sum| store(out.add(g * hd + d0), ALL, sum),
            );
        }
    }

    /// For each head `g < group`, the library's sum of `w(g, i) · x(i)` over
    /// `i < n`, term `i` into lane `i % lanes` as [`weighted`] sums one
    /// head's, given to `put(g, sum)`; each `x(i)` is loaded once for all
    /// heads.
    ///
    /// # Safety
    /// `group <= MAX_GROUP`; `w(g, i)` and `x(i)` are safe to call for every
    /// `g < group` and `i < n`, and `put(g, _)` for every `g < group`.
    #[inline(always)]
    unsafe fn weighted_group(
        (n, group, order): (usize, usize, SumOrder),
        w: impl Fn(usize, usize) -> f32,
        x: impl Fn(usize) -> __m512,
        put: impl Fn(usize, __m512),
    ) {
        let lanes = order.lanes();
        // SAFETY: every lane below `lanes` of every head is written before
        // `reduce` reads it.
        unsafe {
            let mut lane = [[MaybeUninit::<__m512>::uninit(); 64]; super::MAX_GROUP];
            for l in 0..lanes {
                if l >= n {
                    for head in lane.iter_mut().take(group) {
                        head[l] = MaybeUninit::new(_mm512_setzero_ps());
                    }
                    continue;
                }
                let v = x(l);
                let mut a = [_mm512_setzero_ps(); super::MAX_GROUP];
                for g in 0..group {
                    a[g] = _mm512_mul_ps(_mm512_set1_ps(w(g, l)), v);
                }
                let mut i = l + lanes;
                while i < n {
                    let v = x(i);
                    for g in 0..group {
                        a[g] = _mm512_fmadd_ps(_mm512_set1_ps(w(g, i)), v, a[g]);
                    }
                    i += lanes;
                }
                for g in 0..group {
                    lane[g][l] = MaybeUninit::new(a[g]);
                }
            }
            for g in 0..group {
                put(g, reduce(order, &lane[g]));
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod attn_avx2 {
    use super::{KvElement, SumOrder};
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;

    /// AVX2 has no masked access: every call touches all eight slots.
    pub(super) type Mask = ();

    /// All eight slots.
    pub(super) const ALL: Mask = ();

    /// Eight elements from `p` as f32.
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C, and eight elements from `p` are readable.
    #[inline(always)]
    unsafe fn load<E: KvElement>(p: *const E, _: Mask) -> __m256 {
        unsafe {
            if E::IS_F16 {
                _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
            } else {
                _mm256_loadu_ps(p.cast())
            }
        }
    }

    /// Writes the eight slots of `v` to `out`.
    ///
    /// # Safety
    /// The CPU has AVX; eight elements from `out` are writable.
    #[inline(always)]
    unsafe fn store(out: *mut f32, _: Mask, v: __m256) {
        unsafe { _mm256_storeu_ps(out, v) }
    }

    width_kernels!(
        "avx2,fma,f16c",
        __m256,
        _mm256_setzero_ps,
        _mm256_add_ps,
        _mm256_mul_ps,
        _mm256_set1_ps,
        _mm256_fmadd_ps
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::round_f16_slice;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// The attention sums written plainly: lanes as the order defines them.
    fn reference_scores(q: &[f32], k: &[f32], width: usize, n: usize, order: SumOrder) -> Vec<f32> {
        (0..n)
            .map(|t| {
                let mut acc = [0f32; LANES];
                let lanes = order.lanes();
                for (d, qd) in q.iter().enumerate() {
                    let lane = d % lanes;
                    acc[lane] = if d < lanes {
                        qd * k[d * width + t]
                    } else {
                        qd.mul_add(k[d * width + t], acc[lane])
                    };
                }
                order.combine(&acc)
            })
            .collect()
    }

    #[test]
    fn simd_attention_is_bit_identical_to_the_plain_sums() {
        let mut seed = 3;
        let (hd, width) = (64, 16);
        for order in [SumOrder::Sgemm, SumOrder::VecDot] {
            for n in [1, 5, 8, 13, 16] {
                let mut q: Vec<f32> = (0..hd).map(|_| lcg(&mut seed) * 4.0).collect();
                round_f16_slice(&mut q);
                let k16: Vec<half::f16> = (0..hd * width)
                    .map(|_| half::f16::from_f32(lcg(&mut seed) * 3.0))
                    .collect();
                let k32: Vec<f32> = k16.iter().map(|x| x.to_f32()).collect();
                let want = reference_scores(&q, &k32, width, n, order);
                let mut got16 = vec![0f32; n];
                let mut got32 = vec![0f32; n];
                attention_scores(&q, &k16, width, &mut got16, order);
                attention_scores(&q, &k32, width, &mut got32, order);
                assert_eq!(got16, want, "{order:?} n={n} f16");
                assert_eq!(got32, want, "{order:?} n={n} f32");

                // Values: tokens over two pages, token-major rows.
                let ctx = n + width;
                let v32: Vec<f32> = (0..2 * width * hd)
                    .map(|_| half::f16::from_f32(lcg(&mut seed)).to_f32())
                    .collect();
                let v16: Vec<half::f16> = v32.iter().map(|x| half::f16::from_f32(*x)).collect();
                let mut p: Vec<f32> = (0..ctx).map(|_| lcg(&mut seed).abs()).collect();
                round_f16_slice(&mut p);
                let want: Vec<f32> = (0..hd)
                    .map(|d| {
                        let mut acc = [0f32; LANES];
                        let lanes = order.lanes();
                        for (t, pt) in p.iter().enumerate() {
                            let v = v32[t * hd + d];
                            acc[t % lanes] = if t < lanes {
                                pt * v
                            } else {
                                pt.mul_add(v, acc[t % lanes])
                            };
                        }
                        order.combine(&acc)
                    })
                    .collect();
                let (mut out16, mut out32) = (vec![0f32; hd], vec![0f32; hd]);
                attention_values(
                    &p,
                    &[&v16[..width * hd], &v16[width * hd..]],
                    width,
                    &mut out16,
                    order,
                );
                attention_values(
                    &p,
                    &[&v32[..width * hd], &v32[width * hd..]],
                    width,
                    &mut out32,
                    order,
                );
                assert_eq!(out16, want, "{order:?} ctx={ctx} values f16");
                assert_eq!(out32, want, "{order:?} ctx={ctx} values f32");
            }
        }
    }

    #[test]
    fn avx2_attention_equals_the_dispatched_path() {
        #[cfg(target_arch = "x86_64")]
        if crate::simd_available() {
            let mut seed = 9;
            let (hd, width) = (64, 16);
            for order in [SumOrder::Sgemm, SumOrder::VecDot] {
                let mut q: Vec<f32> = (0..hd).map(|_| lcg(&mut seed) * 4.0).collect();
                round_f16_slice(&mut q);
                let k: Vec<half::f16> = (0..hd * width)
                    .map(|_| half::f16::from_f32(lcg(&mut seed)))
                    .collect();
                let mut want = vec![0f32; width];
                attention_scores(&q, &k, width, &mut want, order);
                let mut got = vec![0f32; width];
                for t0 in [0, 8] {
                    unsafe {
                        attn_avx2::scores(
                            &q,
                            k.as_ptr(),
                            width,
                            t0,
                            attn_avx2::ALL,
                            order,
                            got[t0..].as_mut_ptr(),
                        )
                    };
                }
                assert_eq!(got, want, "{order:?} scores");
                let p: Vec<f32> = (0..width).map(|_| lcg(&mut seed).abs()).collect();
                let rows: Vec<*const half::f16> =
                    (0..width).map(|t| k[t * hd..].as_ptr()).collect();
                let mut want = vec![0f32; hd];
                attention_values(&p, &[&k[..]], width, &mut want, order);
                let mut got = vec![0f32; hd];
                for d0 in (0..hd).step_by(8) {
                    unsafe { attn_avx2::values(&p, &rows, d0, order, got[d0..].as_mut_ptr()) };
                }
                assert_eq!(got, want, "{order:?} values");
            }
        }
    }

    #[test]
    fn grouped_attention_equals_one_head_at_a_time() {
        let mut seed = 5;
        let (hd, width, group) = (64, 16, 3);
        for order in [SumOrder::Sgemm, SumOrder::VecDot] {
            for n in [3, 16] {
                let mut q: Vec<f32> = (0..group * hd).map(|_| lcg(&mut seed) * 4.0).collect();
                round_f16_slice(&mut q);
                let k: Vec<half::f16> = (0..hd * width)
                    .map(|_| half::f16::from_f32(lcg(&mut seed)))
                    .collect();
                let stride = 20;
                let mut grouped = vec![0f32; group * stride];
                attention_scores_group(&q, hd, &k, width, &mut grouped, stride, n, order);
                for g in 0..group {
                    let mut one = vec![0f32; n];
                    attention_scores(&q[g * hd..(g + 1) * hd], &k, width, &mut one, order);
                    assert_eq!(
                        &grouped[g * stride..g * stride + n],
                        &one[..],
                        "{order:?} scores head {g}"
                    );
                }
                let v: Vec<half::f16> = (0..width * hd)
                    .map(|_| half::f16::from_f32(lcg(&mut seed)))
                    .collect();
                let p: Vec<f32> = (0..group * stride).map(|_| lcg(&mut seed).abs()).collect();
                let mut out = vec![0f32; group * hd];
                attention_values_group(&p, stride, n, &[&v[..]], width, &mut out, hd, order);
                for g in 0..group {
                    let mut one = vec![0f32; hd];
                    attention_values(
                        &p[g * stride..g * stride + n],
                        &[&v[..]],
                        width,
                        &mut one,
                        order,
                    );
                    assert_eq!(
                        &out[g * hd..(g + 1) * hd],
                        &one[..],
                        "{order:?} values head {g}"
                    );
                }
            }
        }
    }
}
