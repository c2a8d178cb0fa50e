//! The encoder's arithmetic on plain row-major `f32` buffers: matrix
//! products (gemm's kernels, the ones candle calls, without candle's
//! per-operation tensors, threads and barriers), layer norm and the
//! residual add.
//!
//! A product's operands are [`View`]s: a slice with row and column
//! strides, so a head's queries, keys (transposed) and values are read in
//! place inside the fused projection's output, never copied out.

pub(crate) use gemm::Parallelism;

/// A matrix inside a slice: element `(r, c)` at `data[r * rs + c * cs]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct View<'a> {
    pub(crate) data: &'a [f32],
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) rs: usize,
    pub(crate) cs: usize,
}

impl<'a> View<'a> {
    /// A dense row-major matrix of `cols` columns.
    pub(crate) fn rows(data: &'a [f32], rows: usize, cols: usize) -> Self {
        View {
            data,
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }

    /// The transpose (no copy).
    pub(crate) fn t(self) -> Self {
        View {
            data: self.data,
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
        }
    }

    /// Whether every element lies in `data`.
    fn fits(&self) -> bool {
        self.rows == 0
            || self.cols == 0
            || (self.rows - 1) * self.rs + (self.cols - 1) * self.cs < self.data.len()
    }
}

/// `out = a · b` (or `out += a · b` with `accumulate`), `out` row-major
/// with rows `out_rs` apart. The sum over the inner dimension runs in
/// gemm's order, the same for a row whatever the other rows are.
///
/// # Panics
/// If the shapes do not agree or a view or `out` is too short.
pub(crate) fn product(
    a: View<'_>,
    b: View<'_>,
    out: &mut [f32],
    out_rs: usize,
    accumulate: bool,
    par: Parallelism,
) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert!(
        b.rows == k && a.fits() && b.fits() && out_rs >= n,
        "product shapes"
    );
    if m == 0 || n == 0 {
        return;
    }
    assert!((m - 1) * out_rs + n <= out.len(), "product output");
    if k == 0 {
        if !accumulate {
            for r in 0..m {
                out[r * out_rs..r * out_rs + n].fill(0.0);
            }
        }
        return;
    }
    let stride = |x: usize| isize::try_from(x).expect("a stride fits isize");
    #[allow(unsafe_code)]
    // SAFETY: every element gemm reads lies in `a.data` or `b.data`
    // (`fits`), every element it writes in `out` (`(m-1)·out_rs + n ≤
    // len`), and `out` is borrowed mutably, so it aliases neither input.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            stride(out_rs),
            accumulate,
            a.data.as_ptr(),
            stride(a.cs),
            stride(a.rs),
            b.data.as_ptr(),
            stride(b.cs),
            stride(b.rs),
            1.0,
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}

/// `x · w + bias` for `x` of `k` columns and `w` of `k × n` (row-major,
/// `n` the bias's length): each output row starts as the bias and the
/// product is added to it, as candle's `matmul` then `broadcast_add` round
/// it.
pub(crate) fn linear(x: &[f32], w: &[f32], bias: &[f32], par: Parallelism) -> Vec<f32> {
    let (n, k) = (bias.len(), w.len() / bias.len().max(1));
    let rows = x.len() / k.max(1);
    let mut out = Vec::with_capacity(rows * n);
    for _ in 0..rows {
        out.extend_from_slice(bias);
    }
    product(
        View::rows(x, rows, k),
        View::rows(w, k, n),
        &mut out,
        n,
        true,
        par,
    );
    out
}

/// `x = layer_norm(x + add)` over rows of `weight.len()` values.
pub(crate) fn add_norm(x: &mut [f32], add: &[f32], (weight, bias): (&[f32], &[f32]), eps: f32) {
    for (a, b) in x.iter_mut().zip(add) {
        *a += b;
    }
    norm(x, (weight, bias), eps);
}

/// Layer norm of every row of `weight.len()` values of `x`, in place:
/// `(x - mean) / sqrt(var + eps) · weight + bias`, the variance over the
/// row (biased), as BERT's `LayerNorm`.
pub(crate) fn norm(x: &mut [f32], (weight, bias): (&[f32], &[f32]), eps: f32) {
    let dim = weight.len().max(1);
    #[allow(clippy::cast_precision_loss)]
    let inv_dim = 1.0 / dim as f32;
    for row in x.chunks_exact_mut(dim) {
        let mean = row.iter().sum::<f32>() * inv_dim;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() * inv_dim;
        let inv_std = 1.0 / (var + eps).sqrt();
        for ((v, w), b) in row.iter_mut().zip(weight).zip(bias) {
            *v = (*v - mean) * inv_std * w + b;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: View<'_>, b: View<'_>) -> Vec<f32> {
        let mut out = vec![0.0; a.rows * b.cols];
        for r in 0..a.rows {
            for c in 0..b.cols {
                out[r * b.cols + c] = (0..a.cols)
                    .map(|i| {
                        f64::from(a.data[r * a.rs + i * a.cs])
                            * f64::from(b.data[i * b.rs + c * b.cs])
                    })
                    .sum::<f64>() as f32;
            }
        }
        out
    }

    fn data(n: usize, seed: u32) -> Vec<f32> {
        let mut x = seed.wrapping_mul(2_654_435_761).max(1);
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                #[allow(clippy::cast_precision_loss)]
                let v = (x % 2001) as f32 / 1000.0 - 1.0;
                v
            })
            .collect()
    }

    #[test]
    fn products_of_strided_views_match_the_definition() {
        // A fused projection's output: rows of [q | k | v], 3 × 8 wide.
        let (len, hd, width) = (5, 8, 24);
        let qkv = data(len * width, 1);
        let q = View {
            data: &qkv,
            rows: len,
            cols: hd,
            rs: width,
            cs: 1,
        };
        let k = View {
            data: &qkv[hd..],
            rows: len,
            cols: hd,
            rs: width,
            cs: 1,
        };
        let mut scores = vec![0.0; len * len];
        product(q, k.t(), &mut scores, len, false, Parallelism::None);
        for (got, want) in scores.iter().zip(naive(q, k.t())) {
            assert!((got - want).abs() < 1e-5, "{got} against {want}");
        }
        // Into every other column block of a wider output, accumulating.
        let v = View {
            data: &qkv[2 * hd..],
            rows: len,
            cols: hd,
            rs: width,
            cs: 1,
        };
        let p = View::rows(&scores, len, len);
        let mut out = vec![1.0; len * 2 * hd];
        product(p, v, &mut out[hd..], 2 * hd, true, Parallelism::None);
        let want = naive(p, v);
        for r in 0..len {
            assert!(
                out[r * 2 * hd..r * 2 * hd + hd].iter().all(|&x| x == 1.0),
                "left block kept"
            );
            for c in 0..hd {
                let got = out[r * 2 * hd + hd + c];
                assert!((got - (1.0 + want[r * hd + c])).abs() < 1e-4, "{got}");
            }
        }
    }

    #[test]
    #[should_panic(expected = "product shapes")]
    fn a_view_past_its_slice_is_refused() {
        let a = data(8, 2);
        let short = View {
            data: &a,
            rows: 3,
            cols: 3,
            rs: 3,
            cs: 1,
        };
        let mut out = vec![0.0; 9];
        product(
            short,
            View::rows(&a, 3, 1),
            &mut out,
            1,
            false,
            Parallelism::None,
        );
    }

    #[test]
    #[should_panic(expected = "product output")]
    fn an_output_too_short_for_its_rows_is_refused() {
        let a = data(9, 4);
        let mut out = vec![0.0; 8];
        product(
            View::rows(&a, 3, 3),
            View::rows(&a, 3, 3),
            &mut out,
            3,
            false,
            Parallelism::None,
        );
    }

    #[test]
    fn a_row_norm_has_zero_mean_and_unit_variance_before_its_affine() {
        let mut x = data(3 * 16, 3);
        let (w, b) = (vec![1.0; 16], vec![0.0; 16]);
        norm(&mut x, (&w, &b), 1e-12);
        for row in x.chunks_exact(16) {
            let mean = row.iter().sum::<f32>() / 16.0;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / 16.0;
            assert!(
                mean.abs() < 1e-5 && (var - 1.0).abs() < 1e-4,
                "{mean} {var}"
            );
        }
    }
}
