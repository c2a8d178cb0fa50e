//! The platform through the official client SDKs from PyPI, as users call
//! it: `tests/sdk/openai_client.py` runs the `openai` package against a
//! real `bulkhead up` (JSON schema and JSON mode, logprobs, `n`, streaming
//! with usage, rate-limit headers, the context-length error's wording,
//! refusals by name, the models list, `stop`), `tests/sdk/litellm_client.py`
//! runs LiteLLM (its context-window error class, refusals, an answer) and
//! `tests/sdk/langchain_client.py` LangChain's `ChatOpenAI` (usage, JSON
//! mode, `stop`, a tool binding refused, the context-length error).
//!
//! The SDK is installed into a virtual environment under `target/`; where
//! PyPI cannot be reached the test says so and passes, except in CI
//! (`CI=true`), where it fails.

mod support;

use std::process::Command;
use support::python;

/// The pinned SDK: a major version users run today.
const OPENAI: &str = "openai>=1.50,<3";

/// Runs each of `scripts` (in `tests/sdk/`) with `python` against one fresh
/// `bulkhead up`; returns what each printed.
fn against_up(
    python: &std::path::Path,
    scripts: &[&str],
    env: &[(&str, &str)],
) -> Vec<serde_json::Value> {
    let dir = support::platform::data_dir("sdk");
    let up = support::platform::up(&dir, &["--prober-interval-secs", "3600"]);
    let creds = support::platform::credentials(&dir);
    let gw = &creds.gateway_url;
    // The second account's budget is spent: nothing at all a day.
    let admin =
        support::platform::operator_token(dir.to_str().expect("UTF-8 path"), "sdk-admin", "admin");
    let spent = &creds.accounts[1];
    support::platform::succeeds(
        support::platform::bulkhead(&["budget", &spent.id])
            .args(["--daily", "0", "--reason", "sdk test"])
            .env("BULKHEAD_CONTROL_PLANE_URL", &creds.control_plane_url)
            .env("BULKHEAD_TOKEN", &admin),
    );
    let token = &creds.accounts[0].token;
    let run = |script: &&str| {
        let mut cmd = Command::new(python);
        cmd.arg(python::script("sdk", script))
            .env("BULKHEAD_BASE_URL", format!("{gw}/v1"))
            .env("BULKHEAD_TOKEN", token)
            .env("BULKHEAD_MODEL", &creds.model)
            .env("BULKHEAD_SPENT_TOKEN", &spent.token)
            .envs(env.iter().copied());
        python::run_json(cmd, script)
    };
    let seen = scripts.iter().map(run).collect();
    drop(up);
    let _ = std::fs::remove_dir_all(&dir);
    seen
}

#[test]
fn the_openai_python_sdk_gets_what_it_asks_for() {
    let Some(python) = python::venv("sdk-venv", &[OPENAI]) else {
        return;
    };
    let seen = against_up(&python, &["openai_client.py"], &[]).remove(0);
    assert_eq!(seen["n"], 3);
    assert_eq!(seen["over_budget_attempts"], 1, "not retried: {seen}");
    assert!(seen["json_schema"]["age"].is_i64(), "{seen}");
}

/// LiteLLM and LangChain's OpenAI integration, pinned to the major
/// versions users run.
const LITELLM: &str = "litellm>=1.50,<2";
const LANGCHAIN: &str = "langchain-openai>=0.3,<2";

#[test]
fn litellm_and_langchain_recognise_the_context_window_error_and_refusals() {
    let Some(python) = python::venv("clients-venv", &[LITELLM, LANGCHAIN]) else {
        return;
    };
    // LiteLLM must not reach for its model price list online.
    let scripts = ["litellm_client.py", "langchain_client.py"];
    let env = [("LITELLM_LOCAL_MODEL_COST_MAP", "True")];
    let [litellm, langchain] =
        <[_; 2]>::try_from(against_up(&python, &scripts, &env)).expect("two");
    assert_eq!(
        litellm["context_window_error"],
        "ContextWindowExceededError"
    );
    assert_eq!(litellm["tools_refused"], true);
    assert_eq!(langchain["tools_refused"], "tools");
    assert_eq!(langchain["context_error"], "context_length_exceeded");
    assert!(langchain["json_mode"].is_object(), "{langchain}");
}
