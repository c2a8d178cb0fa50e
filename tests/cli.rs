//! The `bulkhead` binary as a user runs it.

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

fn bulkhead(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_bulkhead"))
        .args(args)
        .output()
        .expect("bulkhead runs")
}

fn golden() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/smollm2-135m-q4_1.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("golden file")).expect("golden json")
}

fn generate_json(args: &[&str]) -> Value {
    let out = bulkhead(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

#[test]
fn generate_json_matches_llama_cpp_on_the_default_model() {
    let g = golden();
    let case = &g["cases"][0];
    let v = generate_json(&[
        "generate",
        "--raw",
        case["prompt"].as_str().unwrap(),
        "--max-tokens",
        "32",
        "--json",
    ]);
    assert_eq!(v["prompt_token_ids"], case["prompt_ids"]);
    assert_eq!(v["text"], case["greedy_text_until_eos"]);
    assert_eq!(v["finish_reason"], "stop");
    let expected: Vec<Value> = case["greedy_ids"]
        .as_array()
        .unwrap()
        .iter()
        .take_while(|t| t.as_u64() != Some(2))
        .cloned()
        .collect();
    assert_eq!(v["token_ids"], Value::Array(expected));

    // --prompt renders the model's chat template (with its default system turn).
    let case = &g["cases"][1];
    let v = generate_json(&[
        "generate",
        "--prompt",
        "What is the capital of France?",
        "--max-tokens",
        "4",
        "--json",
    ]);
    assert_eq!(v["prompt_token_ids"], case["prompt_ids"]);
    assert_eq!(v["finish_reason"], "length");
    assert_eq!(v["token_ids"].as_array().unwrap().len(), 4);
}

#[test]
fn sampling_is_reproducible_by_seed() {
    let run = |seed: &str| {
        generate_json(&[
            "generate",
            "--prompt",
            "Name a colour.",
            "--temperature",
            "1.0",
            "--seed",
            seed,
            "--max-tokens",
            "12",
            "--json",
        ])["token_ids"]
            .clone()
    };
    let first = run("7");
    assert_eq!(first, run("7"), "the same seed gives the same tokens");
    // A sampler that ignored the seed would give these the same tokens too.
    let others: Vec<Value> = ["8", "9", "10"].iter().map(|s| run(s)).collect();
    assert!(
        others.iter().any(|o| *o != first),
        "different seeds must sample differently: {first} vs {others:?}"
    );
}

#[test]
fn bad_input_gets_a_clear_error() {
    let out = bulkhead(&[
        "generate",
        "--raw",
        "hi",
        "--model",
        "/nonexistent/model.gguf",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/model.gguf"), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    let out = bulkhead(&["generate", "--raw", "hi", "--max-tokens", "0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_tokens must be at least 1"));

    let out = bulkhead(&["generate", "--raw", "hi", "--kv-budget-mib", "0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("holds no page"));

    let out = bulkhead(&["generate", "--raw", "hi", "--max-tokens", "100000"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("exceeds the context window"));
}

#[test]
fn rdma_without_the_feature_or_a_device_is_a_clear_error() {
    for role in ["prefill", "decode"] {
        let out = bulkhead(&[role, "--transport", "rdma", "--kv-budget-mib", "64"]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--transport rdma:"), "{err}");
        // Either this build lacks the feature, or this host lacks a device.
        assert!(
            err.contains("rebuild with `cargo build --features rdma`") || err.contains("RDMA"),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// Every worker role and `generate`, asked for a GPU, refuse in one
/// sentence before loading anything: a build without `--features cuda`
/// says so (`.ci/run` checks the cuda build's own sentence, on a machine
/// with no driver), and nothing panics.
#[test]
fn asking_for_a_gpu_is_one_clear_sentence_not_a_panic() {
    for args in [
        &["serve", "--device", "cuda"][..],
        &["prefill", "--device", "cuda"],
        &["decode", "--device", "cuda:1"],
        &["generate", "--device", "cuda", "--prompt", "hi"],
    ] {
        let out = bulkhead(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        let known = [
            "this build has no CUDA support",
            "no CUDA driver (libcuda.so.1) was found",
            "this build has no CUDA engine yet",
        ];
        assert!(known.iter().any(|k| err.contains(k)), "{args:?}: {err}");
    }
    let out = bulkhead(&["serve", "--device", "tpu"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("a device is cpu, cuda or cuda:N"));
}
