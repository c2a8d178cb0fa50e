//! Small f32 vector operations of a transformer layer.
//!
//! Bodies are plain Rust written so LLVM vectorizes them; on x86-64 each is
//! compiled a second time with AVX2 + FMA enabled and chosen at run time.

/// Declares `pub fn $name` that dispatches to an AVX2 build of `$body` when available.
macro_rules! multiversion {
    ($(#[$m:meta])* pub fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? $body:block) => {
        $(#[$m])*
        pub fn $name($($arg: $ty),*) $(-> $ret)? {
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

multiversion! {
    /// `out[i] += alpha · x[i]`.
    pub fn axpy(alpha: f32, x: &[f32], out: &mut [f32]) {
        for (o, v) in out.iter_mut().zip(x) {
            *o = alpha.mul_add(*v, *o);
        }
    }
}

multiversion! {
    /// `out[t] = Σ_d q[d] · k[d · width + t]` for `t < out.len()`: one query
    /// against the keys of a page stored dimension-major (`[dim][width]`).
    pub fn dot_columns(q: &[f32], k: &[f32], width: usize, out: &mut [f32]) {
        out.fill(0.0);
        let n = out.len();
        for (d, qd) in q.iter().enumerate() {
            let row = &k[d * width..d * width + n];
            for (o, kv) in out.iter_mut().zip(row) {
                *o = qd.mul_add(*kv, *o);
            }
        }
    }
}

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

/// Largest page width [`dot_columns_ordered`] accepts.
pub const MAX_WIDTH: usize = 64;

multiversion! {
    /// As [`dot_columns`], summing over `q`'s dimensions in `order`.
    /// `q.len()` must be at least `order.lanes()`; `acc` is scratch space
    /// whose contents do not matter.
    pub fn dot_columns_ordered(
        q: &[f32],
        k: &[f32],
        width: usize,
        out: &mut [f32],
        order: SumOrder,
        acc: &mut [[f32; MAX_WIDTH]; LANES]
    ) {
        let n = out.len().min(MAX_WIDTH);
        let lanes = order.lanes();
        // The first product of each lane is stored, later ones fused in:
        // the same sums as starting from zero, without clearing the buffer.
        for (d, qd) in q.iter().enumerate() {
            let lane = &mut acc[d % lanes][..n];
            let row = &k[d * width..d * width + n];
            if d < lanes {
                for (a, kv) in lane.iter_mut().zip(row) {
                    *a = qd * kv;
                }
            } else {
                for (a, kv) in lane.iter_mut().zip(row) {
                    *a = qd.mul_add(*kv, *a);
                }
            }
        }
        match order {
            SumOrder::Sgemm => {
                for (t, o) in out.iter_mut().enumerate().take(n) {
                    *o = reduce16(&std::array::from_fn(|j| acc[j][t]));
                }
            }
            SumOrder::VecDot => {
                for (t, o) in out.iter_mut().enumerate().take(n) {
                    *o = reduce16(&std::array::from_fn(|j| {
                        (acc[j][t] + acc[32 + j][t]) + (acc[16 + j][t] + acc[48 + j][t])
                    }));
                }
            }
        }
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
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    if n.is_nan() {
        return f32::NAN;
    }
    // scalef: j · 2^n, rounded once (exact in f64 for |n| <= 192).
    #[allow(clippy::cast_possible_truncation)]
    let scaled = (f64::from(j) * 2f64.powi(n as i32)) as f32;
    scaled
}

multiversion! {
    /// `gate[i] = silu(gate[i]) · up[i]`, with `silu(x) = x / (1 + e^-x)`.
    pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
        for (g, u) in gate.iter_mut().zip(up) {
            *g = *g / (1.0 + exp_ggml(0.0 - *g)) * u;
        }
    }
}

multiversion! {
    /// Softmax as ggml computes it: `e^(x - max)` with [`exp_ggml`], sums of
    /// sixteen-element chunks added in f32 ([`reduce16`]) then in f64, and
    /// one multiplication by `(f32)(1 / sum)`.
    pub fn softmax_ggml(x: &mut [f32]) {
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f64;
        for chunk in x.chunks_mut(16) {
            let mut l = [0f32; 16];
            for (i, v) in chunk.iter_mut().enumerate() {
                *v = exp_ggml(*v - max);
                l[i] = *v;
            }
            sum += f64::from(reduce16(&l));
        }
        #[allow(clippy::cast_possible_truncation)]
        let inv = (1.0 / sum) as f32;
        for v in x.iter_mut() {
            *v *= inv;
        }
    }
}

/// In-place softmax over `x`; returns nothing for an empty slice.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_and_columns_agree_with_naive_sums() {
        let a: Vec<f32> = (0..37).map(|i| i as f32 * 0.5 - 3.0).collect();
        let b: Vec<f32> = (0..37).map(|i| (i % 7) as f32 - 2.0).collect();
        let naive: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot_f32(&a, &b) - naive).abs() < 1e-3);

        let q = [1.0, 2.0, -1.0];
        let k = [1.0, 0.0, 2.0, 0.0, 3.0, 0.0, 1.0, 1.0, 4.0, 0.0, 0.0, 9.0];
        let mut out = [0f32; 3];
        dot_columns(&q, &k, 4, &mut out);
        assert_eq!(out, [1.0 + 6.0 - 4.0, 0.0, 2.0 + 2.0 - 0.0]);
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

    #[test]
    fn softmax_and_norm_are_normalized() {
        let mut x = [1.0f32, 2.0, 3.0];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        let mut out = [0f32; 2];
        rms_norm(&[3.0, 4.0], &[1.0, 1.0], 0.0, &mut out);
        let rms = (12.5f32).sqrt();
        assert!((out[0] - 3.0 / rms).abs() < 1e-6 && (out[1] - 4.0 / rms).abs() < 1e-6);
    }
}
