//! Virtual environments with packages from PyPI, for tests that check the
//! platform with the tools its users run. Where PyPI (or another tool a
//! test needs) cannot be had the test says so and passes, except in CI
//! (`CI=true`), where it fails.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A virtual environment `name` under the target directory with
/// `packages` installed, made once per target directory.
pub fn venv(name: &str, packages: &[&str]) -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let python = dir.join("bin/python");
    let ready = dir.join(".installed");
    let wanted = packages.join("\n");
    if std::fs::read_to_string(&ready).is_ok_and(|s| s == wanted) {
        return Some(python);
    }
    let ok = |c: &mut Command| c.status().is_ok_and(|s| s.success());
    if !ok(Command::new("python3").args(["-m", "venv"]).arg(&dir)) {
        return unavailable("python3 -m venv failed");
    }
    if !ok(Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(packages))
    {
        return unavailable(&format!("pip could not install {}", packages.join(" ")));
    }
    std::fs::write(&ready, wanted).expect("marker");
    Some(python)
}

/// Says why a test cannot run here; panics in CI.
pub fn unavailable<T>(why: &str) -> Option<T> {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{why}: in CI this test must run"
    );
    eprintln!("skipping: {why}");
    None
}

/// A script of the root crate's `tests/` directory.
pub fn script(dir: &str, name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(dir)
        .join(name)
}

/// Runs `cmd` (a script of the tests' Python) and returns the JSON of the
/// last line it printed; fails the test, with its output, when it fails.
pub fn run_json(mut cmd: Command, what: &str) -> serde_json::Value {
    let out = cmd.output().expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen =
        serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("one JSON line");
    eprintln!("{what} saw: {seen}");
    seen
}
