//! Test- and bench-only switches, compiled only with the `test-hooks`
//! feature. The serving build (`cargo build`, `cargo run -- up`) does not
//! enable it; `cargo test` does, through dev-dependencies. Code that must
//! compile either way (the `bulkhead` binary) asks [`ENABLED`] or gets a
//! [`HooksDisabled`] error.
//!
//! The hooks, across the worker crates: owner checks off
//! (`OwnerChecks::OffForBenchmark`, through `EngineCore::set_pool_options`, so
//! `bench engine` can measure what the checks cost), `EngineCore::pool`,
//! `EngineCore::pages_of`, page-table fault injection
//! (`PageTable::redirect_for_fault_injection`), the committed-page recorder
//! (`Engine::take_committed_for_test`), wrong answers after a count
//! (`--corrupt-answers-after`, the prober's test), a prefill worker's link
//! faults (`PrefillOptions::sabotage` with a `LinkFault`: `SlowTransport` for
//! `--page-delay-ms`, `ChaosTransport` for `--frame-faults-percent`) and the
//! model checker's mutant (`Ledger::plant_mutant_commit_with_missing_frame`),
//! and the kernels' width cap ([`cap_simd`], `bench engine --simd avx2`).
//! `.ci/run` checks that the serving build refuses `--page-delay-ms` with this
//! module's sentence.

/// Whether this build has the test hooks.
pub const ENABLED: bool = cfg!(feature = "test-hooks");

/// A test- or bench-only switch was asked for in a build without them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0} exists only in test and benchmark builds (the test-hooks feature: `cargo run --release --features test-hooks -- ...`), not in this serving build"
)]
pub struct HooksDisabled(pub &'static str);

/// Runs every kernel at `level` or narrower from now on, whatever the CPU
/// has (so an AVX-512 machine measures and tests the AVX2 path). Every
/// width gives the same numbers.
///
/// # Errors
/// [`HooksDisabled`] in a serving build.
pub fn cap_simd(level: bulkhead_kernels::SimdLevel) -> Result<(), HooksDisabled> {
    #[cfg(feature = "test-hooks")]
    {
        bulkhead_kernels::cap_simd_level(level);
        Ok(())
    }
    #[cfg(not(feature = "test-hooks"))]
    {
        let _ = level;
        Err(HooksDisabled("capping the kernels' SIMD width"))
    }
}
