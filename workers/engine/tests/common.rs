//! Shared helpers for the engine's integration tests.

// Tests read their services from the environment (clippy.toml keeps
// library code from it).
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)]
#![allow(dead_code, unreachable_pub)]

use anyhow::Context;
use bulkhead_engine::fetch::{self, Progress};
use bulkhead_engine::{Engine, EngineConfig, GenerateRequest, ModelFile, SeqEvent};
use bulkhead_kv::TenantId;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

/// The default model's file, fetched and verified if missing.
pub fn model_path() -> PathBuf {
    fetch::ensure_default_model(&fetch::Source::from_vars(
        |k| std::env::var_os(k),
        Progress::Quiet,
    ))
    .expect("default model")
}

/// The default model, fetched and verified once per test process.
pub fn model() -> Arc<ModelFile> {
    static MODEL: OnceLock<Arc<ModelFile>> = OnceLock::new();
    Arc::clone(MODEL.get_or_init(|| Arc::new(ModelFile::load(&model_path()).expect("model loads"))))
}

/// `testdata/smollm2-135m-q4_1.json` at the project root: llama.cpp's
/// numbers on the default model, kept in the repository.
pub fn golden() -> Value {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/smollm2-135m-q4_1.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading {}", path.display()))
        .expect("golden file");
    serde_json::from_str(&text).expect("golden json")
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array of ids")
        .iter()
        .map(|x| u32::try_from(x.as_u64().expect("id")).expect("u32 id"))
        .collect()
}

/// An engine with a modest pool, as tests use.
pub fn engine(kv_mib: usize) -> Engine {
    let mut c = EngineConfig::with_budget(kv_mib << 20);
    c.threads = 2;
    Engine::start(model(), &c).expect("engine starts")
}

/// Runs one request to the end: (token ids, text, finish event or failure).
pub fn run(engine: &Engine, tenant: u64, req: GenerateRequest) -> (Vec<u32>, String, SeqEvent) {
    let mut h = engine.submit(TenantId::new(tenant), req).expect("admitted");
    let (mut ids, mut text) = (Vec::new(), String::new());
    while let Some(ev) = h.blocking_next() {
        match ev {
            SeqEvent::Token { id, text: t, .. } => {
                ids.push(id);
                text.push_str(&t);
            }
            end => {
                if let SeqEvent::Finished { text: t, .. } = &end {
                    text.push_str(t);
                }
                return (ids, text, end);
            }
        }
    }
    panic!("event stream ended without a final event");
}

pub fn greedy(prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest::fixed_length(prompt, max_tokens)
}

/// Every golden case's greedy tokens and text equal llama.cpp's.
pub fn greedy_output_matches_golden() {
    let g = golden();
    let e = engine(256);
    let mut failures = Vec::new();
    for case in g["cases"].as_array().unwrap() {
        let expected = ids(&case["greedy_ids"]);
        let (got, _, _) = run(&e, 1, greedy(ids(&case["prompt_ids"]), expected.len()));
        if got != expected {
            let at = got.iter().zip(&expected).position(|(a, b)| a != b);
            failures.push(format!(
                "{}: first difference at {at:?}\n got {got:?}\nwant {expected:?}",
                case["name"]
            ));
        }
        // The text up to EOS, decoded as a client sees it.
        let eos = model().tokenizer().eos();
        let until_eos: Vec<u32> = expected.iter().copied().take_while(|t| *t != eos).collect();
        assert_eq!(
            model().tokenizer().decode(&until_eos, true),
            case["greedy_text_until_eos"].as_str().unwrap()
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// One golden case gives the same tokens with pages of every size given.
pub fn greedy_output_is_the_same_for_page_sizes(sizes: &[usize]) {
    let g = golden();
    let case = &g["cases"][2];
    let expected = ids(&case["greedy_ids"]);
    for &page_size in sizes {
        let mut config = bulkhead_engine::EngineConfig::with_budget(64 << 20);
        config.page_size = page_size;
        config.threads = 2;
        let e = bulkhead_engine::Engine::start(model(), &config).expect("engine starts");
        let (got, _, _) = run(&e, 1, greedy(ids(&case["prompt_ids"]), expected.len()));
        assert_eq!(got, expected, "page size {page_size}");
    }
}
