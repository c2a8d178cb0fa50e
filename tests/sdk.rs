//! The platform through the official client SDKs from PyPI, as users call
//! it: `tests/sdk/openai_client.py` runs the `openai` package against a
//! real `bulkhead up` (JSON schema and JSON mode, logprobs, `n`, streaming
//! with usage, rate-limit headers, the context-length error's wording,
//! refusals by name, the models list), and `tests/sdk/litellm_client.py`
//! runs LiteLLM (its context-window error class, refusals, an answer).
//!
//! The SDK is installed into a virtual environment under `target/`; where
//! PyPI cannot be reached the test says so and passes, except in CI
//! (`CI=true`), where it fails.

mod support;

use std::process::Command;
use support::python;

/// The pinned SDK: a major version users run today.
const OPENAI: &str = "openai>=1.50,<3";

/// Runs `script` (in `tests/sdk/`) with `python` against a fresh `bulkhead
/// up`; returns what it printed.
fn against_up(python: &std::path::Path, script: &str, env: &[(&str, &str)]) -> serde_json::Value {
    let dir = support::platform::data_dir("sdk");
    let up = support::platform::up(&dir, &["--prober-interval-secs", "3600"]);
    let creds = support::platform::credentials(&dir);
    let gw = creds["gateway_url"].as_str().expect("gateway_url");
    // The second account's budget is spent: nothing at all a day.
    let admin =
        support::platform::operator_token(dir.to_str().expect("UTF-8 path"), "sdk-admin", "admin");
    let spent = &creds["accounts"][1];
    support::platform::succeeds(
        support::platform::bulkhead(&["budget", spent["id"].as_str().expect("id")])
            .args(["--daily", "0", "--reason", "sdk test"])
            .env(
                "BULKHEAD_CONTROL_PLANE_URL",
                creds["control_plane_url"].as_str().expect("control plane"),
            )
            .env("BULKHEAD_TOKEN", &admin),
    );
    let mut cmd = Command::new(python);
    cmd.arg(python::script("sdk", script))
        .env("BULKHEAD_BASE_URL", format!("{gw}/v1"))
        .env(
            "BULKHEAD_TOKEN",
            creds["accounts"][0]["token"].as_str().expect("a token"),
        )
        .env("BULKHEAD_MODEL", creds["model"].as_str().expect("model"))
        .env(
            "BULKHEAD_SPENT_TOKEN",
            spent["token"].as_str().expect("a token"),
        )
        .envs(env.iter().copied());
    let seen = python::run_json(cmd, script);
    drop(up);
    let _ = std::fs::remove_dir_all(&dir);
    seen
}

#[test]
fn the_openai_python_sdk_gets_what_it_asks_for() {
    let Some(python) = python::venv("sdk-venv", &[OPENAI]) else {
        return;
    };
    let seen = against_up(&python, "openai_client.py", &[]);
    assert_eq!(seen["n"], 3);
    assert_eq!(seen["over_budget_attempts"], 1, "not retried: {seen}");
    assert!(seen["json_schema"]["age"].is_i64(), "{seen}");
}

/// LiteLLM, pinned to the major version users run.
const LITELLM: &str = "litellm>=1.50,<2";

#[test]
fn litellm_recognises_the_context_window_error_and_refusals() {
    let Some(python) = python::venv("litellm-venv", &[LITELLM]) else {
        return;
    };
    // LiteLLM must not reach for its model price list online.
    let seen = against_up(
        &python,
        "litellm_client.py",
        &[("LITELLM_LOCAL_MODEL_COST_MAP", "True")],
    );
    assert_eq!(seen["context_window_error"], "ContextWindowExceededError");
    assert_eq!(seen["tools_refused"], true);
}
