//! The golden checks of `golden.rs` with every kernel capped at AVX2 (the
//! test-only switch `bulkhead_kernels::cap_simd_level`), so an AVX-512
//! machine proves the AVX2 path gives llama.cpp's tokens too. A binary of
//! its own: the cap holds for the whole process.

mod common;

use bulkhead_kernels::{SimdLevel, cap_simd_level, simd_level};

/// Caps the kernels at AVX2 and checks that they are capped there (where
/// the CPU has AVX2 at all).
fn on_avx2() {
    cap_simd_level(SimdLevel::Avx2);
    if bulkhead_kernels::simd_available() {
        assert_eq!(simd_level(), SimdLevel::Avx2, "the cap took effect");
    }
}

#[test]
fn greedy_output_on_the_avx2_kernels_matches_llama_cpp() {
    on_avx2();
    common::greedy_output_matches_golden();
    assert_eq!(simd_level().min(SimdLevel::Avx2), simd_level());
}

#[test]
fn greedy_output_on_the_avx2_kernels_does_not_depend_on_page_size() {
    on_avx2();
    common::greedy_output_is_the_same_for_page_sizes(&[1, 5, 64]);
}
