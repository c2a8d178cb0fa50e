//! Bulkhead's CUDA path, behind the `cuda` feature: finding a device
//! without ever panicking where there is none ([`open`]); the kernels,
//! CUDA C kept in `kernels/` and compiled to PTX with NVRTC at start
//! ([`kernels`]), cached per architecture; the device KV pool's tags
//! ([`pool`]); and the model's forward pass on the device ([`GpuEngine`]).
//!
//! The kernels keep the CPU pool's rules on the device: every physical
//! page carries its owner tag (tenant, request, generation), and the
//! attention and KV-write kernels compare it with the sequence's
//! page-table entry once per page, before any byte of the page is read or
//! written; a mismatch fails that sequence (its error word), not the
//! process.
//!
//! A build without the feature compiles no CUDA at all and answers every
//! request for a device with [`GpuError::NotBuilt`]. With it, the driver
//! and NVRTC are loaded at run time (cudarc's dynamic loading): the build
//! needs no CUDA, and a machine without a driver gets
//! [`GpuError::NoDriver`], one sentence.

pub mod check;
mod device;
pub mod engine;
pub mod kernels;
pub mod pool;

pub use device::{DeviceInfo, open};
pub use engine::{Generated, GpuEngine};

/// Which compute a worker runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceKind {
    /// The CPU engine.
    #[default]
    Cpu,
    /// CUDA device `n`.
    Cuda(u32),
}

impl std::str::FromStr for DeviceKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cpu" => Ok(DeviceKind::Cpu),
            "cuda" => Ok(DeviceKind::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceKind::Cuda)
                .ok_or_else(|| format!("{s}: a device is cpu, cuda or cuda:N")),
        }
    }
}

/// Why no GPU could be used.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// This binary was built without CUDA.
    #[error("this build has no CUDA support: build it with `--features cuda`")]
    NotBuilt,
    /// No CUDA driver library on this machine.
    #[error(
        "no CUDA driver (libcuda.so.1) was found on this machine: --device cuda needs an NVIDIA GPU and its driver"
    )]
    NoDriver,
    /// The driver is there, but refused (no device, too old, ...).
    #[error("the CUDA driver could not open device {device}: {message}")]
    Driver {
        /// The device asked for.
        device: u32,
        /// What the driver said.
        message: String,
    },
    /// No NVRTC library to compile the kernels with.
    #[error(
        "NVRTC (libnvrtc.so.12) was not found: install the CUDA toolkit, or `pip install nvidia-cuda-nvrtc-cu12` and put its `nvidia/cuda_nvrtc/lib` directory in LD_LIBRARY_PATH"
    )]
    NoNvrtc,
    /// A kernel file did not compile (or compiled with warnings).
    #[error("kernel file {file} does not compile for {arch}: {log}")]
    Compile {
        /// The file under `kernels/`.
        file: &'static str,
        /// The architecture asked for.
        arch: String,
        /// NVRTC's log.
        log: String,
    },
    /// The device was found, but the serving workers run on the CPU (the
    /// CUDA engine runs `generate` and `gpu-check`).
    #[error(
        "found {name} (compute capability {major}.{minor}), but the serving workers run on the CPU in this build (the CUDA engine runs `bulkhead generate --device cuda` and `bulkhead gpu-check`): serve with --device cpu"
    )]
    NoEngine {
        /// The device's name.
        name: String,
        /// Compute capability.
        major: i32,
        /// Compute capability.
        minor: i32,
    },
    /// A kernel refused a page of a sequence: the page carries another
    /// owner's tag (or another allocation's generation). The request
    /// fails; the engine goes on.
    #[error(
        "the GPU refused page-table entry {entry} of sequence {sequence}: its page is tagged for another owner"
    )]
    OwnerRefused {
        /// The sequence, by its place in the call.
        sequence: usize,
        /// Its page-table entry that was refused.
        entry: u32,
    },
    /// The GPU KV pool had too few free pages.
    #[error(transparent)]
    Pool(#[from] pool::PoolFull),
    /// The model or the request does not fit the CUDA engine.
    #[error("{0}")]
    Model(String),
    /// The PTX cache could not be read or written.
    #[error("PTX cache {path}: {source}")]
    Cache {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_and_others_are_refused() {
        assert_eq!("cpu".parse(), Ok(DeviceKind::Cpu));
        assert_eq!("cuda".parse(), Ok(DeviceKind::Cuda(0)));
        assert_eq!("cuda:3".parse(), Ok(DeviceKind::Cuda(3)));
        for bad in ["gpu", "cuda:", "cuda:x", "CUDA", ""] {
            assert!(bad.parse::<DeviceKind>().is_err(), "{bad}");
        }
    }
}
