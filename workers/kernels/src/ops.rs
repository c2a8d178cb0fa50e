//! Small f32 vector operations of a transformer layer.
//!
//! Bodies are plain Rust written so LLVM vectorizes them; on x86-64 each is
//! compiled a second time with AVX2 + FMA enabled and chosen at run time.

use crate::sum_order::reduce16;

/// Declares `pub fn $name` that dispatches to an AVX2 build of `$body` when available.
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? $body:block) => {
        $(#[$m])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body($($arg: $ty),*) $(-> $ret)? $body

            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                fn fast($($arg: $ty),*) $(-> $ret)? { body($($arg),*) }
                if crate::simd_available() {
                    // SAFETY: the CPU supports AVX2 and FMA (checked at run time).
                    return unsafe { fast($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}

multiversion! {
    /// `Σ a[i] · b[i]`, with sixteen independent partial sums.
    pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (a, b) = (&a[..n], &b[..n]);
        let mut acc = [0f32; 16];
        let mut ca = a.chunks_exact(16);
        let mut cb = b.chunks_exact(16);
        for (x, y) in (&mut ca).zip(&mut cb) {
            for i in 0..16 {
                acc[i] = x[i].mul_add(y[i], acc[i]);
            }
        }
        let mut tail = 0f32;
        for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
            tail += x * y;
        }
        acc.iter().sum::<f32>() + tail
    }
}

/// Rounds every value to the nearest f16 (ties to even), kept as f32.
pub fn round_f16_slice(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd_available() {
        // SAFETY: the CPU supports AVX2 and F16C (checked at run time).
        unsafe { round_f16_f16c(x) };
        return;
    }
    for v in x.iter_mut() {
        *v = half::f16::from_f32(*v).to_f32();
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn round_f16_f16c(x: &mut [f32]) {
    use std::arch::x86_64::*;
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        // SAFETY: `c` holds exactly eight f32 values.
        unsafe {
            let v = _mm256_loadu_ps(c.as_ptr());
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
            _mm256_storeu_ps(c.as_mut_ptr(), _mm256_cvtph_ps(h));
        }
    }
    for v in chunks.into_remainder() {
        *v = half::f16::from_f32(*v).to_f32();
    }
}

multiversion! {
    /// `x[i] += y[i]`.
    pub fn add_assign(x: &mut [f32], y: &[f32]) {
        for (a, b) in x.iter_mut().zip(y) {
            *a += b;
        }
    }
}

multiversion! {
    /// Rotates interleaved pairs `(x[2i], x[2i + 1])` by the angles whose
    /// cosines and sines are `cos[i]`, `sin[i]`, with the fused
    /// multiply-adds ggml's `rotate_pairs` compiles to.
    pub fn rope_pairs(x: &mut [f32], cos: &[f32], sin: &[f32]) {
        for ((pair, c), s) in x.chunks_exact_mut(2).zip(cos).zip(sin) {
            let (x0, x1) = (pair[0], pair[1]);
            pair[0] = x0.mul_add(*c, -(x1 * s));
            pair[1] = x0.mul_add(*s, x1 * c);
        }
    }
}

/// RMS norm: `out[i] = x[i] / sqrt(mean(x²) + eps) · w[i]` (squares in f32, summed in f64, as ggml).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let sum: f64 = x.iter().map(|v| f64::from(v * v)).sum();
    #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

/// `e^x` in single precision, computed the way ggml's AVX-512 `expf` does
/// (a range reduction to `2^n · e^b`, a degree-5 polynomial for `e^b`, and
/// an exact scaling by `2^n`). llama.cpp uses it in softmax and SiLU; using
/// the same function keeps greedy output identical to it.
#[inline(always)]
pub fn exp_ggml(x: f32) -> f32 {
    let (j, n) = exp_parts(x);
    // scalef: j · 2^n rounded once. For n in [-126, 127], 2^n is a normal
    // f32 and one multiplication does exactly that.
    if (-126.0..=127.0).contains(&n) {
        return j * pow2(n);
    }
    exp_ggml_edge(j, n)
}

/// `e^x = j · 2^n`: `n` the nearest integer to `x · log2(e)`, `j` the
/// degree-5 polynomial for `e^b` at the rest `b` (ggml's constants).
#[inline(always)]
fn exp_parts(x: f32) -> (f32, f32) {
    let shift = f32::from_bits(0x4b40_0000); // 1.5 · 2^23
    let z = x.mul_add(f32::from_bits(0x3fb8_aa3b), shift); // log2(e)
    let n = z - shift;
    let b = (-n).mul_add(
        f32::from_bits(0x35bf_be8e),                  // ln 2, low part
        (-n).mul_add(f32::from_bits(0x3f31_7200), x), // ln 2, high part
    );
    let u = b * b;
    let j = f32::from_bits(0x3c07_2010)
        .mul_add(b, f32::from_bits(0x3d2b_9f17))
        .mul_add(
            u,
            f32::from_bits(0x3e2a_af33).mul_add(b, f32::from_bits(0x3eff_fedb)),
        )
        .mul_add(u, f32::from_bits(0x3f7f_fff6).mul_add(b, 1.0));
    (j, n)
}

/// `2^n` for an integral `n` in [-126, 127].
#[inline(always)]
fn pow2(n: f32) -> f32 {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let bits = ((n as i32 + 127) as u32) << 23;
    f32::from_bits(bits)
}

/// [`exp_ggml`] far from zero: flushes beyond |n| > 192, else scales in f64
/// (exact) and rounds once.
#[cold]
fn exp_ggml_edge(j: f32, n: f32) -> f32 {
    if n.is_nan() {
        return f32::NAN;
    }
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    #[allow(clippy::cast_possible_truncation)]
    let scaled = (f64::from(j) * 2f64.powi(n as i32)) as f32;
    scaled
}

/// `gate[i] = silu(gate[i]) · up[i]`, with `silu(x) = x / (1 + e^-x)` and
/// `e^x` as [`exp_ggml`].
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    let n = gate.len().min(up.len());
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    if crate::simd_available() {
        // SAFETY: AVX2 and FMA are present; chunks stay below `n`.
        unsafe { i = exp_avx2::silu_mul(&mut gate[..n], &up[..n]) };
    }
    for (g, u) in gate[i..n].iter_mut().zip(&up[i..n]) {
        *g = *g / (1.0 + exp_ggml(0.0 - *g)) * u;
    }
}

/// Softmax as ggml computes it: `e^(x - max)` with [`exp_ggml`], sums of
/// sixteen-element chunks added in f32 (`reduce16`, as `_mm512_reduce_add_ps`) then in f64, and one
/// multiplication by `(f32)(1 / sum)`.
pub fn softmax_ggml(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if crate::simd_available() {
        // SAFETY: AVX2 and FMA are present; chunks stay inside `x`.
        unsafe { done = exp_avx2::exp_minus(x, max) };
    }
    for v in &mut x[done..] {
        *v = exp_ggml(*v - max);
    }
    let mut sum = 0f64;
    for chunk in x.chunks(16) {
        let mut l = [0f32; 16];
        l[..chunk.len()].copy_from_slice(chunk);
        sum += f64::from(reduce16(&l));
    }
    #[allow(clippy::cast_possible_truncation)]
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// Attention probabilities as llama.cpp computes them, in three passes
/// instead of six: `x` scaled by `scale`, [`softmax_ggml`], then (if
/// `round_f16`) rounded to f16, with the same result bit for bit: the
/// maximum does not depend on order, every exponential and chunk sum is the
/// one `softmax_ggml` computes, and the chunk sums are added in the same
/// order.
pub fn attention_softmax(x: &mut [f32], scale: f32, round_f16: bool) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd_available() {
        // SAFETY: AVX2, FMA and F16C are present.
        unsafe { exp_avx2::attention_softmax(x, scale, round_f16) };
        return;
    }
    for v in x.iter_mut() {
        *v *= scale;
    }
    softmax_ggml(x);
    if round_f16 {
        round_f16_slice(x);
    }
}

#[cfg(target_arch = "x86_64")]
mod exp_avx2 {
    use super::exp_ggml;
    use std::arch::x86_64::*;

    /// Eight [`exp_ggml`]s. Lanes whose exponent leaves [-126, 127] (rare)
    /// are recomputed by the scalar function.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[inline(always)]
    unsafe fn exp8(x: __m256) -> __m256 {
        unsafe {
            let c = |bits: u32| _mm256_set1_ps(f32::from_bits(bits));
            let r = c(0x4b40_0000);
            let z = _mm256_fmadd_ps(x, c(0x3fb8_aa3b), r);
            let n = _mm256_sub_ps(z, r);
            let b = _mm256_fnmadd_ps(n, c(0x35bf_be8e), _mm256_fnmadd_ps(n, c(0x3f31_7200), x));
            let u = _mm256_mul_ps(b, b);
            let j = _mm256_fmadd_ps(
                _mm256_fmadd_ps(
                    _mm256_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
                    u,
                    _mm256_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
                ),
                u,
                _mm256_fmadd_ps(c(0x3f7f_fff6), b, _mm256_set1_ps(1.0)),
            );
            let ni = _mm256_cvtps_epi32(n);
            let pow2 = _mm256_castsi256_ps(_mm256_slli_epi32(
                _mm256_add_epi32(ni, _mm256_set1_epi32(127)),
                23,
            ));
            let res = _mm256_mul_ps(j, pow2);
            let ok = _mm256_and_ps(
                _mm256_cmp_ps(n, _mm256_set1_ps(-126.0), _CMP_GE_OQ),
                _mm256_cmp_ps(n, _mm256_set1_ps(127.0), _CMP_LE_OQ),
            );
            if _mm256_movemask_ps(ok) == 0xFF {
                return res;
            }
            let mut xs = [0f32; 8];
            _mm256_storeu_ps(xs.as_mut_ptr(), x);
            for v in &mut xs {
                *v = exp_ggml(*v);
            }
            _mm256_loadu_ps(xs.as_ptr())
        }
    }

    /// SiLU times `up` over whole chunks of eight; returns how many were done.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA, and `up` is at least as long as `gate`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn silu_mul(gate: &mut [f32], up: &[f32]) -> usize {
        let n = gate.len() / 8 * 8;
        let mut i = 0;
        // SAFETY: i + 8 <= n <= both lengths.
        unsafe {
            while i < n {
                let g = _mm256_loadu_ps(gate.as_ptr().add(i));
                let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
                let s = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0), e));
                _mm256_storeu_ps(
                    gate.as_mut_ptr().add(i),
                    _mm256_mul_ps(s, _mm256_loadu_ps(up.as_ptr().add(i))),
                );
                i += 8;
            }
        }
        n
    }

    /// [`super::attention_softmax`] on AVX2: scale and maximum in one
    /// pass, exponentials and the sum of each sixteen-element chunk in a
    /// second, the normalization and rounding in a third.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn attention_softmax(x: &mut [f32], scale: f32, round_f16: bool) {
        let n = x.len();
        let whole = n / 8 * 8;
        let p = x.as_mut_ptr();
        // SAFETY: every access below is at an index below `n`.
        unsafe {
            let s = _mm256_set1_ps(scale);
            // `max_ps(v, m)` keeps `m` where `v` is NaN, as `f32::max` does.
            let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
            let mut i = 0;
            while i < whole {
                let v = _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), s);
                _mm256_storeu_ps(p.add(i), v);
                m = _mm256_max_ps(v, m);
                i += 8;
            }
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), m);
            let mut max = lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            for v in &mut x[whole..] {
                *v *= scale;
                max = f32::max(max, *v);
            }
            let p = x.as_mut_ptr();
            let mx = _mm256_set1_ps(max);
            let mut sum = 0f64;
            let mut i = 0;
            while i + 16 <= n {
                let lo = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), mx));
                let hi = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i + 8)), mx));
                _mm256_storeu_ps(p.add(i), lo);
                _mm256_storeu_ps(p.add(i + 8), hi);
                // reduce16: t3[j] = l[j + 8] + l[j]; t6[j] = t3[j + 4] + t3[j];
                // (t6[0] + t6[2]) + (t6[1] + t6[3]).
                let t3 = _mm256_add_ps(hi, lo);
                let t6 = _mm_add_ps(_mm256_extractf128_ps::<1>(t3), _mm256_castps256_ps128(t3));
                let t = _mm_add_ps(t6, _mm_movehl_ps(t6, t6));
                let r = _mm_add_ss(t, _mm_shuffle_ps::<0b01>(t, t));
                sum += f64::from(_mm_cvtss_f32(r));
                i += 16;
            }
            if i < n {
                let tail = &mut x[i..];
                let done = exp_minus(tail, max);
                for v in &mut tail[done..] {
                    *v = exp_ggml(*v - max);
                }
                let mut l = [0f32; 16];
                l[..tail.len()].copy_from_slice(tail);
                sum += f64::from(crate::sum_order::reduce16(&l));
            }
            #[allow(clippy::cast_possible_truncation)]
            let inv = (1.0 / sum) as f32;
            let p = x.as_mut_ptr();
            let iv = _mm256_set1_ps(inv);
            let mut i = 0;
            while i < whole {
                let mut v = _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), iv);
                if round_f16 {
                    v = _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v));
                }
                _mm256_storeu_ps(p.add(i), v);
                i += 8;
            }
            for v in &mut x[whole..] {
                *v *= inv;
                if round_f16 {
                    *v = half::f16::from_f32(*v).to_f32();
                }
            }
        }
    }

    /// `x[i] = e^(x[i] - max)` over whole chunks of eight; returns how many were done.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn exp_minus(x: &mut [f32], max: f32) -> usize {
        let n = x.len() / 8 * 8;
        let m = _mm256_set1_ps(max);
        let mut i = 0;
        // SAFETY: i + 8 <= n <= x.len().
        unsafe {
            while i < n {
                let v = _mm256_sub_ps(_mm256_loadu_ps(x.as_ptr().add(i)), m);
                _mm256_storeu_ps(x.as_mut_ptr().add(i), exp8(v));
                i += 8;
            }
        }
        n
    }
}

multiversion! {
    /// `x[i] = gelu(x[i])`, the exact GELU `x/2 · (1 + erf(x/√2))` (BERT's
    /// `gelu`), with `erfc` from its Chebyshev fit (relative error below
    /// 1.2e-7) and `e^x` by a branch-free range reduction, so the loop
    /// vectorizes.
    pub fn gelu_erf(x: &mut [f32]) {
        for v in x.iter_mut() {
            // erf(9/√2·…) is 1 in f32: clamping keeps e^(-z²) normal.
            let z = (v.abs() * std::f32::consts::FRAC_1_SQRT_2).min(9.0);
            let t = 1.0 / 0.5f32.mul_add(z, 1.0);
            let p = ERFC_FIT[1..]
                .iter()
                .fold(ERFC_FIT[0], |acc, &c| acc.mul_add(t, c));
            let erfc = t * exp_normal((-z).mul_add(z, p));
            let r = if *v >= 0.0 { 2.0 - erfc } else { erfc };
            *v *= 0.5 * r;
        }
    }
}

/// Numerical Recipes' Chebyshev fit of `erfc(z) = t · e^(-z² + p(t))`,
/// `t = 1 / (1 + z/2)`: the coefficients of `p`, highest power first.
#[allow(clippy::excessive_precision)]
const ERFC_FIT: [f32; 10] = [
    0.170_872_77,
    -0.822_152_23,
    1.488_515_87,
    -1.135_203_98,
    0.278_868_07,
    -0.186_288_06,
    0.096_784_18,
    0.374_091_96,
    1.000_023_68,
    -1.265_512_23,
];

/// `e^x` for `x` in [-87, 0] (a result that is a normal f32), as
/// [`exp_ggml`] computes it but with no branch for the edges.
#[inline(always)]
fn exp_normal(x: f32) -> f32 {
    let (j, n) = exp_parts(x);
    j * pow2(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_erf_is_the_exact_gelu_within_a_few_ulps() {
        // 0.5 · x · (1 + erf(x / √2)), from Python's math.erf.
        let table: [(f32, f64); 17] = [
            (-12.0, -0.0),
            (-6.0, -5.919525869479969e-09),
            (-3.0, -0.00404969409489031),
            (-2.0, -0.04550026389635842),
            (-1.0, -0.15865525393145707),
            (-0.5, -0.15426876936299344),
            (-0.1, -0.0460172162722971),
            (0.0, 0.0),
            (0.1, 0.053982783727702904),
            (0.5, 0.34573123063700656),
            (1.0, 0.8413447460685429),
            (1.5, 1.399789198096713),
            (2.0, 1.9544997361036416),
            (3.0, 2.99595030590511),
            (4.0, 3.9998733150326675),
            (6.0, 5.999999994080474),
            (12.0, 12.0),
        ];
        let mut x: Vec<f32> = table.iter().map(|&(x, _)| x).collect();
        // Long enough for the vector loop and its tail.
        x.extend_from_slice(&table.map(|(x, _)| x));
        gelu_erf(&mut x);
        for (got, &(at, want)) in x.iter().zip(table.iter().chain(table.iter())) {
            let err = (f64::from(*got) - want).abs();
            assert!(
                err <= 4e-7 * want.abs().max(1e-3),
                "gelu({at}) = {got}, want {want}"
            );
        }
    }

    #[test]
    fn fused_attention_softmax_equals_its_three_passes() {
        let mut seed = 7u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        for n in [1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 517] {
            for (spread, round) in [(3.0, true), (40.0, true), (3.0, false), (300.0, true)] {
                let x: Vec<f32> = (0..n).map(|_| next() * spread).collect();
                let mut want = x.clone();
                for v in &mut want {
                    *v *= 0.125;
                }
                softmax_ggml(&mut want);
                if round {
                    round_f16_slice(&mut want);
                }
                let mut got = x.clone();
                attention_softmax(&mut got, 0.125, round);
                assert!(
                    got.iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "n={n} spread={spread} round={round}"
                );
            }
        }
    }

    #[test]
    fn dot_agrees_with_naive_sums() {
        let a: Vec<f32> = (0..37).map(|i| i as f32 * 0.5 - 3.0).collect();
        let b: Vec<f32> = (0..37).map(|i| (i % 7) as f32 - 2.0).collect();
        let naive: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot_f32(&a, &b) - naive).abs() < 1e-3);
    }

    #[test]
    fn exp_ggml_is_close_to_libm_and_handles_extremes() {
        for i in -2000..2000 {
            let x = i as f32 * 0.043;
            let (a, b) = (exp_ggml(x), x.exp());
            assert!((a - b).abs() <= 4.0 * f32::EPSILON * b, "{x}: {a} vs {b}");
        }
        assert_eq!(exp_ggml(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_ggml(-200.0), 0.0);
        assert_eq!(exp_ggml(0.0), 1.0);
        let mut p = [
            0.5f32,
            f32::NEG_INFINITY,
            2.0,
            1.0,
            -3.0,
            0.0,
            0.1,
            0.2,
            0.3,
        ];
        softmax_ggml(&mut p);
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6 && p[1] == 0.0);
    }

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    #[test]
    fn vector_exp_softmax_and_silu_equal_the_scalar_definitions() {
        let mut seed = 11;
        let xs: Vec<f32> = (0..1000).map(|_| lcg(&mut seed) * 40.0).collect();
        let mut soft = xs.clone();
        softmax_ggml(&mut soft);
        let max = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = xs.iter().map(|x| exp_ggml(x - max)).collect();
        let sum: f64 = e
            .chunks(16)
            .map(|c| {
                let mut l = [0f32; 16];
                l[..c.len()].copy_from_slice(c);
                f64::from(reduce16(&l))
            })
            .sum();
        let inv = (1.0 / sum) as f32;
        let want: Vec<f32> = e.iter().map(|v| v * inv).collect();
        assert_eq!(soft, want);

        let up: Vec<f32> = (0..1000).map(|_| lcg(&mut seed)).collect();
        let mut gate = xs.clone();
        silu_mul(&mut gate, &up);
        let want: Vec<f32> = xs
            .iter()
            .zip(&up)
            .map(|(g, u)| g / (1.0 + exp_ggml(0.0 - g)) * u)
            .collect();
        assert_eq!(gate, want);
    }

    #[test]
    fn softmax_and_norm_are_normalized() {
        let mut x = [1.0f32, 2.0, 3.0];
        softmax_ggml(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        let mut out = [0f32; 2];
        rms_norm(&[3.0, 4.0], &[1.0, 1.0], 0.0, &mut out);
        let rms = (12.5f32).sqrt();
        assert!((out[0] - 3.0 / rms).abs() < 1e-6 && (out[1] - 4.0 / rms).abs() < 1e-6);
    }
}
