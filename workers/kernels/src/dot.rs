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

/// Writes `W[j] · A[r]` to `out[r * stride + j]` for every row `r` of `a`.
///
/// # Safety
/// `out` must be valid for writes at every `r * stride + j`, and no other
/// thread may write those elements concurrently.
pub(crate) unsafe fn weight_row_dots(
    w: &WeightsQ,
    j: usize,
    a: &ActivationsQ8,
    out: OutPtr,
    stride: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd_available() {
        // SAFETY: the CPU supports AVX2, FMA and F16C (checked above); the
        // caller upholds the output contract.
        unsafe { avx2::weight_row_dots(w, j, a, out, stride) };
        return;
    }
    // SAFETY: the caller upholds the output contract.
    unsafe { weight_row_dots_scalar(w, j, a, out, stride) }
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

    /// # Safety
    /// Requires AVX2, FMA and F16C; output contract as `super::weight_row_dots`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn weight_row_dots(
        w: &WeightsQ,
        j: usize,
        a: &ActivationsQ8,
        out: OutPtr,
        stride: usize,
    ) {
        match w.format() {
            WeightFormat::Q4_1 => unsafe { tile::<Q41>(w, j, a, out, stride) },
            WeightFormat::Q4_0 => unsafe { tile::<Q40>(w, j, a, out, stride) },
            WeightFormat::Q8_0 => unsafe { tile::<Q80>(w, j, a, out, stride) },
        }
    }

    /// How one weight block is loaded and multiplied with an activation block.
    trait Kind {
        const HAS_MIN: bool;
        const QBYTES: usize;
        /// Loads the weight block at `p` as 32 bytes.
        unsafe fn load(p: *const u8) -> __m256i;
        /// Eight i32 lanes, each the sum of four products, as f32.
        unsafe fn mul_sum(x: __m256i, y: __m256i) -> __m256;
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

    /// Unsigned x (0..=15) times signed y.
    #[inline(always)]
    unsafe fn mul_sum_us8(x: __m256i, y: __m256i) -> __m256 {
        unsafe {
            let dot = _mm256_maddubs_epi16(x, y);
            _mm256_cvtepi32_ps(_mm256_madd_epi16(dot, _mm256_set1_epi16(1)))
        }
    }

    /// Signed x times signed y, through the sign trick.
    #[inline(always)]
    unsafe fn mul_sum_i8(x: __m256i, y: __m256i) -> __m256 {
        unsafe {
            let ax = _mm256_sign_epi8(x, x);
            let sy = _mm256_sign_epi8(y, x);
            mul_sum_us8(ax, sy)
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
        unsafe fn mul_sum(x: __m256i, y: __m256i) -> __m256 {
            unsafe { mul_sum_us8(x, y) }
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
        unsafe fn mul_sum(x: __m256i, y: __m256i) -> __m256 {
            unsafe { mul_sum_i8(x, y) }
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
        unsafe fn mul_sum(x: __m256i, y: __m256i) -> __m256 {
            unsafe { mul_sum_i8(x, y) }
        }
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

    /// One weight row against every activation row, four activation rows at a time.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile<K: Kind>(w: &WeightsQ, j: usize, a: &ActivationsQ8, out: OutPtr, stride: usize) {
        let nb = w.blocks_per_row();
        let rows = a.rows();
        let wq = w.qs().as_ptr();
        let wd = w.d();
        let wm = w.m();
        let aq = a.qs.as_ptr();
        let mut r = 0;
        // SAFETY (whole body): every index stays inside the slices whose
        // lengths `WeightsQ` and `ActivationsQ8` establish (rows x blocks).
        unsafe {
            while r + 4 <= rows {
                let mut acc = [_mm256_setzero_ps(); 4];
                let mut summs = [0f32; 4];
                for b in 0..nb {
                    let wb = j * nb + b;
                    let x = K::load(wq.add(wb * K::QBYTES));
                    let dw = _mm256_set1_ps(wd[wb]);
                    for t in 0..4 {
                        let ab = (r + t) * nb + b;
                        let y = _mm256_loadu_si256(aq.add(ab * BLOCK).cast());
                        let p = K::mul_sum(x, y);
                        let dd = _mm256_mul_ps(dw, _mm256_set1_ps(a.d[ab]));
                        acc[t] = _mm256_fmadd_ps(dd, p, acc[t]);
                        if K::HAS_MIN {
                            summs[t] = wm[wb].mul_add(a.s[ab], summs[t]);
                        }
                    }
                }
                for t in 0..4 {
                    out.write((r + t) * stride + j, hsum(acc[t]) + summs[t]);
                }
                r += 4;
            }
            while r < rows {
                let mut acc = _mm256_setzero_ps();
                let mut summs = 0f32;
                for b in 0..nb {
                    let wb = j * nb + b;
                    let ab = r * nb + b;
                    let x = K::load(wq.add(wb * K::QBYTES));
                    let y = _mm256_loadu_si256(aq.add(ab * BLOCK).cast());
                    let p = K::mul_sum(x, y);
                    let dd = _mm256_mul_ps(_mm256_set1_ps(wd[wb]), _mm256_set1_ps(a.d[ab]));
                    acc = _mm256_fmadd_ps(dd, p, acc);
                    if K::HAS_MIN {
                        summs = wm[wb].mul_add(a.s[ab], summs);
                    }
                }
                out.write(r * stride + j, hsum(acc) + summs);
                r += 1;
            }
        }
    }
}
