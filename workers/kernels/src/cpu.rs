//! Run-time CPU feature detection, done once per process, and (in test
//! builds only) a cap that makes an AVX-512 machine run the AVX2 kernels.

use std::sync::OnceLock;

/// The widest kernels this process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SimdLevel {
    /// The portable scalar kernels.
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F/BW/VL (and VNNI for the integer dot products where present).
    Avx512,
}

/// Whether the AVX2 + FMA + F16C kernels run on this CPU.
pub fn simd_available() -> bool {
    simd_level() >= SimdLevel::Avx2
}

/// The widest kernels that run here: what the CPU has, capped in test
/// builds by [`cap_simd_level`].
pub fn simd_level() -> SimdLevel {
    static LEVEL: OnceLock<SimdLevel> = OnceLock::new();
    let detected = *LEVEL.get_or_init(detect);
    detected.min(cap::get())
}

/// Whether the 512-bit VNNI matmul tiles run: AVX-512 kernels (not capped
/// narrower) on a CPU with `vpdpbusd`. The activation packing they read
/// is built exactly where this holds.
pub(crate) fn vnni512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static VNNI: OnceLock<bool> = OnceLock::new();
        *VNNI.get_or_init(|| {
            is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl")
        }) && simd_level() == SimdLevel::Avx512
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Runs every kernel chosen from now on at `level` or narrower, whatever
/// the CPU has: tests use it to run the AVX2 path on an AVX-512 machine.
/// Every width sums in the same order, so concurrent callers see the same
/// numbers either way. Absent from serving builds.
#[cfg(feature = "test-hooks")]
pub fn cap_simd_level(level: SimdLevel) {
    cap::set(level);
}

#[cfg(feature = "test-hooks")]
mod cap {
    use super::SimdLevel;
    use std::sync::atomic::{AtomicU8, Ordering};

    static CAP: AtomicU8 = AtomicU8::new(2);

    pub(super) fn get() -> SimdLevel {
        match CAP.load(Ordering::Relaxed) {
            0 => SimdLevel::Scalar,
            1 => SimdLevel::Avx2,
            _ => SimdLevel::Avx512,
        }
    }

    pub(super) fn set(level: SimdLevel) {
        CAP.store(level as u8, Ordering::Relaxed);
    }
}

#[cfg(not(feature = "test-hooks"))]
mod cap {
    use super::SimdLevel;

    #[inline(always)]
    pub(super) fn get() -> SimdLevel {
        SimdLevel::Avx512
    }
}

#[cfg(target_arch = "x86_64")]
fn detect() -> SimdLevel {
    use std::arch::is_x86_feature_detected as has;
    if !(has!("avx2") && has!("fma") && has!("f16c")) {
        SimdLevel::Scalar
    } else if has!("avx512f") && has!("avx512bw") && has!("avx512vl") {
        SimdLevel::Avx512
    } else {
        SimdLevel::Avx2
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> SimdLevel {
    SimdLevel::Scalar
}
