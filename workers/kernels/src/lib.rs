//! CPU compute kernels for Bulkhead workers.
//!
//! This crate knows nothing about models, tenants, KV pages, tokio or files: it
//! multiplies quantized weight matrices by activation rows and does the small
//! f32 vector operations a transformer layer needs. Weight formats follow GGUF
//! block layouts (`Q4_0`, `Q4_1`, `Q8_0`) converted at load time to a
//! struct-of-arrays form that SIMD code reads without unaligned scale loads.
//!
//! Activations are quantized the way ggml quantizes them (`Q8_1` for `Q4_1`
//! weights, `Q8_0` for `Q4_0` and `Q8_0` weights, round-half-even), so the same
//! model file gives the same greedy tokens as llama.cpp.
//!
//! Modules: [`quant`] (weight and activation formats; `pairs` packs
//! activation rows for the 512-bit tiles), [`matmul`] (the
//! parallel quantized matmul), [`attention`] (blocked paged attention in
//! llama.cpp's summation orders), [`ops`] (norms, SwiGLU, softmax, RoPE, rounding).
//!
//! Every kernel has a portable scalar version; x86-64 machines with AVX2, FMA
//! and F16C, or AVX-512 with VNNI, get hand-written SIMD versions chosen once
//! at run time. All versions sum in the same order, so they agree bit for bit.
//! Test builds (feature `test-hooks`) can cap the width at run time
//! ([`cap_simd_level`]) so an AVX-512 machine runs the AVX2 kernels too.
//!
//! This crate allows `unsafe` for the SIMD intrinsics and the disjoint-column
//! output pointer of the parallel matmul; every `unsafe fn` states its contract
//! under `# Safety`. Every SIMD kernel has a scalar twin that tests compare it
//! with.
#![allow(unsafe_code)]
// Index loops mirror the register layouts of the SIMD kernels.
#![allow(clippy::needless_range_loop)]

pub mod attention;
mod block;
mod cpu;
mod dot;
pub mod matmul;
pub mod ops;
mod pairs;
pub mod quant;
mod sum_order;

#[cfg(feature = "test-hooks")]
pub use cpu::cap_simd_level;
pub use cpu::{SimdLevel, simd_available, simd_level};
pub use matmul::{Matrix, QuantScratch, Workspace, matmul_all};
pub use quant::{ActivationKind, ActivationsQ8, FormatError, WeightFormat, WeightsQ};
