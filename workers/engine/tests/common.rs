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

/// The default model, fetched and verified once per test process.
pub fn model() -> Arc<ModelFile> {
    static MODEL: OnceLock<Arc<ModelFile>> = OnceLock::new();
    Arc::clone(MODEL.get_or_init(|| {
        let path = fetch::ensure_default_model(&fetch::Source::from_vars(
            |k| std::env::var_os(k),
            Progress::Quiet,
        ))
        .expect("default model");
        Arc::new(ModelFile::load(&path).expect("model loads"))
    }))
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
