//! Every kernel compiles to PTX with NVRTC for every architecture the
//! README names, warnings refused, and each defines the functions listed
//! for it. NVRTC runs without a GPU (`pip install nvidia-cuda-nvrtc-cu12`,
//! its `nvidia/cuda_nvrtc/lib` in `LD_LIBRARY_PATH`; `.ci/run` does this).
//! Where it is missing the tests say so and pass, except in CI
//! (`CI=true`), where they fail.

#![cfg(feature = "cuda")]
// Tests read CI from the environment.
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)]

use bulkhead_gpu::GpuError;
use bulkhead_gpu::kernels::{
    ARCHITECTURES, FILES, KernelFile, compile, compile_all, nvrtc_present,
};

fn nvrtc() -> bool {
    if nvrtc_present() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{}",
        GpuError::NoNvrtc
    );
    eprintln!("skipped: {}", GpuError::NoNvrtc);
    false
}

#[test]
fn every_kernel_compiles_for_every_named_architecture() {
    if !nvrtc() {
        return;
    }
    for arch in ARCHITECTURES {
        let compiled = compile_all(arch).unwrap_or_else(|e| panic!("{e}"));
        for (c, f) in compiled.iter().zip(FILES) {
            assert!(
                c.ptx.contains(".target sm_90"),
                "{}: {}",
                f.name,
                &c.ptx[..200]
            );
            for name in f.functions {
                assert!(
                    c.ptx.contains(&format!(".entry {name}(")),
                    "{}: no entry {name} in the PTX",
                    f.name
                );
            }
        }
    }
}

#[test]
fn a_warning_fails_the_compilation_and_the_log_says_why() {
    if !nvrtc() {
        return;
    }
    let warned = KernelFile {
        name: "warned.cu",
        source: "extern \"C\" __global__ void k(float* x) { int unused = 3; x[0] = 1.0f; }\n",
        functions: &["k"],
    };
    match compile(&warned, ARCHITECTURES[0]) {
        Err(GpuError::Compile { log, .. }) => assert!(log.contains("unused"), "{log}"),
        other => panic!("a kernel with a warning compiled: {other:?}"),
    }
    let broken = KernelFile {
        name: "broken.cu",
        source: "extern \"C\" __global__ void k(float* x) { x[0] = y; }\n",
        functions: &["k"],
    };
    assert!(matches!(
        compile(&broken, ARCHITECTURES[0]),
        Err(GpuError::Compile { .. })
    ));
}

#[test]
fn compiled_ptx_is_cached_per_architecture_and_source() {
    if !nvrtc() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("bulkhead-ptx-{}", std::process::id()));
    let file = &FILES[1];
    let first = bulkhead_gpu::kernels::cached(file, ARCHITECTURES[0], &dir).expect("compiled");
    let path = dir
        .join(ARCHITECTURES[0])
        .join(format!("{}-{}.ptx", file.name, file.digest()));
    assert_eq!(std::fs::read_to_string(&path).expect("cached"), first.ptx);
    // Read back, not compiled again: a planted marker comes back.
    std::fs::write(&path, "// planted\n").expect("write");
    let again = bulkhead_gpu::kernels::cached(file, ARCHITECTURES[0], &dir).expect("read");
    assert_eq!(again.ptx, "// planted\n");
    let _ = std::fs::remove_dir_all(&dir);
}
