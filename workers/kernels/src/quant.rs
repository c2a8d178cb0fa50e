//! Quantized weight matrices (struct-of-arrays) and quantized activation rows.
//!
//! GGUF stores `Q4_0`, `Q4_1` and `Q8_0` weights as arrays of 32-element blocks
//! with f16 scales. [`WeightsQ::from_gguf_bytes`] converts them once, at load
//! time, into separate arrays of quants and f32 scales (the f16 to f32
//! conversion is exact, so nothing changes numerically).

pub use crate::block::BLOCK;
use crate::block::sized;
use crate::pairs::{GROUP, Pairs8};
use half::f16;

/// A GGUF block format with a kernel in this crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFormat {
    /// 4-bit, one scale per block: `(q - 8) * d`.
    Q4_0,
    /// 4-bit, scale and minimum per block: `q * d + m`.
    Q4_1,
    /// 8-bit, one scale per block: `q * d`.
    Q8_0,
}

impl WeightFormat {
    /// Bytes one 32-element block takes in a GGUF file.
    pub fn gguf_block_bytes(self) -> usize {
        match self {
            WeightFormat::Q4_0 => 18,
            WeightFormat::Q4_1 => 20,
            WeightFormat::Q8_0 => 34,
        }
    }

    /// Bytes of quants per block in memory.
    fn quant_bytes(self) -> usize {
        match self {
            WeightFormat::Q4_0 | WeightFormat::Q4_1 => 16,
            WeightFormat::Q8_0 => 32,
        }
    }

    /// The activation quantization llama.cpp pairs with this weight format.
    pub fn activation_kind(self) -> ActivationKind {
        match self {
            WeightFormat::Q4_1 => ActivationKind::Q8_1,
            WeightFormat::Q4_0 | WeightFormat::Q8_0 => ActivationKind::Q8_0,
        }
    }
}

/// How activation rows are quantized before a quantized matmul.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActivationKind {
    /// 8-bit quants with an f16-rounded scale.
    Q8_0,
    /// As `Q8_0`, plus the f16-rounded sum `d * Σq` used by formats with a minimum.
    Q8_1,
}

/// Error converting raw GGUF tensor bytes.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// The column count is not a multiple of the block size.
    #[error("{cols} columns is not a multiple of the block size {BLOCK}")]
    Cols { cols: usize },
    /// The byte length does not match rows x cols for the format.
    #[error("expected {expected} bytes for the tensor, found {found}")]
    Length { expected: usize, found: usize },
}

/// A quantized weight matrix of `rows` x `cols`, row-major, blocks along columns.
#[derive(Debug, Clone)]
pub struct WeightsQ {
    format: WeightFormat,
    rows: usize,
    cols: usize,
    /// Per-block scale.
    d: Vec<f32>,
    /// Per-block minimum (`Q4_1` only; empty otherwise).
    m: Vec<f32>,
    /// Packed quants, `format.quant_bytes()` per block.
    qs: Vec<u8>,
}

impl WeightsQ {
    /// Converts a GGUF tensor's raw bytes (`rows` x `cols`, row-major).
    pub fn from_gguf_bytes(
        format: WeightFormat,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<Self, FormatError> {
        if !cols.is_multiple_of(BLOCK) {
            return Err(FormatError::Cols { cols });
        }
        let n_blocks = rows * cols / BLOCK;
        let bb = format.gguf_block_bytes();
        if bytes.len() != n_blocks * bb {
            return Err(FormatError::Length {
                expected: n_blocks * bb,
                found: bytes.len(),
            });
        }
        let qb = format.quant_bytes();
        let mut d = Vec::with_capacity(n_blocks);
        let mut m = Vec::new();
        let mut qs = Vec::with_capacity(n_blocks * qb);
        for block in bytes.chunks_exact(bb) {
            d.push(f16_at(block, 0));
            let quants = match format {
                WeightFormat::Q4_1 => {
                    m.push(f16_at(block, 2));
                    &block[4..]
                }
                WeightFormat::Q4_0 | WeightFormat::Q8_0 => &block[2..],
            };
            qs.extend_from_slice(quants);
        }
        Ok(WeightsQ {
            format,
            rows,
            cols,
            d,
            m,
            qs,
        })
    }

    /// Quantizes every row of `self` (dequantized to f32) to `Q8_0`, as
    /// ggml's reference `quantize_row_q8_0` does: per block, `d = amax / 127`
    /// rounded to f16, `q = round(x / d)`.
    pub fn to_q8_0(&self) -> WeightsQ {
        let nb = self.blocks_per_row();
        let mut d = Vec::with_capacity(self.rows * nb);
        let mut qs = Vec::with_capacity(self.rows * self.cols);
        let mut row = vec![0f32; self.cols];
        for r in 0..self.rows {
            self.dequantize_row(r, &mut row);
            for block in row.chunks_exact(BLOCK) {
                let amax = block.iter().fold(0f32, |a, x| a.max(x.abs()));
                let scale = amax / 127.0;
                let inv = if scale == 0.0 { 0.0 } else { 1.0 / scale };
                d.push(f16::from_f32(scale).to_f32());
                #[allow(clippy::cast_possible_truncation)]
                qs.extend(block.iter().map(|x| (x * inv).round() as i8 as u8));
            }
        }
        WeightsQ {
            format: WeightFormat::Q8_0,
            rows: self.rows,
            cols: self.cols,
            d,
            m: Vec::new(),
            qs,
        }
    }

    /// The block format.
    pub fn format(&self) -> WeightFormat {
        self.format
    }

    /// Number of rows (output features).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns (input features).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Blocks per row.
    pub(crate) fn blocks_per_row(&self) -> usize {
        self.cols / BLOCK
    }

    pub(crate) fn d(&self) -> &[f32] {
        &self.d
    }

    pub(crate) fn m(&self) -> &[f32] {
        &self.m
    }

    pub(crate) fn qs(&self) -> &[u8] {
        &self.qs
    }

    /// The matrix in its GGUF block layout again (each block's f16 scale,
    /// its f16 minimum for `Q4_1`, then its quants), as a device engine
    /// uploads it. Scales came from f16 (or were rounded to it), so the
    /// bytes equal the file's.
    pub fn gguf_bytes(&self) -> Vec<u8> {
        let qb = self.format.quant_bytes();
        let mut out = Vec::with_capacity(self.d.len() * self.format.gguf_block_bytes());
        for (b, quants) in self.qs.chunks_exact(qb).enumerate() {
            out.extend_from_slice(&f16::from_f32(self.d[b]).to_bits().to_le_bytes());
            if self.format == WeightFormat::Q4_1 {
                out.extend_from_slice(&f16::from_f32(self.m[b]).to_bits().to_le_bytes());
            }
            out.extend_from_slice(quants);
        }
        out
    }

    /// Writes row `row`, dequantized, into `out` (`cols` long).
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        let nb = self.blocks_per_row();
        let qb = self.format.quant_bytes();
        for b in 0..nb {
            let blk = row * nb + b;
            let d = self.d[blk];
            let q = &self.qs[blk * qb..(blk + 1) * qb];
            let o = &mut out[b * BLOCK..(b + 1) * BLOCK];
            match self.format {
                WeightFormat::Q4_0 => {
                    for i in 0..16 {
                        o[i] = (f32::from(q[i] & 0xF) - 8.0) * d;
                        o[i + 16] = (f32::from(q[i] >> 4) - 8.0) * d;
                    }
                }
                WeightFormat::Q4_1 => {
                    let m = self.m[blk];
                    for i in 0..16 {
                        o[i] = f32::from(q[i] & 0xF) * d + m;
                        o[i + 16] = f32::from(q[i] >> 4) * d + m;
                    }
                }
                WeightFormat::Q8_0 => {
                    for i in 0..BLOCK {
                        o[i] = f32::from(q[i] as i8) * d;
                    }
                }
            }
        }
    }
}

fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([bytes[at], bytes[at + 1]])).to_f32()
}

/// Rounds through f16 and back, as ggml does when it stores a scale.
fn f16_round(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// Quantizes consecutive 32-element blocks of `x` into `q`, `d`, `s`.
fn quantize_blocks(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd_available() {
        // SAFETY: the CPU supports AVX2, FMA and F16C (checked at run time).
        unsafe { quantize_blocks_avx2(x, q, d, s) };
        return;
    }
    quantize_blocks_body(x, q, d, s);
}

/// [`quantize_blocks`] as ggml's AVX2 `quantize_row_q8_1`: the block's
/// largest magnitude by vector maxima (the same value as the scalar scan:
/// a maximum does not depend on order), quants rounded half to even in
/// eight lanes, their sum in integers (exact in any order).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_blocks_avx2(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    use std::arch::x86_64::*;
    for (((xb, qb), db), sb) in x
        .chunks_exact(BLOCK)
        .zip(q.chunks_exact_mut(BLOCK))
        .zip(d)
        .zip(s)
    {
        // SAFETY: each block is 32 floats in and 32 bytes out.
        unsafe {
            let p = xb.as_ptr();
            let v = [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ];
            let sign = _mm256_set1_ps(-0.0);
            let mut m = _mm256_andnot_ps(sign, v[0]);
            for vk in &v[1..] {
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *vk));
            }
            let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
            let dd = amax / 127.0;
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let mul = _mm256_set1_ps(id);
            let mut iv = [_mm256_setzero_si256(); 4];
            for k in 0..4 {
                let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                    _mm256_mul_ps(v[k], mul),
                );
                iv[k] = _mm256_cvtps_epi32(r);
            }
            let sum8 = _mm256_add_epi32(
                _mm256_add_epi32(iv[0], iv[1]),
                _mm256_add_epi32(iv[2], iv[3]),
            );
            let sum4 = _mm_add_epi32(
                _mm256_castsi256_si128(sum8),
                _mm256_extracti128_si256(sum8, 1),
            );
            let sum2 = _mm_add_epi32(sum4, _mm_shuffle_epi32(sum4, 0b01_00_11_10));
            let sum =
                _mm_cvtsi128_si32(_mm_add_epi32(sum2, _mm_shuffle_epi32(sum2, 0b10_11_00_01)));
            // Packing works within 128-bit lanes; the permutation puts the
            // 32 bytes back in order (as ggml does).
            let i16s = [
                _mm256_packs_epi32(iv[0], iv[1]),
                _mm256_packs_epi32(iv[2], iv[3]),
            ];
            let i8s = _mm256_packs_epi16(i16s[0], i16s[1]);
            let ordered =
                _mm256_permutevar8x32_epi32(i8s, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(qb.as_mut_ptr().cast(), ordered);
            *db = f16_round(dd);
            #[allow(clippy::cast_precision_loss)]
            {
                *sb = f16_round(dd * sum as f32);
            }
        }
    }
}

#[inline(always)]
fn quantize_blocks_body(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    for (((xb, qb), db), sb) in x
        .chunks_exact(BLOCK)
        .zip(q.chunks_exact_mut(BLOCK))
        .zip(d)
        .zip(s)
    {
        let mut amax = 0f32;
        for v in xb {
            let a = v.abs();
            if a > amax {
                amax = a;
            }
        }
        let dd = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (qv, v) in qb.iter_mut().zip(xb) {
            // |v * id| <= 127 by construction of `id`.
            #[allow(clippy::cast_possible_truncation)]
            let qi = (v * id).round_ties_even() as i32;
            sum += qi;
            #[allow(clippy::cast_possible_truncation)]
            {
                *qv = qi as i8;
            }
        }
        *db = f16_round(dd);
        #[allow(clippy::cast_precision_loss)]
        {
            *sb = f16_round(dd * sum as f32);
        }
    }
}

/// Activation rows quantized to 8 bits in 32-element blocks.
#[derive(Debug, Clone, Default)]
pub struct ActivationsQ8 {
    rows: usize,
    blocks_per_row: usize,
    pub(crate) qs: Vec<i8>,
    pub(crate) d: Vec<f32>,
    /// `d * Σq` per block, f16-rounded (meaningful for `Q8_1`).
    pub(crate) s: Vec<f32>,
    /// `s` of each group of four rows, interleaved: `[group][block][row % 4]`.
    pub(crate) s4: Vec<f32>,
    /// Groups of eight rows packed for the 512-bit tiles (empty where
    /// those do not run, or with fewer than eight rows).
    pub(crate) pairs: Pairs8,
}

impl ActivationsQ8 {
    /// Quantizes `rows` rows of `cols` values each.
    ///
    /// Matches ggml's AVX2 `quantize_row_q8_0` / `quantize_row_q8_1`:
    /// `d = amax / 127` stored as f16, quants `round_half_even(x * 127 / amax)`.
    pub fn quantize(x: &[f32], rows: usize, cols: usize) -> Self {
        let mut a = Self::default();
        a.requantize(x, rows, cols);
        a
    }

    /// [`ActivationsQ8::quantize`] into this value's buffers, which keep
    /// their capacity from input to input (no allocation, and no fresh
    /// pages to fault in, once they have grown to a step's size).
    pub fn requantize(&mut self, x: &[f32], rows: usize, cols: usize) {
        debug_assert_eq!(x.len(), rows * cols);
        let nb = cols / BLOCK;
        let total = rows * nb;
        self.rows = rows;
        self.blocks_per_row = nb;
        let (qs, d, s) = (
            sized(&mut self.qs, total * BLOCK),
            sized(&mut self.d, total),
            sized(&mut self.s, total),
        );
        const RUN: usize = 64;
        if total >= 2 * RUN {
            use rayon::prelude::*;
            qs.par_chunks_mut(RUN * BLOCK)
                .zip(x.par_chunks(RUN * BLOCK))
                .zip(d.par_chunks_mut(RUN).zip(s.par_chunks_mut(RUN)))
                .for_each(|((q, x), (d, s))| quantize_blocks(x, q, d, s));
        } else {
            quantize_blocks(x, qs, d, s);
        }
        let s4 = sized(&mut self.s4, (rows / 4) * nb * 4);
        for g in 0..rows / 4 {
            for b in 0..nb {
                for t in 0..4 {
                    s4[(g * nb + b) * 4 + t] = s[(g * 4 + t) * nb + b];
                }
            }
        }
        let groups = if crate::cpu::vnni512() {
            rows / GROUP
        } else {
            0
        };
        self.pairs.pack(qs, d, s, groups, nb);
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    pub(crate) fn blocks_per_row(&self) -> usize {
        self.blocks_per_row
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GGUF bytes of one Q4_1 row of 64 values: scale, minimum, quants.
    fn q4_1_row() -> Vec<u8> {
        let mut bytes = Vec::new();
        for (d, m) in [(0.25f32, -1.0f32), (0.5, -3.0)] {
            bytes.extend_from_slice(&f16::from_f32(d).to_le_bytes());
            bytes.extend_from_slice(&f16::from_f32(m).to_le_bytes());
            bytes.extend((0..16u8).map(|i| i | ((15 - i) << 4)));
        }
        bytes
    }

    #[test]
    fn simd_quantization_matches_the_scalar_one() {
        // Blocks of every kind: all zero, exact halves (ties round to
        // even), one large value, tiny values, mixed signs.
        let mut x = vec![0f32; 32];
        // amax 127 makes the scale 1, so every k + 0.5 is a tie.
        x.extend((0..32).map(|i| if i == 0 { -127.0 } else { i as f32 - 16.5 }));
        x.extend((0..32).map(|i| if i == 7 { -1e4 } else { i as f32 * 0.5 }));
        x.extend((0..32).map(|i| (i as f32 + 1.0) * 1e-30));
        let mut seed = 11u64;
        x.extend((0..32 * 61).map(|_| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            ((seed >> 33) % 20001) as f32 / 1000.0 - 10.0
        }));
        let nb = x.len() / BLOCK;
        let (mut q1, mut d1, mut s1) = (vec![0i8; nb * BLOCK], vec![0f32; nb], vec![0f32; nb]);
        let (mut q2, mut d2, mut s2) = (q1.clone(), d1.clone(), s1.clone());
        quantize_blocks_body(&x, &mut q1, &mut d1, &mut s1);
        quantize_blocks(&x, &mut q2, &mut d2, &mut s2);
        assert_eq!(q1, q2);
        assert_eq!(d1, d2);
        assert_eq!(s1, s2);
        assert!(
            q1[32..64].contains(&-127),
            "the tie block reaches full scale"
        );
    }

    #[test]
    fn gguf_bytes_give_back_the_file_s_blocks() {
        let row = q4_1_row();
        let w = WeightsQ::from_gguf_bytes(WeightFormat::Q4_1, 1, 64, &row).unwrap();
        assert_eq!(w.gguf_bytes(), row);
        let q = w.to_q8_0();
        let again = WeightsQ::from_gguf_bytes(WeightFormat::Q8_0, 1, 64, &q.gguf_bytes()).unwrap();
        assert_eq!(again.gguf_bytes(), q.gguf_bytes());
        assert_eq!(q.gguf_bytes().len(), 2 * 34);
    }

    #[test]
    fn q8_0_conversion_keeps_every_value_within_half_a_step() {
        let w = WeightsQ::from_gguf_bytes(WeightFormat::Q4_1, 1, 64, &q4_1_row()).unwrap();
        let q = w.to_q8_0();
        assert_eq!(q.format(), WeightFormat::Q8_0);
        let (mut a, mut b) = (vec![0f32; 64], vec![0f32; 64]);
        w.dequantize_row(0, &mut a);
        q.dequantize_row(0, &mut b);
        for block in 0..2 {
            let r = block * BLOCK..(block + 1) * BLOCK;
            let amax = a[r.clone()].iter().fold(0f32, |m, x| m.max(x.abs()));
            let step = amax / 127.0;
            for i in r {
                assert!(
                    (a[i] - b[i]).abs() <= step * 0.51 + 1e-3,
                    "{i}: {} became {}",
                    a[i],
                    b[i]
                );
            }
        }
        // Converting Q8_0 again changes nothing.
        let again = q.to_q8_0();
        let mut c = vec![0f32; 64];
        again.dequantize_row(0, &mut c);
        assert_eq!(b, c);
    }
}
