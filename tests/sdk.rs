//! The platform through the official client SDKs from PyPI, as users call
//! it: `tests/sdk/openai_client.py` runs the `openai` package against a
//! real `bulkhead up` (JSON schema and JSON mode, logprobs, `n`, streaming
//! with usage, rate-limit headers, the context-length error's wording,
//! refusals by name, the models list).
//!
//! The SDK is installed into a virtual environment under `target/`; where
//! PyPI cannot be reached the test says so and passes, except in CI
//! (`CI=true`), where it fails.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The pinned SDK: a major version users run today.
const OPENAI: &str = "openai>=1.50,<3";

/// A virtual environment with the SDK, made once per target directory.
fn venv() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("sdk-venv");
    let python = dir.join("bin/python");
    let ready = dir.join(".openai-installed");
    if ready.exists() {
        return Some(python);
    }
    let ok = |c: &mut Command| c.status().is_ok_and(|s| s.success());
    if !ok(Command::new("python3").args(["-m", "venv"]).arg(&dir)) {
        return unavailable("python3 -m venv failed");
    }
    if !ok(Command::new(&python).args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        OPENAI,
    ])) {
        return unavailable("pip could not install the openai SDK");
    }
    std::fs::write(&ready, OPENAI).expect("marker");
    Some(python)
}

fn unavailable(why: &str) -> Option<PathBuf> {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{why}: in CI the SDK tests must run"
    );
    eprintln!("skipping the SDK test: {why}");
    None
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/sdk")
        .join(name)
}

#[test]
fn the_openai_python_sdk_gets_what_it_asks_for() {
    let Some(python) = venv() else { return };
    let dir = support::platform::data_dir("sdk");
    let _up = support::platform::up(&dir, &["--prober-interval-secs", "3600"]);
    let creds = support::platform::credentials(&dir);
    let gw = creds["gateway_url"].as_str().expect("gateway_url");
    let token = creds["accounts"][0]["token"].as_str().expect("a token");
    let model = creds["model"].as_str().expect("model");
    let out = Command::new(&python)
        .arg(script("openai_client.py"))
        .env("BULKHEAD_BASE_URL", format!("{gw}/v1"))
        .env("BULKHEAD_TOKEN", token)
        .env("BULKHEAD_MODEL", model)
        .output()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the SDK script failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: serde_json::Value =
        serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("one JSON line");
    eprintln!("openai SDK saw: {seen}");
    assert_eq!(seen["n"], 3);
    assert!(seen["json_schema"]["age"].is_i64(), "{seen}");
    let _ = std::fs::remove_dir_all(&dir);
}
