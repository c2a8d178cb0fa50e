//! The device check `bulkhead gpu-check` runs on a GPU machine: every
//! kernel compiled for the device's own architecture and loaded; paged
//! attention against a CPU reference, with a page whose owner tag is wrong
//! refused inside the kernel (its sequence's error word set, its output
//! untouched) while the other sequence is answered; the Q4_1 matvec
//! against a CPU reference; and the host-device copy rates.

// The reference and its data are used by the CUDA check alone.
#![cfg_attr(not(feature = "cuda"), allow(dead_code))]

use crate::GpuError;

/// What the check measured.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckReport {
    /// The device.
    pub device: crate::DeviceInfo,
    /// The architecture the kernels were compiled for.
    pub arch: String,
    /// Largest difference of paged attention from the CPU reference.
    pub attention_max_error: f32,
    /// The error word of the sequence whose second page was wrongly
    /// tagged (2: its entry 1 refused).
    pub refused_entry_word: u32,
    /// Whether that sequence's output stayed untouched.
    pub refused_output_untouched: bool,
    /// The error word of the sequence whose pages were its own (0: it
    /// was answered).
    pub answered_word: u32,
    /// Largest relative difference of the Q4_1 matvec from the reference.
    pub q4_1_max_rel_error: f32,
    /// Host to device, GB/s.
    pub htod_gb_s: f64,
    /// Device to host, GB/s.
    pub dtoh_gb_s: f64,
}

/// Runs the check on device `ordinal`, its kernels' PTX cached under
/// `cache`.
pub fn run(ordinal: u32, cache: &std::path::Path) -> Result<CheckReport, GpuError> {
    #[cfg(feature = "cuda")]
    {
        cuda::run(ordinal, cache)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (ordinal, cache);
        Err(GpuError::NotBuilt)
    }
}

/// A small deterministic generator for test data.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// The attention case: one layer, 2 query heads over 1 KV head of 64,
/// 4-token pages, a pool of 4 pages.
mod case {
    pub(super) const HEADS: usize = 2;
    pub(super) const KV_HEADS: usize = 1;
    pub(super) const DIM: usize = 64;
    pub(super) const PAGE: usize = 4;
    pub(super) const PAGES: usize = 4;
    pub(super) const MAX_PAGES: usize = 2;
    /// Sequence 0 reads pages 1 and 2 (7 tokens); sequence 1 pages 3 and
    /// 0 (6 tokens), page 0 belonging to another tenant.
    pub(super) const TABLE: [u32; 4] = [1, 2, 3, 0];
    pub(super) const CONTEXT: [u32; 2] = [7, 6];
    pub(super) const TENANTS: [u64; PAGES] = [99, 7, 7, 8];
    pub(super) const OWNER: [u64; 2] = [7, 8];
}

/// Softmax attention of `q` (one head) over `n` tokens of `k` and `v`.
fn attend(q: &[f32], k: &[f32], v: &[f32], n: usize, dim: usize) -> Vec<f32> {
    let scale = 1.0 / (dim as f32).sqrt();
    let scores: Vec<f32> = (0..n)
        .map(|t| (0..dim).map(|d| q[d] * k[t * dim + d]).sum::<f32>() * scale)
        .collect();
    let max = scores.iter().copied().fold(f32::MIN, f32::max);
    let w: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
    let total: f32 = w.iter().sum();
    (0..dim)
        .map(|d| (0..n).map(|t| w[t] * v[t * dim + d]).sum::<f32>() / total)
        .collect()
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::{CheckReport, Lcg, attend, case::*};
    use crate::GpuError;
    use crate::kernels::{FILES, cached};
    use cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
    use half::f16;
    use std::time::Instant;

    fn driver(e: impl std::fmt::Display, ordinal: u32) -> GpuError {
        GpuError::Driver {
            device: ordinal,
            message: e.to_string(),
        }
    }

    pub(super) fn run(ordinal: u32, cache: &std::path::Path) -> Result<CheckReport, GpuError> {
        let device = crate::open(ordinal)?;
        let arch = format!("compute_{}{}", device.major, device.minor);
        let err = |e: cudarc::driver::DriverError| driver(e, ordinal);
        let ctx = CudaContext::new(ordinal as usize).map_err(err)?;
        let stream = ctx.default_stream();
        let mut modules = Vec::new();
        for f in &FILES {
            let ptx = cached(f, &arch, cache)?;
            let m = ctx
                .load_module(cudarc::nvrtc::Ptx::from_src(ptx.ptx))
                .map_err(err)?;
            modules.push(m);
        }

        // Paged attention.
        let mut rng = Lcg(7);
        let slots = PAGES * 2 * KV_HEADS * PAGE * DIM;
        let kv_host: Vec<f32> = (0..slots).map(|_| rng.next()).collect();
        let kv_f16: Vec<u16> = kv_host
            .iter()
            .map(|x| f16::from_f32(*x).to_bits())
            .collect();
        let kv_round: Vec<f32> = kv_f16.iter().map(|b| f16::from_bits(*b).to_f32()).collect();
        let q_host: Vec<f32> = (0..2 * HEADS * DIM).map(|_| rng.next()).collect();
        let kv = stream.clone_htod(&kv_f16).map_err(err)?;
        let q = stream.clone_htod(&q_host).map_err(err)?;
        let mut out = stream.alloc_zeros::<f32>(2 * HEADS * DIM).map_err(err)?;
        let tag_tenant = stream.clone_htod(&TENANTS).map_err(err)?;
        let tag_request = stream.clone_htod(&[1u64; PAGES]).map_err(err)?;
        let tag_generation = stream.clone_htod(&[3u64; PAGES]).map_err(err)?;
        let table = stream.clone_htod(&TABLE).map_err(err)?;
        let want_gen = stream.clone_htod(&[3u64; 4]).map_err(err)?;
        let want_tenant = stream.clone_htod(&OWNER).map_err(err)?;
        let want_request = stream.clone_htod(&[1u64; 2]).map_err(err)?;
        let context = stream.clone_htod(&CONTEXT).map_err(err)?;
        let mut error = stream.alloc_zeros::<u32>(2).map_err(err)?;
        let f = modules[0]
            .load_function("paged_attention_decode")
            .map_err(err)?;
        let (seqs, heads, kv_heads, dim) = (2u32, HEADS as u32, KV_HEADS as u32, DIM as u32);
        let (layer, layers, page, max_pages) = (0u32, 1u32, PAGE as u32, MAX_PAGES as u32);
        let scale = 1.0f32 / (DIM as f32).sqrt();
        let mut b = stream.launch_builder(&f);
        b.arg(&mut out).arg(&q).arg(&kv);
        b.arg(&tag_tenant).arg(&tag_request).arg(&tag_generation);
        b.arg(&table)
            .arg(&want_gen)
            .arg(&want_tenant)
            .arg(&want_request);
        b.arg(&context).arg(&mut error);
        b.arg(&seqs).arg(&heads).arg(&kv_heads).arg(&dim);
        b.arg(&layer)
            .arg(&layers)
            .arg(&page)
            .arg(&max_pages)
            .arg(&scale);
        let warps = seqs * heads;
        let cfg = LaunchConfig {
            grid_dim: (warps.div_ceil(4), 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments are the kernel's, in its order, each
        // buffer as long as the kernel reads or writes with these sizes.
        #[allow(unsafe_code)]
        unsafe { b.launch(cfg) }.map_err(err)?;
        let got = stream.clone_dtoh(&out).map_err(err)?;
        let words = stream.clone_dtoh(&error).map_err(err)?;
        // The reference for sequence 0: its 7 tokens from pages 1 and 2.
        let side = KV_HEADS * PAGE * DIM;
        let page_elems = 2 * side;
        let gather = |which: usize| -> Vec<f32> {
            [1usize, 2]
                .iter()
                .flat_map(|p| kv_round[p * page_elems + which * side..][..PAGE * DIM].to_vec())
                .collect()
        };
        let (k0, v0) = (gather(0), gather(1));
        let mut worst = 0.0f32;
        for h in 0..HEADS {
            let want = attend(&q_host[h * DIM..][..DIM], &k0, &v0, 7, DIM);
            for d in 0..DIM {
                worst = worst.max((want[d] - got[h * DIM + d]).abs());
            }
        }
        let untouched = got[HEADS * DIM..].iter().all(|x| *x == 0.0);

        // Q4_1 matvec: 64 rows of 256, two activation rows.
        let (rows, cols, xs) = (64usize, 256usize, 2usize);
        let blocks = cols / 32;
        let mut w = Vec::with_capacity(rows * blocks * 20);
        let mut dense = vec![0.0f32; rows * cols];
        for r in 0..rows {
            for bl in 0..blocks {
                let d = f16::from_f32(0.01 + 0.02 * rng.next().abs());
                let m = f16::from_f32(-0.1 * rng.next().abs());
                w.extend_from_slice(&d.to_bits().to_le_bytes());
                w.extend_from_slice(&m.to_bits().to_le_bytes());
                for j in 0..16 {
                    let byte = (rng.next().abs() * 255.0) as u8;
                    w.push(byte);
                    let at = r * cols + bl * 32;
                    dense[at + j] = d.to_f32() * f32::from(byte & 0xF) + m.to_f32();
                    dense[at + j + 16] = d.to_f32() * f32::from(byte >> 4) + m.to_f32();
                }
            }
        }
        let x_host: Vec<f32> = (0..xs * cols).map(|_| rng.next()).collect();
        let wd = stream.clone_htod(&w).map_err(err)?;
        let xd = stream.clone_htod(&x_host).map_err(err)?;
        let mut yd = stream.alloc_zeros::<f32>(xs * rows).map_err(err)?;
        let f = modules[2].load_function("matvec_q4_1").map_err(err)?;
        let (r32, c32, x32) = (rows as u32, cols as u32, xs as u32);
        let mut b = stream.launch_builder(&f);
        b.arg(&mut yd)
            .arg(&wd)
            .arg(&xd)
            .arg(&r32)
            .arg(&c32)
            .arg(&x32);
        let cfg = LaunchConfig {
            grid_dim: ((r32 * x32).div_ceil(4), 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: as above.
        #[allow(unsafe_code)]
        unsafe { b.launch(cfg) }.map_err(err)?;
        let y = stream.clone_dtoh(&yd).map_err(err)?;
        let mut rel = 0.0f32;
        for xr in 0..xs {
            for r in 0..rows {
                let want: f32 = (0..cols)
                    .map(|c| dense[r * cols + c] * x_host[xr * cols + c])
                    .sum();
                let got = y[xr * rows + r];
                rel = rel.max((want - got).abs() / want.abs().max(1e-3));
            }
        }

        // Copy rates, 256 MiB each way.
        let bytes = vec![1u8; 256 << 20];
        let t = Instant::now();
        let dev = stream.clone_htod(&bytes).map_err(err)?;
        stream.synchronize().map_err(err)?;
        let htod = bytes.len() as f64 / t.elapsed().as_secs_f64() / 1e9;
        let t = Instant::now();
        let back = stream.clone_dtoh(&dev).map_err(err)?;
        let dtoh = back.len() as f64 / t.elapsed().as_secs_f64() / 1e9;

        Ok(CheckReport {
            device,
            arch,
            attention_max_error: worst,
            refused_entry_word: words[1],
            refused_output_untouched: untouched,
            answered_word: words[0],
            q4_1_max_rel_error: rel,
            htod_gb_s: htod,
            dtoh_gb_s: dtoh,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_attention_weights_sum_to_one() {
        // One token: the output is its value.
        let v = [0.5f32, -1.0];
        assert_eq!(attend(&[1.0, 1.0], &[0.3, 0.2], &v, 1, 2), v.to_vec());
    }

    #[test]
    fn without_a_device_the_check_is_an_error_not_a_panic() {
        if let Err(e) = run(0, &std::env::temp_dir().join("bulkhead-ptx-test")) {
            assert!(!e.to_string().contains('\n'));
        }
    }
}
