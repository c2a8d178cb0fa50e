//! The worker router through `oneshot`: bad input gets a clear error in the
//! API's own format, and a good request streams NDJSON.

use axum::body::{Body, to_bytes};
use axum::http::{Request, StatusCode};
use bulkhead_engine::{Engine, EngineConfig, ModelFile};
use bulkhead_node::{Role, app};
use serde_json::Value;
use std::sync::{Arc, OnceLock};
use tower::ServiceExt;

/// A fresh engine (16 MiB of pages, one thread) on the shared model file.
fn engine() -> Arc<Engine> {
    static MODEL: OnceLock<Arc<ModelFile>> = OnceLock::new();
    let model = MODEL.get_or_init(|| {
        let path =
            bulkhead_engine::fetch::ensure_default_model(bulkhead_engine::fetch::Progress::Quiet)
                .expect("default model");
        Arc::new(ModelFile::load(&path).expect("model loads"))
    });
    let mut config = EngineConfig::with_budget(16 << 20);
    config.threads = 1;
    Arc::new(Engine::start(Arc::clone(model), &config).expect("engine starts"))
}

async fn post(engine: &Arc<Engine>, tenant: Option<&str>, body: &str) -> (StatusCode, String) {
    let mut req = Request::post("/v1/generate");
    if let Some(t) = tenant {
        req = req.header("x-bulkhead-tenant", t);
    }
    let res = app(Role::Colocated(Arc::clone(engine)))
        .oneshot(req.body(Body::from(body.to_owned())).expect("request"))
        .await
        .expect("router answers");
    let status = res.status();
    let bytes = to_bytes(res.into_body(), 1 << 20).await.expect("body");
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

fn error_code(body: &str) -> String {
    let v: Value = serde_json::from_str(body).expect("JSON error body");
    v["error"]["code"].as_str().expect("error.code").to_owned()
}

#[tokio::test]
async fn bad_requests_get_clear_errors_in_the_api_format() {
    let cases: &[(Option<&str>, &str, StatusCode, &str)] = &[
        (
            None,
            r#"{"raw": "hi"}"#,
            StatusCode::BAD_REQUEST,
            "missing_tenant",
        ),
        (
            Some("x"),
            r#"{"raw": "hi"}"#,
            StatusCode::BAD_REQUEST,
            "missing_tenant",
        ),
        (
            Some("1"),
            "{not json",
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            Some("1"),
            r#"{"raw": "hi", "nope": 1}"#,
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            Some("1"),
            r#"{"raw": "hi", "tokens": [1]}"#,
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            Some("1"),
            r#"{"tokens": [99999999]}"#,
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            Some("1"),
            r#"{"raw": "hi", "max_tokens": 0}"#,
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            Some("1"),
            r#"{"tokens": []}"#,
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        // 16 MiB of f16 pages hold 45 pages = 720 tokens.
        (
            Some("1"),
            r#"{"raw": "hi", "max_tokens": 5000}"#,
            StatusCode::BAD_REQUEST,
            "context_length_exceeded",
        ),
    ];
    let engine = engine();
    for (tenant, body, status, code) in cases {
        let (got, text) = post(&engine, *tenant, body).await;
        assert_eq!(got, *status, "{body}: {text}");
        assert_eq!(error_code(&text), *code, "{body}: {text}");
    }
    let stats = engine.counters().expect("counters");
    assert_eq!(stats.allocations, 0, "no rejected request touched a page");
}

#[tokio::test]
async fn a_request_streams_ndjson_tokens_then_a_summary() {
    let (status, text) = post(
        &engine(),
        Some("3"),
        r#"{"raw": "The capital of France is", "max_tokens": 4, "ignore_eos": true}"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("line"))
        .collect();
    assert_eq!(lines.len(), 5, "{text}");
    assert!(lines[..4].iter().all(|l| l["token"].is_u64()));
    assert_eq!(lines[4]["finish_reason"], "length");
    assert_eq!(lines[4]["usage"]["completion_tokens"], 4);
}
