//! The kernels: CUDA C files under `kernels/` (each compiled with
//! `prelude.cuh` in front of it), the functions each defines, and their
//! compilation to PTX with NVRTC for one architecture, with every warning
//! an error (NVRTC's log is read after every compilation), cached per
//! architecture and source digest.

use crate::GpuError;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// One kernel file and the functions it defines.
#[derive(Debug, Clone, Copy)]
pub struct KernelFile {
    /// Its name under `kernels/`.
    pub name: &'static str,
    /// Its source.
    pub source: &'static str,
    /// The `extern "C"` kernels it defines.
    pub functions: &'static [&'static str],
}

const PRELUDE: &str = include_str!("../kernels/prelude.cuh");

/// Every kernel file.
pub const FILES: [KernelFile; 3] = [
    KernelFile {
        name: "attention.cu",
        source: include_str!("../kernels/attention.cu"),
        functions: &["paged_attention_decode", "paged_kv_write", "scrub_pages"],
    },
    KernelFile {
        name: "layers.cu",
        source: include_str!("../kernels/layers.cu"),
        functions: &["rms_norm", "rope", "silu_mul", "add_in_place"],
    },
    KernelFile {
        name: "matvec.cu",
        source: include_str!("../kernels/matvec.cu"),
        functions: &["matvec_q4_0", "matvec_q4_1", "matvec_q8_0", "matvec_f32"],
    },
];

/// The architectures the README names: the H100 and H200 (`compute_90`).
pub const ARCHITECTURES: [&str; 1] = ["compute_90"];

impl KernelFile {
    /// What NVRTC compiles: the prelude, then the file.
    pub fn full_source(&self) -> String {
        format!("{PRELUDE}\n#line 1 \"{}\"\n{}", self.name, self.source)
    }

    /// A digest of what is compiled, naming the cached PTX.
    pub fn digest(&self) -> String {
        hex::encode(Sha256::digest(self.full_source().as_bytes()))[..16].to_owned()
    }
}

/// One file's PTX.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The file.
    pub file: &'static str,
    /// The architecture.
    pub arch: String,
    /// The PTX text.
    pub ptx: String,
}

/// NVRTC's program API: compile, then read the log whether or not it
/// failed (the safe wrapper gives no log on success, where the warnings
/// are).
#[cfg(feature = "cuda")]
mod nvrtc {
    use super::KernelFile;
    use cudarc::nvrtc::result;
    use std::ffi::CString;

    fn text(chars: &[std::ffi::c_char]) -> String {
        let bytes: Vec<u8> = chars
            .iter()
            .map(|c| c.to_ne_bytes()[0])
            .take_while(|b| *b != 0)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// `file` compiled for `arch`: its PTX and NVRTC's log, or the log of
    /// its failure.
    pub(super) fn compile(file: &KernelFile, arch: &str) -> Result<(String, String), String> {
        let src = CString::new(file.full_source()).map_err(|e| e.to_string())?;
        let name = CString::new(file.name).map_err(|e| e.to_string())?;
        let prog = result::create_program(&src, Some(&name)).map_err(|e| e.to_string())?;
        let options = [
            format!("--gpu-architecture={arch}"),
            "--std=c++17".to_owned(),
        ];
        // SAFETY: `prog` was just created and is destroyed once, below;
        // `src` and `name` outlive it.
        #[allow(unsafe_code)]
        let out = unsafe {
            let compiled = result::compile_program(prog, &options);
            let log = result::get_program_log(prog)
                .map(|l| text(&l))
                .unwrap_or_default();
            let ptx = match compiled {
                Ok(()) => result::get_ptx(prog)
                    .map(|p| text(&p))
                    .map_err(|e| e.to_string()),
                Err(e) => Err(format!("{e}: {log}")),
            };
            let _ = result::destroy_program(prog);
            ptx.map(|p| (p, log))
        };
        out
    }
}

/// Whether NVRTC loads on this machine.
pub fn nvrtc_present() -> bool {
    #[cfg(feature = "cuda")]
    {
        // SAFETY: only tries to load the library by its candidate names.
        #[allow(unsafe_code)]
        unsafe {
            cudarc::nvrtc::sys::is_culib_present()
        }
    }
    #[cfg(not(feature = "cuda"))]
    false
}

/// Every file compiled for `arch` (e.g. `compute_90`); a warning fails it
/// like an error.
pub fn compile_all(arch: &str) -> Result<Vec<Compiled>, GpuError> {
    FILES.iter().map(|f| compile(f, arch)).collect()
}

/// `file` compiled for `arch`.
pub fn compile(file: &KernelFile, arch: &str) -> Result<Compiled, GpuError> {
    #[cfg(feature = "cuda")]
    {
        if !nvrtc_present() {
            return Err(GpuError::NoNvrtc);
        }
        let fail = |log: String| GpuError::Compile {
            file: file.name,
            arch: arch.to_owned(),
            log,
        };
        let (ptx, log) = std::panic::catch_unwind(|| nvrtc::compile(file, arch))
            .map_err(|_| fail("NVRTC failed".to_owned()))?
            .map_err(fail)?;
        // NVRTC has no option that makes warnings errors: its log after a
        // successful compilation holds them.
        if log.contains("warning") {
            return Err(fail(log));
        }
        Ok(Compiled {
            file: file.name,
            arch: arch.to_owned(),
            ptx,
        })
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (file, arch);
        Err(GpuError::NotBuilt)
    }
}

/// `file`'s PTX for `arch` from `cache` (under `ARCH/NAME-DIGEST.ptx`),
/// compiled and stored there when missing.
pub fn cached(file: &KernelFile, arch: &str, cache: &Path) -> Result<Compiled, GpuError> {
    let path: PathBuf = cache
        .join(arch)
        .join(format!("{}-{}.ptx", file.name, file.digest()));
    if let Ok(ptx) = std::fs::read_to_string(&path) {
        return Ok(Compiled {
            file: file.name,
            arch: arch.to_owned(),
            ptx,
        });
    }
    let compiled = compile(file, arch)?;
    let io = |source| GpuError::Cache {
        path: path.clone(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    // Written aside and renamed: a reader never sees half a file.
    let part = path.with_extension(format!("ptx.{}.part", std::process::id()));
    std::fs::write(&part, &compiled.ptx).map_err(io)?;
    std::fs::rename(&part, &path).map_err(io)?;
    Ok(compiled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_function_is_defined_in_its_file() {
        for f in FILES {
            for name in f.functions {
                let decl = format!("__global__ void {name}(");
                assert!(f.source.contains(&decl), "{}: no {name}", f.name);
            }
            assert_eq!(
                f.source.matches("__global__").count(),
                f.functions.len(),
                "{}: a kernel is not listed",
                f.name
            );
        }
    }

    #[test]
    fn the_owner_check_comes_before_the_page_is_read() {
        let att = FILES[0].source;
        let check = att
            .find("tag_tenant[page] == want_tenant[seq]")
            .expect("the check");
        let read = att.find("h2f(k[").expect("the first read");
        assert!(check < read);
    }
}
