//! The platform through the official client SDKs from PyPI, as users call
//! it: `tests/sdk/openai_client.py` runs the `openai` package against a
//! real `bulkhead up` (JSON schema and JSON mode, logprobs, `n`, streaming
//! with usage, rate-limit headers, the context-length error's wording,
//! refusals by name, the models list, `stop`), `tests/sdk/openai_tools.py`
//! its tool calls (required, named, streamed, a follow-up),
//! `tests/sdk/openai_files.py` its Files API (a 100-line batch input file
//! up, back and deleted; another account's reads are not found),
//! `tests/sdk/cloudflare_client.py` the cloudflare SDK's `ai.run` (with
//! tools in both shapes), `tests/sdk/openai_embeddings.py` and
//! `tests/sdk/cloudflare_embeddings.py` both SDKs' embeddings, `tests/sdk/litellm_client.py` runs LiteLLM (its
//! context-window error class, a tool call, refusals, an answer) and
//! `tests/sdk/langchain_client.py` LangChain's `ChatOpenAI` (usage, JSON
//! mode, `stop`, `bind_tools` giving `tool_calls`, the context-length error,
//! `OpenAIEmbeddings`).
//!
//! The SDK is installed into a virtual environment under `target/`; where
//! PyPI cannot be reached the test says so and passes, except in CI
//! (`CI=true`), where it fails.

mod support;

use std::process::Command;
use support::python;

/// The pinned SDKs: major versions users run today.
const OPENAI: &str = "openai>=1.50,<3";
const CLOUDFLARE: &str = "cloudflare>=4,<5";

/// Runs each of `scripts` (in `tests/sdk/`) with `python` against one fresh
/// `bulkhead up`; returns what each printed.
fn against_up(
    python: &std::path::Path,
    scripts: &[&str],
    env: &[(&str, &str)],
) -> Vec<serde_json::Value> {
    let dir = support::platform::data_dir("sdk");
    let up = support::platform::up_with_embeddings(&dir, &["--prober-interval-secs", "3600"]);
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
            .env("BULKHEAD_GATEWAY_URL", gw)
            .env("BULKHEAD_ACCOUNT_ID", &creds.accounts[0].id)
            .env("BULKHEAD_TOKEN", token)
            .env("BULKHEAD_MODEL", &creds.model)
            .env(
                "BULKHEAD_EMBED_MODEL",
                creds.embedding_model.as_deref().unwrap_or_default(),
            )
            .env("BULKHEAD_SPENT_TOKEN", &spent.token)
            .envs(env.iter().copied());
        python::run_json(cmd, script)
    };
    let seen = scripts.iter().map(run).collect();
    drop(up);
    let _ = std::fs::remove_dir_all(&dir);
    seen
}

/// The openai SDK (`openai_client.py`; tool calls in `openai_tools.py`)
/// and the cloudflare SDK's `ai.run` (`cloudflare_client.py`), against one
/// `bulkhead up`.
#[test]
fn the_openai_and_cloudflare_python_sdks_get_what_they_ask_for() {
    let Some(python) = python::venv("sdk-venv", &[OPENAI, CLOUDFLARE]) else {
        return;
    };
    let scripts = [
        "openai_client.py",
        "openai_tools.py",
        "openai_files.py",
        "cloudflare_client.py",
        "openai_embeddings.py",
        "cloudflare_embeddings.py",
    ];
    let [seen, tools, files, cf, emb, cf_emb] =
        <[_; 6]>::try_from(against_up(&python, &scripts, &[])).expect("six");
    assert_eq!(seen["n"], 3);
    assert_eq!(seen["over_budget_attempts"], 1, "not retried: {seen}");
    assert!(seen["json_schema"]["age"].is_i64(), "{seen}");
    assert!(
        seen["flex"].is_string(),
        "a flex request is answered: {seen}"
    );
    // Tool calls: required and named calls' arguments match the schema
    // (the script checks them), streamed ones assemble, follow-ups answer.
    assert!(tools["named"][0]["city"].is_string(), "{tools}");
    assert!(tools["streamed"]["city"].is_string(), "{tools}");
    assert_eq!(tools["raw_stream_calls"], 1, "{tools}");
    assert!(tools["follow_up"].is_string(), "{tools}");
    assert_eq!(tools["refused"], "tools");
    // Batch input files: 100 lines up and back, another account's reads
    // answered as an unknown id's, deleted.
    assert!(files["file"]["id"].is_string(), "{files}");
    assert_eq!(files["another_account"], "not found");
    assert_eq!(files["deleted"], true);
    // The 100 lines as a batch, completed with one answer each.
    assert_eq!(files["batch"]["answers"], 100, "{files}");
    for shape in ["flat", "openai", "streamed"] {
        assert!(cf[shape]["city"].is_string(), "{cf}");
    }
    // Embeddings: the SDK's base64 default decodes to the float answer, a
    // text and its word pieces as ids are one vector, similar texts are
    // closer than unrelated ones, and another width is refused.
    assert_eq!(emb["dimensions"], 384, "{emb}");
    assert_eq!(emb["token_ids_dimensions"], 384, "{emb}");
    assert_eq!(emb["usage"]["prompt_tokens"], emb["usage"]["total_tokens"]);
    assert!(emb["usage"]["prompt_tokens"].as_u64() > Some(2), "{emb}");
    let cos = |k: &str| emb[k].as_f64().unwrap_or(0.0);
    for same in [
        "same_text_cosine",
        "float_vs_base64_cosine",
        "token_ids_cosine",
    ] {
        assert!(cos(same) > 0.9999, "{same}: {emb}");
    }
    assert!(
        cos("similar_cosine") > cos("unrelated_cosine") + 0.3,
        "{emb}"
    );
    assert!(
        emb["dimensions_refused"]
            .as_str()
            .is_some_and(|m| m.contains("384")),
        "{emb}"
    );
    assert_eq!(cf_emb["one_shape"], serde_json::json!([1, 384]), "{cf_emb}");
    assert_eq!(
        cf_emb["many_shape"],
        serde_json::json!([3, 384]),
        "{cf_emb}"
    );
    assert_eq!(cf_emb["rows"], serde_json::json!([384, 384, 384]));
    assert_eq!(cf_emb["pooling"], "mean");
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
    assert!(litellm["tool_call"]["city"].is_string(), "{litellm}");
    assert_eq!(litellm["refused"], true);
    assert_eq!(langchain["tool_call"]["name"], "get_weather");
    assert!(
        langchain["tool_call"]["args"]["city"].is_string(),
        "{langchain}"
    );
    assert_eq!(langchain["context_error"], "context_length_exceeded");
    assert!(langchain["json_mode"].is_object(), "{langchain}");
    assert_eq!(
        langchain["embeddings"],
        serde_json::json!({"documents": [384, 384], "query": 384})
    );
}
