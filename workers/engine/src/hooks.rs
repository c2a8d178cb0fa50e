//! Test- and bench-only switches, compiled only with the `test-hooks`
//! feature. The serving build (`cargo build`, `cargo run -- up`) does not
//! enable it; `cargo test` does, through dev-dependencies. Code that must
//! compile either way (the `bulkhead` binary) asks [`ENABLED`] or gets a
//! [`HooksDisabled`] error.

/// Whether this build has the test hooks.
pub const ENABLED: bool = cfg!(feature = "test-hooks");

/// A test- or bench-only switch was asked for in a build without them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0} exists only in test and benchmark builds (the test-hooks feature: `cargo run --release --features test-hooks -- ...`), not in this serving build"
)]
pub struct HooksDisabled(pub &'static str);
