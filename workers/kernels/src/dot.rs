//! Dot products of one quantized weight row with many quantized activation rows.
//!
//! The AVX2 versions follow ggml's `ggml_vec_dot_q4_1_q8_1`,
//! `ggml_vec_dot_q4_0_q8_0` and `ggml_vec_dot_q8_0_q8_0`, but unpack each
//! weight block once and use it in tiles of two weight rows by four
//! activation rows (by eight, two per 512-bit register, where AVX-512 VNNI
//! is present), which is what makes batched prefill and decode cheaper per
//! token. Every tile sums in the same order as the scalar version.

use crate::quant::{ActivationsQ8, BLOCK, WeightFormat, WeightsQ};

/// A raw output pointer shared by the threads of one matmul.
///
/// Each thread writes a disjoint set of columns, so no two writes alias.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OutPtr(pub(crate) *mut f32);

// SAFETY: threads write disjoint elements through the pointer; the owning
// slice outlives the parallel section (see `matmul::Matrix::matmul`).
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// Writes `v` at element `i`.
    ///
    /// # Safety
    /// `i` must be in bounds of the output and written by this thread alone.
    #[inline(always)]
    pub(crate) unsafe fn write(self, i: usize, v: f32) {
        // SAFETY: upheld by the caller.
        unsafe { *self.0.add(i) = v };
    }
}

/// Writes `W[j] · A[r]` to `out[r * stride + j]` for every weight row `j`
/// in `rows` and every row `r` of `a`.
///
/// # Safety
/// `out` must be valid for writes at every `r * stride + j`, and no other
/// thread may write those elements concurrently.
pub(crate) unsafe fn weight_rows_dots(
    w: &WeightsQ,
    rows: std::ops::Range<usize>,
    a: &ActivationsQ8,
    out: OutPtr,
    stride: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd_available() {
        // SAFETY: the CPU supports AVX2, FMA and F16C (checked above); the
        // caller upholds the output contract.
        unsafe { avx2::weight_rows_dots(w, rows, a, out, stride) };
        return;
    }
    for j in rows {
        // SAFETY: the caller upholds the output contract.
        unsafe { weight_row_dots_scalar(w, j, a, out, stride) }
    }
}

/// Portable version of [`weight_row_dots`]; also the reference in tests.
///
/// # Safety
/// As [`weight_row_dots`].
pub(crate) unsafe fn weight_row_dots_scalar(
    w: &WeightsQ,
    j: usize,
    a: &ActivationsQ8,
    out: OutPtr,
    stride: usize,
) {
    let nb = w.blocks_per_row();
    debug_assert_eq!(nb, a.blocks_per_row());
    for r in 0..a.rows() {
        let mut acc = 0f32;
        let mut summs = 0f32;
        for b in 0..nb {
            let wb = j * nb + b;
            let ab = r * nb + b;
            let aq = &a.qs[ab * BLOCK..(ab + 1) * BLOCK];
            let isum: i32 = match w.format() {
                WeightFormat::Q4_0 | WeightFormat::Q4_1 => {
                    let q = &w.qs()[wb * 16..(wb + 1) * 16];
                    let off = if w.format() == WeightFormat::Q4_0 {
                        8
                    } else {
                        0
                    };
                    (0..16)
                        .map(|i| {
                            (i32::from(q[i] & 0xF) - off) * i32::from(aq[i])
                                + (i32::from(q[i] >> 4) - off) * i32::from(aq[i + 16])
                        })
                        .sum()
                }
                WeightFormat::Q8_0 => {
                    let q = &w.qs()[wb * 32..(wb + 1) * 32];
                    (0..32)
                        .map(|i| i32::from(q[i] as i8) * i32::from(aq[i]))
                        .sum()
                }
            };
            #[allow(clippy::cast_precision_loss)]
            {
                acc += w.d()[wb] * a.d[ab] * isum as f32;
            }
            if w.format() == WeightFormat::Q4_1 {
                summs += w.m()[wb] * a.s[ab];
            }
        }
        // SAFETY: the caller guarantees the element is ours to write.
        unsafe { out.write(r * stride + j, acc + summs) };
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::OutPtr;
    use crate::pairs::{GROUP, PAIRS};
    use crate::quant::{ActivationsQ8, BLOCK, WeightFormat, WeightsQ};
    use std::arch::x86_64::*;

    /// # Safety
    /// Requires AVX2, FMA and F16C; output contract as `super::weight_rows_dots`.
    pub(super) unsafe fn weight_rows_dots(
        w: &WeightsQ,
        rows: std::ops::Range<usize>,
        a: &ActivationsQ8,
        out: OutPtr,
        stride: usize,
    ) {
        // SAFETY: upheld by the caller; VNNI is used only where present.
        unsafe { weight_rows_dots_with(w, rows, a, (out, stride), crate::cpu::vnni512()) }
    }

    /// [`weight_rows_dots`] with the AVX-512 VNNI tiles or, when `vnni` is
    /// false, the AVX2 ones (which tests also run on machines that would
    /// take the AVX-512 path).
    ///
    /// # Safety
    /// As [`weight_rows_dots`], and the CPU has AVX-512 VNNI if `vnni`.
    pub(crate) unsafe fn weight_rows_dots_with(
        w: &WeightsQ,
        rows: std::ops::Range<usize>,
        a: &ActivationsQ8,
        (out, stride): (OutPtr, usize),
        vnni: bool,
    ) {
        // SAFETY (all arms): the features each kernel needs are present.
        unsafe {
            match (w.format(), vnni) {
                (WeightFormat::Q4_1, false) => {
                    tiles_madd::<Q41>(w, rows, (a, 0..a.rows()), out, stride)
                }
                (WeightFormat::Q4_0, false) => {
                    tiles_madd::<Q40>(w, rows, (a, 0..a.rows()), out, stride)
                }
                (WeightFormat::Q8_0, false) => {
                    tiles_madd::<Q80>(w, rows, (a, 0..a.rows()), out, stride)
                }
                (WeightFormat::Q4_1, true) => tiles_512::<Q41>(w, rows, a, out, stride),
                (WeightFormat::Q4_0, true) => tiles_512::<Q40>(w, rows, a, out, stride),
                (WeightFormat::Q8_0, true) => tiles_512::<Q80>(w, rows, a, out, stride),
            }
        }
    }

    /// Walks `rows` in blocks of `N`: `block(i)` for rows `i..i + N` while
    /// `N` remain, then `single(i)` for each row left.
    #[inline(always)]
    fn in_blocks<const N: usize>(
        rows: std::ops::Range<usize>,
        mut block: impl FnMut(usize),
        single: impl FnMut(usize),
    ) {
        let mut i = rows.start;
        while i + N <= rows.end {
            block(i);
            i += N;
        }
        (i..rows.end).for_each(single);
    }

    /// How one weight block is loaded and paired with an activation block.
    trait Kind {
        const HAS_MIN: bool;
        const QBYTES: usize;
        /// Loads the weight block at `p` as 32 bytes.
        ///
        /// # Safety
        /// The CPU has AVX2, and `QBYTES` bytes from `p` are readable.
        unsafe fn load(p: *const u8) -> __m256i;
        /// Turns (weights, activations) into (unsigned, signed) byte vectors
        /// whose byte-wise products are the wanted products: for signed
        /// weights (the default), `(|x|, y · sign(x))`.
        ///
        /// # Safety
        /// The CPU has AVX2 (callers are kernels compiled for it, which checked).
        #[inline(always)]
        unsafe fn prep(x: __m256i, y: __m256i) -> (__m256i, __m256i) {
            unsafe { (_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)) }
        }
        /// Whether the 512-bit tiles' weight bytes carry an offset (signed
        /// weights loaded as unsigned) that [`Kind::offset`] takes back.
        const SIGNED: bool = true;
        /// The weight block at `p` as unsigned bytes for `vpdpbusd`,
        /// broadcast to both 256-bit halves: signed weights plus an offset.
        ///
        /// # Safety
        /// The CPU has AVX-512 F/BW, and `QBYTES` bytes from `p` are readable.
        unsafe fn load512(p: *const u8) -> __m512i;
        /// The dot product's starting value from the packed negated lane
        /// sums of the activations: minus the offset times each lane's
        /// sum, so that the offset weights give the signed weights' integers.
        ///
        /// # Safety
        /// The CPU has AVX-512 F.
        unsafe fn offset(neg_sums: __m512i) -> __m512i;
    }

    struct Q41;
    struct Q40;
    struct Q80;

    /// The 32 four-bit values of the 16 bytes at `p`, low nibbles first.
    ///
    /// # Safety
    /// The CPU has AVX2, and 16 bytes from `p` are readable.
    #[inline(always)]
    unsafe fn nibbles(p: *const u8) -> __m256i {
        unsafe {
            let tmp = _mm_loadu_si128(p.cast());
            let both =
                _mm256_insertf128_si256(_mm256_castsi128_si256(tmp), _mm_srli_epi16(tmp, 4), 1);
            _mm256_and_si256(both, _mm256_set1_epi8(0xF))
        }
    }

    /// Unsigned weights (with a minimum): the bytes multiply as they are.
    impl Kind for Q41 {
        const HAS_MIN: bool = true;
        const QBYTES: usize = 16;
        /// # Safety
        /// As [`Kind::load`].
        #[inline(always)]
        unsafe fn load(p: *const u8) -> __m256i {
            unsafe { nibbles(p) }
        }
        /// # Safety
        /// As [`Kind::prep`].
        #[inline(always)]
        unsafe fn prep(x: __m256i, y: __m256i) -> (__m256i, __m256i) {
            (x, y)
        }
        const SIGNED: bool = false;
        /// # Safety
        /// As [`Kind::load512`].
        #[inline(always)]
        unsafe fn load512(p: *const u8) -> __m512i {
            unsafe { nibbles512(p) }
        }
        /// # Safety
        /// As [`Kind::offset`].
        #[inline(always)]
        unsafe fn offset(_: __m512i) -> __m512i {
            unsafe { _mm512_setzero_si512() }
        }
    }

    impl Kind for Q40 {
        const HAS_MIN: bool = false;
        const QBYTES: usize = 16;
        /// # Safety
        /// As [`Kind::load`].
        #[inline(always)]
        unsafe fn load(p: *const u8) -> __m256i {
            unsafe { _mm256_sub_epi8(nibbles(p), _mm256_set1_epi8(8)) }
        }
        /// The nibbles as they are: the weights plus 8.
        ///
        /// # Safety
        /// As [`Kind::load512`].
        #[inline(always)]
        unsafe fn load512(p: *const u8) -> __m512i {
            unsafe { nibbles512(p) }
        }
        /// # Safety
        /// As [`Kind::offset`].
        #[inline(always)]
        unsafe fn offset(neg_sums: __m512i) -> __m512i {
            unsafe { _mm512_slli_epi32::<3>(neg_sums) }
        }
    }

    impl Kind for Q80 {
        const HAS_MIN: bool = false;
        const QBYTES: usize = 32;
        /// # Safety
        /// As [`Kind::load`].
        #[inline(always)]
        unsafe fn load(p: *const u8) -> __m256i {
            unsafe { _mm256_loadu_si256(p.cast()) }
        }
        /// The weights plus 128 (the sign bit flipped).
        ///
        /// # Safety
        /// As [`Kind::load512`].
        #[inline(always)]
        unsafe fn load512(p: *const u8) -> __m512i {
            unsafe {
                let x = _mm512_broadcast_i64x4(_mm256_loadu_si256(p.cast()));
                _mm512_xor_si512(x, _mm512_set1_epi8(-128))
            }
        }
        /// # Safety
        /// As [`Kind::offset`].
        #[inline(always)]
        unsafe fn offset(neg_sums: __m512i) -> __m512i {
            unsafe { _mm512_slli_epi32::<7>(neg_sums) }
        }
    }

    /// [`nibbles`] broadcast to both 256-bit halves: the 16 bytes at `p`
    /// in all four 128-bit lanes, the odd lanes shifted down a nibble.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW, and 16 bytes from `p` are readable.
    #[inline(always)]
    unsafe fn nibbles512(p: *const u8) -> __m512i {
        unsafe {
            let v = _mm512_broadcast_i32x4(_mm_loadu_si128(p.cast()));
            let shifted = _mm512_srlv_epi64(v, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
            _mm512_and_si512(shifted, _mm512_set1_epi8(0xF))
        }
    }

    /// Eight sums of four byte products (unsigned `x` by signed `y`).
    ///
    /// # Safety
    /// The CPU has AVX2 (callers are kernels compiled for it, which checked).
    #[inline(always)]
    unsafe fn dot_madd(x: __m256i, y: __m256i) -> __m256i {
        unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1)) }
    }

    /// [`dot_madd`] in one VNNI instruction.
    ///
    /// # Safety
    /// The CPU has AVX-512 VNNI and VL.
    #[inline(always)]
    unsafe fn dot_vnni(x: __m256i, y: __m256i) -> __m256i {
        // The same eight sums of four byte products as maddubs + madd (no
        // saturation can occur for these operand ranges), in one instruction.
        unsafe { _mm256_dpbusd_epi32(_mm256_setzero_si256(), x, y) }
    }

    /// The sum of the eight lanes of `v`.
    ///
    /// # Safety
    /// The CPU has AVX (callers are kernels compiled for AVX2).
    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        unsafe {
            let lo = _mm256_castps256_ps128(v);
            let hi = _mm256_extractf128_ps(v, 1);
            let s = _mm_add_ps(lo, hi);
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            _mm_cvtss_f32(s)
        }
    }

    /// Defines a tile kernel: weight rows in pairs, activation rows in
    /// fours. Per output the sum runs over blocks in order, with one 8-lane
    /// float accumulator and a scalar sum of minimum terms, exactly as
    /// ggml's `ggml_vec_dot_q4_1_q8_1` (and its siblings) on AVX2.
    macro_rules! tile_kernel {
        ($name:ident, $tile:ident, $features:literal, $dot:ident) => {
            tile_kernel!(@driver $name, $tile, $features);
            tile_kernel!(@tile $tile, $features, $dot);
        };
        (@driver $name:ident, $tile:ident, $features:literal) => {
            /// Every output of weight rows `rows` by activation rows `acts`
            /// (four at a time, then one).
            ///
            /// # Safety
            /// The CPU has the features this kernel is compiled for; `rows` lies
            /// within the weights' rows and `acts` within the activations'
            /// (starting at a multiple of four); `out` is writable at
            /// `r × stride + j` for every activation row `r` in `acts` and
            /// weight row `j` in `rows`.
            #[target_feature(enable = $features)]
            unsafe fn $name<K: Kind>(
                w: &WeightsQ,
                rows: std::ops::Range<usize>,
                (a, acts): (&ActivationsQ8, std::ops::Range<usize>),
                out: OutPtr,
                stride: usize,
            ) {
                /// Activation rows `r..r + AR` by every weight row of
                /// `rows`, two at a time, then one. The task's weight rows
                /// stay in L1 while the activation rows are read once.
                ///
                /// # Safety
                /// As the driver's, for activation rows `r..r + AR`.
                #[target_feature(enable = $features)]
                unsafe fn weights_of<K: Kind, const AR: usize>(
                    w: &WeightsQ,
                    rows: std::ops::Range<usize>,
                    (a, r): (&ActivationsQ8, usize),
                    out: OutPtr,
                    stride: usize,
                ) {
                    // Rows in runs of `MIN_RUN`: each run's minimum terms
                    // first, as independent chains (one per weight row, lane
                    // t: activation row r + t), then its tiles. Within the
                    // tiles, the chains of two weight rows ran one behind
                    // the other at the latency of a fused multiply-add.
                    let mut start = rows.start;
                    while start < rows.end {
                        let end = (start + MIN_RUN).min(rows.end);
                        let mut mins = [_mm_setzero_ps(); MIN_RUN];
                        if K::HAS_MIN && AR == 4 {
                            // SAFETY: rows and activations as the driver's.
                            unsafe { min_terms4(w, start..end, (a, r), &mut mins) };
                        }
                        let mins = &mins;
                        // SAFETY: every call stays inside `rows`.
                        in_blocks::<2>(
                            start..end,
                            |j| unsafe {
                                $tile::<K, 2, AR>(w, j, a, r, (out, stride), &mins[j - start..])
                            },
                            |j| unsafe {
                                $tile::<K, 1, AR>(w, j, a, r, (out, stride), &mins[j - start..])
                            },
                        );
                        start = end;
                    }
                }
                // SAFETY: every call stays inside the activation rows.
                in_blocks::<4>(
                    acts,
                    |r| unsafe { weights_of::<K, 4>(w, rows.clone(), (a, r), out, stride) },
                    |r| unsafe { weights_of::<K, 1>(w, rows.clone(), (a, r), out, stride) },
                );
            }

        };
        (@tile $tile:ident, $features:literal, $dot:ident) => {
            /// `WR` weight rows from `j` by `AR` activation rows from `r`;
            /// with four activation rows, `mins[u]` holds weight row
            /// `j + u`'s minimum terms ([`min_terms4`]).
            ///
            /// # Safety
            /// As the driver's: rows `j..j + WR` of the weights and `r..r + AR` of
            /// the activations exist, and their outputs are writable.
            #[target_feature(enable = $features)]
            unsafe fn $tile<K: Kind, const WR: usize, const AR: usize>(
                w: &WeightsQ,
                j: usize,
                a: &ActivationsQ8,
                r: usize,
                (out, stride): (OutPtr, usize),
                mins: &[__m128],
            ) {
                let nb = w.blocks_per_row();
                let (wq, wd, wm) = (w.qs().as_ptr(), w.d().as_ptr(), w.m().as_ptr());
                let (aq, ad, asum) = (a.qs.as_ptr(), a.d.as_ptr(), a.s.as_ptr());
                // SAFETY (whole body): indices stay below rows x blocks of the
                // weights and activations, whose lengths the types establish.
                unsafe {
                    let mut acc = [[_mm256_setzero_ps(); AR]; WR];
                    // The scale products `d_w · d_a` of a run of blocks,
                    // formed first so that the block loop
                    // reads each as one broadcast load and keeps its
                    // registers for the accumulators.
                    // Uninitialised, not zeroed: a zeroed array cost a
                    // memset of a kilobyte per tile call (3% of a batched
                    // decode step), and every element read was written first.
                    let mut dd = [[[std::mem::MaybeUninit::<f32>::uninit(); DD_RUN]; AR]; WR];
                    let mut b0 = 0;
                    while b0 < nb {
                        let run = (nb - b0).min(DD_RUN);
                        for u in 0..WR {
                            for t in 0..AR {
                                let (dw, da) = (wd.add((j + u) * nb + b0), ad.add((r + t) * nb + b0));
                                for i in 0..run {
                                    dd[u][t][i].write(*dw.add(i) * *da.add(i));
                                }
                            }
                        }
                        for i in 0..run {
                            let b = b0 + i;
                            let mut x = [_mm256_setzero_si256(); WR];
                            for u in 0..WR {
                                x[u] = K::load(wq.add(((j + u) * nb + b) * K::QBYTES));
                                _mm_prefetch::<_MM_HINT_T0>(
                                    wq.wrapping_add(((j + u + PF) * nb + b) * K::QBYTES).cast(),
                                );
                            }
                            for t in 0..AR {
                                let y = _mm256_loadu_si256(aq.add(((r + t) * nb + b) * BLOCK).cast());
                                for u in 0..WR {
                                    let (ux, sy) = K::prep(x[u], y);
                                    let p = _mm256_cvtepi32_ps($dot(ux, sy));
                                    // Written above for every i < run.
                                    let d = _mm256_broadcast_ss(dd[u][t][i].assume_init_ref());
                                    acc[u][t] = _mm256_fmadd_ps(d, p, acc[u][t]);
                                }
                            }
                        }
                        b0 += run;
                    }
                    // Minimum terms of single activation rows, a chain of
                    // their own per output (so after the products, in the
                    // same order); four rows' came in `mins`.
                    let mut summs = [[0f32; AR]; WR];
                    if K::HAS_MIN && AR != 4 {
                        for b in 0..nb {
                            for u in 0..WR {
                                for t in 0..AR {
                                    let m = _mm_set_ss(*wm.add((j + u) * nb + b));
                                    let s = _mm_set_ss(*asum.add((r + t) * nb + b));
                                    let c = _mm_set_ss(summs[u][t]);
                                    summs[u][t] = _mm_cvtss_f32(_mm_fmadd_ss(m, s, c));
                                }
                            }
                        }
                    }
                    for u in 0..WR {
                        let mut lanes = [0f32; 4];
                        _mm_storeu_ps(lanes.as_mut_ptr(), mins[u]);
                        for t in 0..AR {
                            let m = if AR == 4 { lanes[t] } else { summs[u][t] };
                            out.write((r + t) * stride + j + u, hsum(acc[u][t]) + m);
                        }
                    }
                }
            }
        };
    }

    /// Blocks whose scale products a tile forms at once.
    const DD_RUN: usize = 32;

    /// Weight rows ahead whose block a tile prefetches as it loads one.
    ///
    /// A step reads the model's matrices from memory (together they are
    /// larger than the last-level cache), and a task's first pass over its
    /// weight rows waited on those reads: the hardware prefetchers do not
    /// run far enough ahead in rows of a few hundred bytes. Asking for the
    /// block four rows on made SmolLM2's output head (49,152 Q8_0 rows)
    /// by 16 activation rows 1.16–1.23x faster on the AVX2 tiles and
    /// 1.24–1.29x on the 512-bit ones, on one core of a Zen 4 EPYC,
    /// outputs unchanged. The address is only prefetched, never
    /// read, so rows past the matrix's end are harmless (the prefetch
    /// does not fault) and the pointer is formed with `wrapping_add`.
    const PF: usize = 4;

    /// Weight rows whose minimum terms are summed at once.
    const MIN_RUN: usize = 8;

    /// Each of weight rows `rows`' (at most [`MIN_RUN`]) minimum terms
    /// against activation rows `r..r + 4` into `mins`: lane t of
    /// `mins[u]` is `Σ_b m[j + u, b] · s[r + t, b]`, one sequential chain of
    /// fused multiply-adds over the blocks in order, as ggml sums `summs`;
    /// the rows' chains are independent, so they run side by side.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `rows` lies within the weights' rows and
    /// `r..r + 4` within the activations' (with `r` a multiple of four).
    #[target_feature(enable = "avx2,fma")]
    unsafe fn min_terms4(
        w: &WeightsQ,
        rows: std::ops::Range<usize>,
        (a, r): (&ActivationsQ8, usize),
        mins: &mut [__m128; MIN_RUN],
    ) {
        let nb = w.blocks_per_row();
        let wm = w.m().as_ptr();
        // SAFETY (whole body): indices stay below rows x blocks of the
        // weights' minima and groups x blocks x 4 of the activations' sums.
        unsafe {
            let s4 = a.s4.as_ptr().add((r / 4) * nb * 4);
            if rows.len() == MIN_RUN {
                let mut acc = [_mm_setzero_ps(); MIN_RUN];
                for b in 0..nb {
                    let sv = _mm_loadu_ps(s4.add(b * 4));
                    for (u, acc) in acc.iter_mut().enumerate() {
                        let m = _mm_set1_ps(*wm.add((rows.start + u) * nb + b));
                        *acc = _mm_fmadd_ps(m, sv, *acc);
                    }
                }
                *mins = acc;
            } else {
                for (u, j) in rows.enumerate() {
                    let mut acc = _mm_setzero_ps();
                    for b in 0..nb {
                        let m = _mm_set1_ps(*wm.add(j * nb + b));
                        acc = _mm_fmadd_ps(m, _mm_loadu_ps(s4.add(b * 4)), acc);
                    }
                    mins[u] = acc;
                }
            }
        }
    }

    tile_kernel!(tiles_madd, tile_madd, "avx2,fma,f16c", dot_madd);

    /// The AVX-512 driver: activation rows in groups of eight (two per
    /// 512-bit register, packed once per input by `crate::pairs`), the
    /// rest through the 256-bit VNNI tiles. Each group meets every weight
    /// row of `rows` before the next is read, so the task's weight rows
    /// stay in L1 and the activations are read once.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/DQ/VL/VNNI besides AVX2, FMA and F16C; `rows`
    /// lies within the weights' rows; `out` is writable at `r × stride + j`
    /// for every activation row `r` and weight row `j` in `rows`.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")]
    unsafe fn tiles_512<K: Kind>(
        w: &WeightsQ,
        rows: std::ops::Range<usize>,
        a: &ActivationsQ8,
        out: OutPtr,
        stride: usize,
    ) {
        let nb = w.blocks_per_row();
        // Inputs quantized while the kernels were capped below AVX-512
        // (a test hook) carry no packing: their rows all take the
        // 256-bit tiles.
        let groups = a.pairs.groups(nb);
        // SAFETY (every call): inside `rows` and the activation rows.
        for g in 0..groups {
            in_blocks::<2>(
                rows.clone(),
                |j| unsafe { tile512::<K, 2>((w, j), (a, g), (out, stride)) },
                |j| unsafe { tile512::<K, 1>((w, j), (a, g), (out, stride)) },
            );
        }
        unsafe { tiles_vnni::<K>(w, rows, (a, groups * GROUP..a.rows()), out, stride) };
    }

    /// `WR` weight rows from `j` by the eight activation rows of group `g`;
    /// each 512-bit accumulator holds the 8-lane accumulators of a pair's
    /// two outputs, each summed exactly as in 256 bits. Every operand of
    /// the block loop is a plain load from the packed pairs; weights enter
    /// the dot product as unsigned bytes, with the packed offset correction
    /// as its starting value where they are signed (the same integers).
    ///
    /// # Safety
    /// As [`tiles_512`]'s: rows `j..j + WR` of the weights and group `g`
    /// of the packed activations exist, and their outputs are writable.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")]
    unsafe fn tile512<K: Kind, const WR: usize>(
        (w, j): (&WeightsQ, usize),
        (a, g): (&ActivationsQ8, usize),
        (out, stride): (OutPtr, usize),
    ) {
        let nb = w.blocks_per_row();
        let (wq, wd, wm) = (w.qs().as_ptr(), w.d().as_ptr(), w.m().as_ptr());
        let p8 = &a.pairs;
        let (py, pd, pn, ps) = (
            p8.y.as_ptr(),
            p8.d.as_ptr(),
            p8.neg_sums.as_ptr(),
            p8.s8.as_ptr(),
        );
        // SAFETY (whole body): indices stay below rows x blocks of the
        // weights and groups x blocks x pairs of the packing, whose
        // lengths the types establish.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); PAIRS]; WR];
            let mut summs = [_mm256_setzero_ps(); WR];
            for b in 0..nb {
                let gb = g * nb + b;
                let mut x = [_mm512_setzero_si512(); WR];
                let mut dw = [_mm512_setzero_ps(); WR];
                for u in 0..WR {
                    let wb = (j + u) * nb + b;
                    x[u] = K::load512(wq.add(wb * K::QBYTES));
                    _mm_prefetch::<_MM_HINT_T0>(wq.wrapping_add((wb + PF * nb) * K::QBYTES).cast());
                    dw[u] = _mm512_set1_ps(*wd.add(wb));
                }
                for p in 0..PAIRS {
                    let slot = gb * PAIRS + p;
                    let y = _mm512_loadu_si512(py.add(slot * 2 * BLOCK).cast());
                    let da = _mm512_loadu_ps(pd.add(slot * 16));
                    let init = if K::SIGNED {
                        K::offset(_mm512_loadu_si512(pn.add(slot * 16).cast()))
                    } else {
                        _mm512_setzero_si512()
                    };
                    for u in 0..WR {
                        let prod = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(init, x[u], y));
                        acc[u][p] = _mm512_fmadd_ps(_mm512_mul_ps(dw[u], da), prod, acc[u][p]);
                    }
                }
                if K::HAS_MIN {
                    // Lane t: the sequential chain of row t's minimum
                    // terms, as the four-row tiles' lanes.
                    let sv = _mm256_loadu_ps(ps.add(gb * GROUP));
                    for u in 0..WR {
                        let m = _mm256_set1_ps(*wm.add((j + u) * nb + b));
                        summs[u] = _mm256_fmadd_ps(m, sv, summs[u]);
                    }
                }
            }
            for u in 0..WR {
                let mut m = [0f32; GROUP];
                _mm256_storeu_ps(m.as_mut_ptr(), summs[u]);
                for p in 0..PAIRS {
                    let lo = _mm512_castps512_ps256(acc[u][p]);
                    let hi = _mm512_extractf32x8_ps(acc[u][p], 1);
                    let (t0, t1) = (2 * p, 2 * p + 1);
                    let r = g * GROUP;
                    out.write((r + t0) * stride + j + u, hsum(lo) + m[t0]);
                    out.write((r + t1) * stride + j + u, hsum(hi) + m[t1]);
                }
            }
        }
    }
    tile_kernel!(
        tiles_vnni,
        tile_vnni,
        "avx2,fma,f16c,avx512vnni,avx512vl",
        dot_vnni
    );
}
