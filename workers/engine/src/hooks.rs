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
//! model checker's mutant (`Ledger::plant_mutant_commit_with_missing_frame`).
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
