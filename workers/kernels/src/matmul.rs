//! Weight matrices and the parallel matmul `out = x · Wᵀ`.
//!
//! Work is split over output columns (weight rows) into chunks that rayon
//! spreads over the current thread pool; callers run a whole forward pass
//! inside one `ThreadPool::install` so no per-matmul thread hand-off occurs.

use crate::dot::{OutPtr, weight_rows_dots};
use crate::ops::dot_f32;
use crate::quant::{ActivationKind, ActivationsQ8, WeightsQ};
use rayon::prelude::*;

/// A weight matrix of `rows` (outputs) x `cols` (inputs).
#[derive(Debug, Clone)]
pub enum Matrix {
    /// Quantized blocks, computed at their own precision.
    Quant(WeightsQ),
    /// Plain f32 weights (F32 and F16 files, and dequantized fallbacks).
    F32 {
        /// Output features.
        rows: usize,
        /// Input features.
        cols: usize,
        /// Row-major values.
        data: Vec<f32>,
    },
}

/// Activation rows prepared for matmuls, quantized lazily once per kind.
///
/// One `Workspace` serves every matrix that reads the same input (q, k and v;
/// gate and up), so activations are quantized once for all of them.
#[derive(Debug)]
pub struct Workspace<'a> {
    x: &'a [f32],
    rows: usize,
    cols: usize,
    scratch: &'a mut QuantScratch,
    /// Which of `scratch`'s kinds hold this input: `[Q8_0, Q8_1]`.
    quantized: [bool; 2],
}

/// The quantized-activation buffers a [`Workspace`] fills, kept by the
/// caller from one input to the next so that a forward pass allocates
/// them once (and faults in no fresh pages after its first step).
#[derive(Debug, Default)]
pub struct QuantScratch {
    q8_0: ActivationsQ8,
    q8_1: ActivationsQ8,
}

impl<'a> Workspace<'a> {
    /// Wraps `rows` activation rows of `cols` values, to be quantized into
    /// `scratch`'s buffers.
    pub fn new(x: &'a [f32], rows: usize, cols: usize, scratch: &'a mut QuantScratch) -> Self {
        assert_eq!(x.len(), rows * cols, "activation shape");
        Workspace {
            x,
            rows,
            cols,
            scratch,
            quantized: [false; 2],
        }
    }

    fn quantized(&mut self, kind: ActivationKind) -> &ActivationsQ8 {
        let (slot, done) = match kind {
            ActivationKind::Q8_0 => (&mut self.scratch.q8_0, &mut self.quantized[0]),
            ActivationKind::Q8_1 => (&mut self.scratch.q8_1, &mut self.quantized[1]),
        };
        if !*done {
            slot.requantize(self.x, self.rows, self.cols);
            *done = true;
        }
        slot
    }
}

/// Output columns one parallel task computes.
const CHUNK: usize = 16;

impl Matrix {
    /// Output features.
    pub fn rows(&self) -> usize {
        match self {
            Matrix::Quant(w) => w.rows(),
            Matrix::F32 { rows, .. } => *rows,
        }
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        match self {
            Matrix::Quant(w) => w.cols(),
            Matrix::F32 { cols, .. } => *cols,
        }
    }

    /// Writes row `row` as f32 into `out`.
    pub fn row_f32(&self, row: usize, out: &mut [f32]) {
        match self {
            Matrix::Quant(w) => w.dequantize_row(row, out),
            Matrix::F32 { cols, data, .. } => {
                out.copy_from_slice(&data[row * cols..(row + 1) * cols]);
            }
        }
    }

    /// `out[r * self.rows() + j] = Σ_k x[r, k] · W[j, k]` for every input row `r`.
    ///
    /// # Panics
    /// If the shapes disagree; they are fixed when a model loads.
    pub fn matmul(&self, ws: &mut Workspace<'_>, out: &mut [f32]) {
        let Matrix::F32 { cols, data, .. } = self else {
            // A section of one.
            return matmul_all(ws, &mut [(self, out)]);
        };
        assert_eq!(ws.cols, *cols, "matmul inner dimension");
        let n_out = self.rows();
        assert_eq!(out.len(), ws.rows * n_out, "matmul output shape");
        let ptr = OutPtr(out.as_mut_ptr());
        let (x, rows, cols) = (ws.x, ws.rows, *cols);
        (0..n_out.div_ceil(CHUNK)).into_par_iter().for_each(|c| {
            for j in c * CHUNK..((c + 1) * CHUNK).min(n_out) {
                let wr = &data[j * cols..(j + 1) * cols];
                for r in 0..rows {
                    let v = dot_f32(wr, &x[r * cols..(r + 1) * cols]);
                    // SAFETY: `out` has rows x n_out elements (asserted
                    // above) and task `c` alone writes the columns of
                    // chunk `c`.
                    unsafe { ptr.write(r * n_out + j, v) };
                }
            }
        });
    }
}

/// Matmuls that read one input, run as one parallel section.
///
/// Each `(matrix, out)` pair gets what [`Matrix::matmul`] writes for it
/// (a quantized matrix's `matmul` is this with one pair): the same tiles
/// over the same chunks of sixteen columns; only the threads meet once for
/// all of them instead of once per matrix. Matrices whose activations
/// differ in kind (or that are not quantized) run one after another.
///
/// # Panics
/// As [`Matrix::matmul`], if a pair's shapes disagree with the input.
pub fn matmul_all(ws: &mut Workspace<'_>, jobs: &mut [(&Matrix, &mut [f32])]) {
    let kind = |m: &Matrix| match m {
        Matrix::Quant(w) => Some(w.format().activation_kind()),
        Matrix::F32 { .. } => None,
    };
    let shared = jobs.first().and_then(|(m, _)| kind(m));
    let Some(shared) = shared.filter(|k| jobs.iter().all(|(m, _)| kind(m) == Some(*k))) else {
        for (m, out) in jobs.iter_mut() {
            m.matmul(ws, out);
        }
        return;
    };
    // (weights, output, its columns, first chunk of the section)
    let mut parts = Vec::with_capacity(jobs.len());
    let mut chunks = 0;
    for (m, out) in jobs.iter_mut() {
        let Matrix::Quant(w) = *m else {
            unreachable!("every job was found quantized above")
        };
        assert_eq!(ws.cols, w.cols(), "matmul inner dimension");
        let n_out = w.rows();
        assert_eq!(out.len(), ws.rows * n_out, "matmul output shape");
        parts.push((w, OutPtr(out.as_mut_ptr()), n_out, chunks));
        chunks += n_out.div_ceil(CHUNK);
    }
    let act = ws.quantized(shared);
    (0..chunks).into_par_iter().for_each(|c| {
        let Some(&(w, ptr, n_out, first)) = parts.iter().rev().find(|p| p.3 <= c) else {
            return;
        };
        let c = c - first;
        let cols = c * CHUNK..((c + 1) * CHUNK).min(n_out);
        // SAFETY: each output has rows x n_out elements (asserted above),
        // the outputs are distinct slices, and task `c` alone writes the
        // columns of its chunk of its output.
        unsafe { weight_rows_dots(w, cols, act, ptr, n_out) };
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dot::weight_row_dots_scalar;
    use crate::quant::WeightFormat;

    /// Deterministic pseudo-random bytes and floats for kernel tests.
    fn lcg(seed: &mut u64) -> u64 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *seed >> 33
    }

    fn random_gguf(format: WeightFormat, rows: usize, cols: usize, seed: &mut u64) -> Vec<u8> {
        let bb = format.gguf_block_bytes();
        let mut bytes = Vec::new();
        for _ in 0..rows * cols / 32 {
            let d = half::f16::from_f32(0.01 + (lcg(seed) % 100) as f32 * 1e-4);
            bytes.extend_from_slice(&d.to_bits().to_le_bytes());
            let rest = bb - 2;
            let m_bytes = if format == WeightFormat::Q4_1 {
                let m = half::f16::from_f32(-0.05 + (lcg(seed) % 100) as f32 * 1e-3);
                bytes.extend_from_slice(&m.to_bits().to_le_bytes());
                2
            } else {
                0
            };
            for _ in 0..rest - m_bytes {
                bytes.push((lcg(seed) & 0xFF) as u8);
            }
        }
        bytes
    }

    #[test]
    fn matmuls_run_together_write_what_each_writes_alone() {
        let mut seed = 11;
        let (rows_in, cols) = (5, 96);
        let x: Vec<f32> = (0..rows_in * cols)
            .map(|_| (lcg(&mut seed) % 2000) as f32 / 1000.0 - 1.0)
            .collect();
        let quant = |format, rows, seed: &mut u64| {
            let bytes = random_gguf(format, rows, cols, seed);
            Matrix::Quant(WeightsQ::from_gguf_bytes(format, rows, cols, &bytes).unwrap())
        };
        let f32s = Matrix::F32 {
            rows: 24,
            cols,
            data: (0..24 * cols).map(|i| (i % 7) as f32 * 0.1).collect(),
        };
        // Same activation kind (one section), then mixed kinds and plain
        // f32 weights (one after another).
        let sets = [
            vec![
                quant(WeightFormat::Q4_1, 40, &mut seed),
                quant(WeightFormat::Q4_1, 17, &mut seed),
                quant(WeightFormat::Q4_1, 33, &mut seed),
            ],
            vec![
                quant(WeightFormat::Q4_0, 40, &mut seed),
                quant(WeightFormat::Q4_1, 17, &mut seed),
                f32s,
            ],
        ];
        for set in &sets {
            let alone: Vec<Vec<f32>> = set
                .iter()
                .map(|m| {
                    let mut scratch = QuantScratch::default();
                    let mut ws = Workspace::new(&x, rows_in, cols, &mut scratch);
                    let mut out = vec![f32::NAN; rows_in * m.rows()];
                    m.matmul(&mut ws, &mut out);
                    out
                })
                .collect();
            let mut outs: Vec<Vec<f32>> = set
                .iter()
                .map(|m| vec![f32::NAN; rows_in * m.rows()])
                .collect();
            let mut scratch = QuantScratch::default();
            let mut ws = Workspace::new(&x, rows_in, cols, &mut scratch);
            let mut jobs: Vec<(&Matrix, &mut [f32])> = set
                .iter()
                .zip(outs.iter_mut())
                .map(|(m, o)| (m, o.as_mut_slice()))
                .collect();
            matmul_all(&mut ws, &mut jobs);
            assert_eq!(outs, alone);
        }
    }

    #[test]
    fn simd_matches_scalar_and_f32_reference() {
        let mut seed = 7;
        for format in [WeightFormat::Q4_0, WeightFormat::Q4_1, WeightFormat::Q8_0] {
            // A second shape crosses a run of scale products (33 blocks),
            // ends on an odd weight row, and has whole and ragged groups
            // of activation rows; the third is the default model's width
            // (18 blocks).
            for (rows_in, (rows, cols)) in [1usize, 3, 4, 9, 13, 16, 27]
                .into_iter()
                .flat_map(|r| [(r, (40, 96)), (r, (41, 1056)), (r, (18, 576))])
            {
                let w = WeightsQ::from_gguf_bytes(
                    format,
                    rows,
                    cols,
                    &random_gguf(format, rows, cols, &mut seed),
                )
                .unwrap();
                let x: Vec<f32> = (0..rows_in * cols)
                    .map(|_| (lcg(&mut seed) % 2000) as f32 / 1000.0 - 1.0)
                    .collect();
                let m = Matrix::Quant(w.clone());
                let mut scratch = QuantScratch::default();
                let mut ws = Workspace::new(&x, rows_in, cols, &mut scratch);
                let mut fast = vec![0f32; rows_in * rows];
                m.matmul(&mut ws, &mut fast);
                // The AVX2 tiles sum in the same order as the path taken above.
                #[cfg(target_arch = "x86_64")]
                if crate::simd_available() {
                    let act = ActivationsQ8::quantize(&x, rows_in, cols);
                    let mut avx2 = vec![0f32; rows_in * rows];
                    unsafe {
                        let out = (OutPtr(avx2.as_mut_ptr()), rows);
                        crate::dot::avx2::weight_rows_dots_with(&w, 0..rows, &act, out, false)
                    };
                    assert_eq!(
                        avx2, fast,
                        "{format:?} AVX2 tiles differ from the dispatched path"
                    );
                }
                let act = ActivationsQ8::quantize(&x, rows_in, cols);
                let mut slow = vec![0f32; rows_in * rows];
                for j in 0..rows {
                    unsafe { weight_row_dots_scalar(&w, j, &act, OutPtr(slow.as_mut_ptr()), rows) };
                }
                // Dequantized f32 reference: only activation rounding differs.
                let mut row = vec![0f32; cols];
                for j in 0..rows {
                    w.dequantize_row(j, &mut row);
                    for r in 0..rows_in {
                        let xr = &x[r * cols..(r + 1) * cols];
                        let exact = dot_f32(&row, xr);
                        // Activation rounding moves each product by at most half a quant step.
                        let bound: f32 = row
                            .chunks(32)
                            .zip(xr.chunks(32))
                            .map(|(wb, xb)| {
                                let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
                                wb.iter().map(|v| v.abs()).sum::<f32>() * amax / 254.0
                            })
                            .sum::<f32>()
                            * 1.01
                            + 1e-4;
                        let (f, s) = (fast[r * rows + j], slow[r * rows + j]);
                        assert!(
                            (f - s).abs() <= 1e-4 * (1.0 + s.abs()),
                            "{format:?} simd {f} scalar {s}"
                        );
                        assert!(
                            (s - exact).abs() <= bound,
                            "{format:?} scalar {s} exact {exact} bound {bound}"
                        );
                    }
                }
            }
        }
    }
}
