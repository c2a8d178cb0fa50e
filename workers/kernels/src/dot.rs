//! Dot products of one quantized weight row with many quantized activation rows.
//!
//! The AVX2 versions follow ggml's `ggml_vec_dot_q4_1_q8_1`,
//! `ggml_vec_dot_q4_0_q8_0` and `ggml_vec_dot_q8_0_q8_0`, but unpack each
//! weight block once and use it against four activation rows (a 1 x 4 tile),
//! which is what makes batched prefill and decode cheaper per token.

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
mod avx2 {
    use super::OutPtr;
    use crate::quant::{ActivationsQ8, BLOCK, WeightFormat, WeightsQ};
    use std::arch::x86_64::*;
    use std::sync::OnceLock;

    /// Whether the AVX-512 VNNI dot product (`vpdpbusd`) is available.
    fn vnni() -> bool {
        static VNNI: OnceLock<bool> = OnceLock::new();
        *VNNI.get_or_init(|| {
            is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl")
        })
    }

    /// # Safety
    /// Requires AVX2, FMA and F16C; output contract as `super::weight_rows_dots`.
    pub(super) unsafe fn weight_rows_dots(
        w: &WeightsQ,
        rows: std::ops::Range<usize>,
        a: &ActivationsQ8,
        out: OutPtr,
        stride: usize,
    ) {
        // SAFETY (all arms): the features each kernel needs are present.
        unsafe {
            match (w.format(), vnni()) {
                (WeightFormat::Q4_1, false) => tiles_madd::<Q41>(w, rows, a, out, stride),
                (WeightFormat::Q4_0, false) => tiles_madd::<Q40>(w, rows, a, out, stride),
                (WeightFormat::Q8_0, false) => tiles_madd::<Q80>(w, rows, a, out, stride),
                (WeightFormat::Q4_1, true) => tiles_vnni::<Q41>(w, rows, a, out, stride),
                (WeightFormat::Q4_0, true) => tiles_vnni::<Q40>(w, rows, a, out, stride),
                (WeightFormat::Q8_0, true) => tiles_vnni::<Q80>(w, rows, a, out, stride),
            }
        }
    }

    /// How one weight block is loaded and paired with an activation block.
    trait Kind {
        const HAS_MIN: bool;
        const QBYTES: usize;
        /// Loads the weight block at `p` as 32 bytes.
        unsafe fn load(p: *const u8) -> __m256i;
        /// Turns (weights, activations) into (unsigned, signed) byte vectors
        /// whose byte-wise products are the wanted products.
        unsafe fn prep(x: __m256i, y: __m256i) -> (__m256i, __m256i);
    }

    struct Q41;
    struct Q40;
    struct Q80;

    #[inline(always)]
    unsafe fn nibbles(p: *const u8) -> __m256i {
        unsafe {
            let tmp = _mm_loadu_si128(p.cast());
            let both =
                _mm256_insertf128_si256(_mm256_castsi128_si256(tmp), _mm_srli_epi16(tmp, 4), 1);
            _mm256_and_si256(both, _mm256_set1_epi8(0xF))
        }
    }

    impl Kind for Q41 {
        const HAS_MIN: bool = true;
        const QBYTES: usize = 16;
        #[inline(always)]
        unsafe fn load(p: *const u8) -> __m256i {
            unsafe { nibbles(p) }
        }
        #[inline(always)]
        unsafe fn prep(x: __m256i, y: __m256i) -> (__m256i, __m256i) {
            (x, y)
        }
    }

    impl Kind for Q40 {
        const HAS_MIN: bool = false;
        const QBYTES: usize = 16;
        #[inline(always)]
        unsafe fn load(p: *const u8) -> __m256i {
            unsafe { _mm256_sub_epi8(nibbles(p), _mm256_set1_epi8(8)) }
        }
        #[inline(always)]
        unsafe fn prep(x: __m256i, y: __m256i) -> (__m256i, __m256i) {
            unsafe { (_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)) }
        }
    }

    impl Kind for Q80 {
        const HAS_MIN: bool = false;
        const QBYTES: usize = 32;
        #[inline(always)]
        unsafe fn load(p: *const u8) -> __m256i {
            unsafe { _mm256_loadu_si256(p.cast()) }
        }
        #[inline(always)]
        unsafe fn prep(x: __m256i, y: __m256i) -> (__m256i, __m256i) {
            unsafe { (_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)) }
        }
    }

    #[inline(always)]
    unsafe fn dot_madd(x: __m256i, y: __m256i) -> __m256i {
        unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1)) }
    }

    #[inline(always)]
    unsafe fn dot_vnni(x: __m256i, y: __m256i) -> __m256i {
        // The same eight sums of four byte products as maddubs + madd (no
        // saturation can occur for these operand ranges), in one instruction.
        unsafe { _mm256_dpbusd_epi32(_mm256_setzero_si256(), x, y) }
    }

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
            #[target_feature(enable = $features)]
            unsafe fn $name<K: Kind>(
                w: &WeightsQ,
                rows: std::ops::Range<usize>,
                a: &ActivationsQ8,
                out: OutPtr,
                stride: usize,
            ) {
                let n_act = a.rows();
                // SAFETY: every call stays inside `rows` and the activation rows.
                unsafe {
                    let mut j = rows.start;
                    while j + 2 <= rows.end {
                        let mut r = 0;
                        while r + 4 <= n_act {
                            $tile::<K, 2, 4>(w, j, a, r, out, stride);
                            r += 4;
                        }
                        while r < n_act {
                            $tile::<K, 2, 1>(w, j, a, r, out, stride);
                            r += 1;
                        }
                        j += 2;
                    }
                    if j < rows.end {
                        let mut r = 0;
                        while r + 4 <= n_act {
                            $tile::<K, 1, 4>(w, j, a, r, out, stride);
                            r += 4;
                        }
                        while r < n_act {
                            $tile::<K, 1, 1>(w, j, a, r, out, stride);
                            r += 1;
                        }
                    }
                }
            }

            /// `WR` weight rows from `j` by `AR` activation rows from `r`.
            #[target_feature(enable = $features)]
            unsafe fn $tile<K: Kind, const WR: usize, const AR: usize>(
                w: &WeightsQ,
                j: usize,
                a: &ActivationsQ8,
                r: usize,
                out: OutPtr,
                stride: usize,
            ) {
                let nb = w.blocks_per_row();
                let (wq, wd, wm) = (w.qs().as_ptr(), w.d().as_ptr(), w.m().as_ptr());
                let (aq, ad, asum) = (a.qs.as_ptr(), a.d.as_ptr(), a.s.as_ptr());
                // SAFETY (whole body): indices stay below rows x blocks of the
                // weights and activations, whose lengths the types establish.
                unsafe {
                    let mut acc = [[_mm256_setzero_ps(); AR]; WR];
                    // Minimum terms: with four rows, the four running sums of a
                    // weight row sit in one vector (lane t: row r + t); each lane
                    // is the same sequential chain of fused multiply-adds.
                    let mut summs4 = [_mm_setzero_ps(); WR];
                    let mut summs = [[0f32; AR]; WR];
                    let s4 = a.s4.as_ptr().add((r / 4) * nb * 4);
                    for b in 0..nb {
                        let mut x = [_mm256_setzero_si256(); WR];
                        for u in 0..WR {
                            x[u] = K::load(wq.add(((j + u) * nb + b) * K::QBYTES));
                        }
                        for t in 0..AR {
                            let ab = (r + t) * nb + b;
                            let y = _mm256_loadu_si256(aq.add(ab * BLOCK).cast());
                            let da = _mm256_set1_ps(*ad.add(ab));
                            for u in 0..WR {
                                let (ux, sy) = K::prep(x[u], y);
                                let p = _mm256_cvtepi32_ps($dot(ux, sy));
                                let dd =
                                    _mm256_mul_ps(_mm256_set1_ps(*wd.add((j + u) * nb + b)), da);
                                acc[u][t] = _mm256_fmadd_ps(dd, p, acc[u][t]);
                            }
                        }
                        if K::HAS_MIN {
                            if AR == 4 {
                                let sv = _mm_loadu_ps(s4.add(b * 4));
                                for u in 0..WR {
                                    let m = _mm_set1_ps(*wm.add((j + u) * nb + b));
                                    summs4[u] = _mm_fmadd_ps(m, sv, summs4[u]);
                                }
                            } else {
                                for u in 0..WR {
                                    for t in 0..AR {
                                        let m = *wm.add((j + u) * nb + b);
                                        summs[u][t] =
                                            m.mul_add(*asum.add((r + t) * nb + b), summs[u][t]);
                                    }
                                }
                            }
                        }
                    }
                    for u in 0..WR {
                        let mut lanes = [0f32; 4];
                        _mm_storeu_ps(lanes.as_mut_ptr(), summs4[u]);
                        for t in 0..AR {
                            let m = if AR == 4 { lanes[t] } else { summs[u][t] };
                            out.write((r + t) * stride + j + u, hsum(acc[u][t]) + m);
                        }
                    }
                }
            }
        };
    }

    tile_kernel!(tiles_madd, tile_madd, "avx2,fma,f16c", dot_madd);
    tile_kernel!(
        tiles_vnni,
        tile_vnni,
        "avx2,fma,f16c,avx512vnni,avx512vl",
        dot_vnni
    );
}
