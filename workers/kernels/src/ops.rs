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

multiversion! {
    /// `x[i] += y[i]`.
    pub fn add_assign(x: &mut [f32], y: &[f32]) {
        for (a, b) in x.iter_mut().zip(y) {
            *a += b;
        }
    }
}

/// RMS norm: `out[i] = x[i] / sqrt(mean(x²) + eps) · w[i]` (sum of squares in f64, as ggml).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let sum: f64 = x.iter().map(|v| f64::from(*v) * f64::from(*v)).sum();
    #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

/// `gate[i] = silu(gate[i]) · up[i]`.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
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
