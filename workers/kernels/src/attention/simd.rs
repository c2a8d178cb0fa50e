//! The SIMD kernels of blocked attention, written once by `width_kernels!`
//! for AVX-512 (sixteen f32 a vector) and AVX2 (eight): a vector of scores
//! for several (row, head) pairs against one key page, the lane chains of
//! several pairs over a value tile, and the lane reduction. Each width
//! module supplies its `Mask`, `load` and `store`.
//!
//! Both widths have the same structure: every key or value vector is loaded
//! (and converted from f16) once for all the pairs of a call, and each pair
//! keeps its own accumulators, so the chains are independent and no sum is
//! reordered.

/// One key page of one KV head: `hd` rows of `width` slots, of which the
/// first `m` may be read.
#[derive(Debug, Clone, Copy)]
pub(super) struct KeyPage<E> {
    pub(super) k: *const E,
    pub(super) width: usize,
    pub(super) hd: usize,
    pub(super) m: usize,
}

/// A value tile: tokens `lo..hi` of pages `rows` (each `width` rows of `hd`
/// values, token-major), summed into `lanes` lanes.
#[derive(Debug, Clone, Copy)]
pub(super) struct ValueTile<'a, E> {
    pub(super) rows: &'a [*const E],
    pub(super) width: usize,
    pub(super) hd: usize,
    pub(super) lo: usize,
    pub(super) hi: usize,
    pub(super) lanes: usize,
}

/// Calls `$f::<E, N, ..>` with the first `N = $n` entries of each slice as
/// arrays, for `$n` from 1 to 6.
macro_rules! by_count {
    ($n:expr, $f:ident :: <$e:ty $(, $extra:tt)*> ($($before:expr),*; $($arr:expr),+; $($after:expr),*)) => {
        match $n {
            1 => by_count!(@call 1, $f, $e, ($($extra),*), ($($before),*), ($($arr),+), ($($after),*)),
            2 => by_count!(@call 2, $f, $e, ($($extra),*), ($($before),*), ($($arr),+), ($($after),*)),
            3 => by_count!(@call 3, $f, $e, ($($extra),*), ($($before),*), ($($arr),+), ($($after),*)),
            4 => by_count!(@call 4, $f, $e, ($($extra),*), ($($before),*), ($($arr),+), ($($after),*)),
            5 => by_count!(@call 5, $f, $e, ($($extra),*), ($($before),*), ($($arr),+), ($($after),*)),
            _ => by_count!(@call 6, $f, $e, ($($extra),*), ($($before),*), ($($arr),+), ($($after),*)),
        }
    };
    (@call $n:literal, $f:ident, $e:ty, ($($extra:tt),*), ($($before:expr),*), ($($arr:expr),+), ($($after:expr),*)) => {
        $f::<$e, $n $(, $extra)*>($($before,)* $(&std::array::from_fn(|i| $arr[i]),)+ $($after),*)
    };
}

#[cfg(target_arch = "x86_64")]
macro_rules! width_kernels {
    (
        $features:literal, $v:ty, $w:literal,
        $zero:ident, $add:ident, $mul:ident, $splat:ident, $fma:ident, $loadf:ident, $storef:ident,
        score_pairs: $sp:literal, score_vectors: $snt:literal,
        value_pairs: $vp:literal, value_vectors: $nv:literal
    ) => {
        use super::{KeyPage, ValueTile};
        use crate::attention::{KvElement, SumOrder};
        use std::mem::MaybeUninit;

        /// f32 values in a vector.
        const W: usize = $w;

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

        /// Scores of `P` pairs for `NT` vectors of slots from `t0` (the
        /// last vector limited by `mask`): each lane's chain runs in
        /// registers with every key vector loaded once for all pairs; the
        /// sixteen inputs of the order's final tree are stored, then
        /// combined.
        ///
        /// # Safety
        /// The CPU has this module's features; as [`page_scores`], and the
        /// `NT` vectors from `t0` lie below `pg.m` (the last as `mask`
        /// selects).
        #[target_feature(enable = $features)]
        unsafe fn scores_block<
            E: KvElement,
            const P: usize,
            const NT: usize,
            const VEC_DOT: bool,
        >(
            pg: &KeyPage<E>,
            t0: usize,
            mask: Mask,
            q: &[*const f32; P],
            out: &[*mut f32; P],
        ) {
            let part = |j: usize| if j + 1 == NT { mask } else { ALL };
            // The chain of lane `l` for every pair and vector: dimensions
            // `d ≡ l (mod lanes)`, ascending, the first a product; zero
            // where `l >= hd`.
            // SAFETY: the caller guarantees every slot read.
            let chain = |l: usize, lanes: usize| unsafe {
                let mut a = [[$zero(); NT]; P];
                if l < pg.hd {
                    let mut k = [$zero(); NT];
                    for j in 0..NT {
                        k[j] = load(pg.k.add(l * pg.width + t0 + j * W), part(j));
                    }
                    for p in 0..P {
                        let s = $splat(*q[p].add(l));
                        for j in 0..NT {
                            a[p][j] = $mul(s, k[j]);
                        }
                    }
                    let mut d = l + lanes;
                    while d < pg.hd {
                        for j in 0..NT {
                            k[j] = load(pg.k.add(d * pg.width + t0 + j * W), part(j));
                        }
                        for p in 0..P {
                            let s = $splat(*q[p].add(d));
                            for j in 0..NT {
                                a[p][j] = $fma(s, k[j], a[p][j]);
                            }
                        }
                        d += lanes;
                    }
                }
                a
            };
            // SAFETY: the caller guarantees every slot read and written.
            unsafe {
                // The sixteen inputs of the final tree: lane `j` (sgemm),
                // or lanes `j`, `32 + j`, `16 + j`, `48 + j` combined as
                // `GGML_F32x16_REDUCE` does (vec_dot).
                let mut x = [[[MaybeUninit::<$v>::uninit(); 64]; NT]; P];
                for j in 0..16 {
                    let v = if VEC_DOT {
                        let (a, b) = (chain(j, 64), chain(32 + j, 64));
                        let (c, d) = (chain(16 + j, 64), chain(48 + j, 64));
                        let mut v = [[$zero(); NT]; P];
                        for p in 0..P {
                            for n in 0..NT {
                                v[p][n] = $add($add(a[p][n], b[p][n]), $add(c[p][n], d[p][n]));
                            }
                        }
                        v
                    } else {
                        chain(j, 16)
                    };
                    for p in 0..P {
                        for n in 0..NT {
                            x[p][n][j] = MaybeUninit::new(v[p][n]);
                        }
                    }
                }
                for p in 0..P {
                    for n in 0..NT {
                        store(out[p].add(t0 + n * W), part(n), reduce(SumOrder::Sgemm, &x[p][n]));
                    }
                }
            }
        }

        /// Every pair's scores for `NT` vectors of slots from `t0`, up to
        /// `score_pairs` pairs a kernel call.
        ///
        /// # Safety
        /// As [`page_scores`], for the `NT` vectors from `t0` (the last
        /// as `mask` selects).
        #[inline(always)]
        unsafe fn score_vectors<E: KvElement, const NT: usize>(
            qs: &[*const f32],
            outs: &[*mut f32],
            pg: &KeyPage<E>,
            t0: usize,
            mask: Mask,
            vec_dot: bool,
        ) {
            let mut p0 = 0;
            while p0 < qs.len() {
                let n = (qs.len() - p0).min($sp);
                let (q, o) = (&qs[p0..], &outs[p0..]);
                // SAFETY: as this function's contract, for pairs p0..p0 + n.
                unsafe {
                    if vec_dot {
                        by_count!(n, scores_block::<E, NT, true>(pg, t0, mask; q, o; ))
                    } else {
                        by_count!(n, scores_block::<E, NT, false>(pg, t0, mask; q, o; ))
                    }
                }
                p0 += n;
            }
        }

        /// Scores of every pair (queries `qs[p]`) against the page's slots
        /// below `pg.m`, pair `p`'s slot `t` to `out[p * stride + t]`,
        /// several pairs and vectors per key load. Returns the slots done;
        /// the caller computes the rest.
        ///
        /// # Safety
        /// The CPU has this module's features; each `qs[p]` has `pg.hd`
        /// values; `pg.k` has `pg.hd` rows of `pg.width` with
        /// `pg.m <= pg.width`; `out` is writable at `p * stride + t` for
        /// every pair and slot below `pg.m`.
        pub(crate) unsafe fn page_scores<E: KvElement>(
            qs: &[*const f32],
            pg: &KeyPage<E>,
            order: SumOrder,
            out: *mut f32,
            stride: usize,
        ) -> usize {
            // Each pair's output pointer, on the stack for the tiles there
            // are (no allocation per page).
            let mut stack = [std::ptr::null_mut::<f32>(); PAD_PAIRS];
            let mut heap = Vec::new();
            let outs: &mut [*mut f32] = if qs.len() <= stack.len() {
                &mut stack[..qs.len()]
            } else {
                heap.resize(qs.len(), std::ptr::null_mut());
                &mut heap
            };
            for (p, o) in outs.iter_mut().enumerate() {
                *o = out.wrapping_add(p * stride);
            }
            let outs = &*outs;
            let vec_dot = order == SumOrder::VecDot;
            let mut t0 = 0;
            // SAFETY (both loops): as this function's contract, for the
            // vectors below `pg.m`.
            while t0 + $snt * W <= pg.m {
                unsafe { score_vectors::<E, $snt>(qs, outs, pg, t0, ALL, vec_dot) };
                t0 += $snt * W;
            }
            while t0 < pg.m && (MASKED || t0 + W <= pg.m) {
                unsafe { score_vectors::<E, 1>(qs, outs, pg, t0, mask(pg.m - t0), vec_dot) };
                t0 += W;
            }
            if t0 < pg.m && pg.hd <= PAD_HD && qs.len() <= PAD_PAIRS {
                // SAFETY: as this function's contract, for slots t0..m.
                unsafe { padded_scores(qs, outs, pg, t0, vec_dot) };
                t0 = pg.m;
            }
            t0.min(pg.m)
        }

        /// Head dimensions up to which a partial vector goes through
        /// [`padded_scores`] (larger heads take the scalar path).
        const PAD_HD: usize = 128;

        /// Pairs up to which a partial vector goes through [`padded_scores`]
        /// (and output pointers stay on the stack).
        const PAD_PAIRS: usize = 64;

        /// The scores of slots `t0..pg.m` (fewer than a vector, where
        /// loads cannot be masked) by the vector kernel: the slots are
        /// copied into a zero-padded page of one vector, so nothing past
        /// `pg.m` is read from the page, and only the wanted scores are
        /// written out. The kernel sums each score in the same order as
        /// for whole vectors.
        ///
        /// # Safety
        /// As [`page_scores`]; `t0 < pg.m`, `pg.hd <= PAD_HD` and at most
        /// `PAD_PAIRS` pairs.
        #[inline(never)]
        unsafe fn padded_scores<E: KvElement>(
            qs: &[*const f32],
            outs: &[*mut f32],
            pg: &KeyPage<E>,
            t0: usize,
            vec_dot: bool,
        ) {
            let n = pg.m - t0;
            let mut keys = [E::ZERO; PAD_HD * W];
            let mut tmp = [[0f32; W]; PAD_PAIRS];
            let mut touts = [std::ptr::null_mut::<f32>(); PAD_PAIRS];
            // SAFETY: slots t0..m of every dimension are readable; the
            // buffers hold `hd × W` keys and a vector per pair.
            unsafe {
                for d in 0..pg.hd {
                    for t in 0..n {
                        keys[d * W + t] = *pg.k.add(d * pg.width + t0 + t);
                    }
                }
                for (o, row) in touts.iter_mut().zip(tmp.iter_mut()) {
                    *o = row.as_mut_ptr();
                }
                let padded = KeyPage {
                    k: keys.as_ptr(),
                    width: W,
                    hd: pg.hd,
                    m: W,
                };
                score_vectors::<E, 1>(qs, &touts[..qs.len()], &padded, 0, ALL, vec_dot);
                for (p, out) in outs.iter().enumerate() {
                    for t in 0..n {
                        *out.add(t0 + t) = tmp[p][t];
                    }
                }
            }
        }

        /// `NV` vectors of one value row from `row`.
        ///
        /// # Safety
        /// `NV × W` elements from `row` are readable.
        #[inline(always)]
        unsafe fn load_row<E: KvElement, const NV: usize>(row: *const E) -> [$v; NV] {
            unsafe {
                let mut x = [$zero(); NV];
                for v in 0..NV {
                    x[v] = load(row.add(v * W), ALL);
                }
                x
            }
        }

        /// The lane chains of `P` pairs over the tile's tokens, for output
        /// dimensions `d0..d0 + NV × W`: lane `l` of pair `p` (at
        /// `acc[p].add(l * hd + d0)`) adds `w[p][t] · v_t` for `t ≡ l`,
        /// `t < n[p]`, ascending, continuing the chain the previous tile
        /// left (a new chain starts with a product; an empty one is zero).
        ///
        /// # Safety
        /// The CPU has this module's features; as [`tile_values`].
        #[target_feature(enable = $features)]
        unsafe fn values_pairs<E: KvElement, const P: usize, const NV: usize>(
            vt: &ValueTile<'_, E>,
            w: &[*const f32; P],
            n: &[usize; P],
            acc: &[*mut f32; P],
            d0: usize,
        ) {
            let (hd, lanes) = (vt.hd, vt.lanes);
            let hi = vt.hi.min(n.iter().copied().max().unwrap_or(0));
            let common = vt.hi.min(n.iter().copied().min().unwrap_or(0));
            let row = |page: usize, slot: usize| unsafe {
                (*vt.rows.get_unchecked(page)).add(slot * hd + d0)
            };
            unsafe {
                for l in 0..lanes {
                    let mut a = [[$zero(); NV]; P];
                    let mut t = vt.lo + l;
                    let (mut page, mut slot) = (t / vt.width, t % vt.width);
                    let step = |t: &mut usize, page: &mut usize, slot: &mut usize| {
                        *t += lanes;
                        *slot += lanes;
                        while *slot >= vt.width {
                            *slot -= vt.width;
                            *page += 1;
                        }
                    };
                    if vt.lo == 0 {
                        if t < hi {
                            let x = load_row::<E, NV>(row(page, slot));
                            for p in 0..P {
                                if t < n[p] {
                                    let s = $splat(*w[p].add(t));
                                    for v in 0..NV {
                                        a[p][v] = $mul(s, x[v]);
                                    }
                                }
                            }
                        }
                        step(&mut t, &mut page, &mut slot);
                    } else {
                        for p in 0..P {
                            for v in 0..NV {
                                a[p][v] = $loadf(acc[p].add(l * hd + d0 + v * W));
                            }
                        }
                    }
                    // Every pair still sums here; past `common` some stop.
                    while t < common {
                        let x = load_row::<E, NV>(row(page, slot));
                        for p in 0..P {
                            let s = $splat(*w[p].add(t));
                            for v in 0..NV {
                                a[p][v] = $fma(s, x[v], a[p][v]);
                            }
                        }
                        step(&mut t, &mut page, &mut slot);
                    }
                    while t < hi {
                        let x = load_row::<E, NV>(row(page, slot));
                        for p in 0..P {
                            if t < n[p] {
                                let s = $splat(*w[p].add(t));
                                for v in 0..NV {
                                    a[p][v] = $fma(s, x[v], a[p][v]);
                                }
                            }
                        }
                        step(&mut t, &mut page, &mut slot);
                    }
                    for p in 0..P {
                        for v in 0..NV {
                            $storef(acc[p].add(l * hd + d0 + v * W), a[p][v]);
                        }
                    }
                }
            }
        }

        /// The lane chains of every pair over one value tile (see
        /// [`values_pairs`]), each value row loaded once for several pairs.
        ///
        /// # Safety
        /// The CPU has this module's features; `vt.hd` is a multiple of
        /// `W`; every page in `vt.rows` holds `width × hd` elements and
        /// covers the tokens below `vt.hi`; `w[p]` has a weight for every
        /// token below `n[p]`; `acc[p]` has `lanes × hd` floats.
        pub(crate) unsafe fn tile_values<E: KvElement>(
            vt: &ValueTile<'_, E>,
            w: &[*const f32],
            n: &[usize],
            acc: &[*mut f32],
        ) {
            let mut p0 = 0;
            while p0 < w.len() {
                let k = (w.len() - p0).min($vp);
                let (wp, np, ap) = (&w[p0..], &n[p0..], &acc[p0..]);
                // SAFETY: as this function's contract, for pairs p0..p0 + k.
                unsafe {
                    if vt.hd.is_multiple_of($nv * W) {
                        for d0 in (0..vt.hd).step_by($nv * W) {
                            by_count!(k, values_pairs::<E, $nv>(vt; wp, np, ap; d0))
                        }
                    } else {
                        for d0 in (0..vt.hd).step_by(W) {
                            by_count!(k, values_pairs::<E, 1>(vt; wp, np, ap; d0))
                        }
                    }
                }
                p0 += k;
            }
        }

        /// Each pair's outputs from its lanes (`acc`, `[pair][lane][hd]`):
        /// the order's tree over the lanes, `W` dimensions at a time.
        ///
        /// # Safety
        /// The CPU has this module's features; `hd` is a multiple of `W`;
        /// `acc` holds `pairs × order.lanes() × hd` floats and `out`
        /// `pairs × hd`.
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn reduce_lanes(
            order: SumOrder,
            pairs: usize,
            hd: usize,
            acc: *const f32,
            out: *mut f32,
        ) {
            let lanes = order.lanes();
            unsafe {
                let mut lane = [MaybeUninit::<$v>::uninit(); 64];
                for p in 0..pairs {
                    for d0 in (0..hd).step_by(W) {
                        for l in 0..lanes {
                            lane[l] = MaybeUninit::new($loadf(acc.add((p * lanes + l) * hd + d0)));
                        }
                        $storef(out.add(p * hd + d0), reduce(order, &lane));
                    }
                }
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    use std::arch::x86_64::*;

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
    type Mask = __mmask16;

    /// Loads and stores are masked: a page's last partial vector is done here.
    const MASKED: bool = true;

    /// All sixteen slots.
    const ALL: Mask = 0xFFFF;

    /// The first `len` slots (all sixteen from 16 on).
    fn mask(len: usize) -> Mask {
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
        "avx512f,avx512bw,avx512vl,fma,avx2,f16c",
        __m512,
        16,
        _mm512_setzero_ps,
        _mm512_add_ps,
        _mm512_mul_ps,
        _mm512_set1_ps,
        _mm512_fmadd_ps,
        _mm512_loadu_ps,
        _mm512_storeu_ps,
        score_pairs: 6,
        score_vectors: 1,
        value_pairs: 6,
        value_vectors: 4
    );
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    use std::arch::x86_64::*;

    /// AVX2 has no masked access: every call touches all eight slots.
    type Mask = ();

    /// Whole vectors only: a page's last partial vector goes through a
    /// zero-padded copy (`padded_scores`).
    const MASKED: bool = false;

    /// All eight slots.
    const ALL: Mask = ();

    /// Every access is whole.
    fn mask(_: usize) -> Mask {}

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
        8,
        _mm256_setzero_ps,
        _mm256_add_ps,
        _mm256_mul_ps,
        _mm256_set1_ps,
        _mm256_fmadd_ps,
        _mm256_loadu_ps,
        _mm256_storeu_ps,
        score_pairs: 6,
        score_vectors: 2,
        value_pairs: 6,
        value_vectors: 2
    );
}
