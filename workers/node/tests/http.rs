//! The worker router through `oneshot`: bad input gets a clear error in the
//! API's own format, and a good request streams NDJSON.

// Tests read their services from the environment (clippy.toml keeps
// library code from it).
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)]

use axum::body::{Body, to_bytes};
use axum::http::{Request, StatusCode};
use bulkhead_engine::{Engine, EngineConfig, ModelFile};
use bulkhead_node::ContextCheck;
use bulkhead_node::{Role, app};
use bulkhead_trust::{Peer, Role as CertRole};
use bulkhead_worker_api::context::{CONTEXT_HEADER, SigningKey, TenantContext};
use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};
use tower::ServiceExt;

/// A fresh engine (16 MiB of pages, one thread) on the shared model file.
fn engine() -> Arc<Engine> {
    static MODEL: OnceLock<Arc<ModelFile>> = OnceLock::new();
    let model = MODEL.get_or_init(|| {
        use bulkhead_engine::fetch::{Progress, Source, ensure_default_model};
        let source = Source::from_vars(|k| std::env::var_os(k), Progress::Quiet);
        let path = ensure_default_model(&source).expect("default model");
        Arc::new(ModelFile::load(&path).expect("model loads"))
    });
    let mut config = EngineConfig::with_budget(16 << 20);
    config.threads = 1;
    Arc::new(Engine::start(Arc::clone(model), &config).expect("engine starts"))
}

const SLUG: &str = "@cf/huggingfacetb/smollm2-135m-instruct";

/// The gateway's context signing key in these tests.
fn ring() -> SigningKey {
    SigningKey::parse(&format!("k1 {}\n", "5a".repeat(32)), "test").expect("ring")
}

/// A statement for `tenant`, at most `max_tokens`, issued `age` ago.
fn statement(tenant: u64, max_tokens: u64, age: Duration) -> TenantContext {
    static N: AtomicU64 = AtomicU64::new(0);
    TenantContext::new(
        &"a".repeat(32),
        tenant,
        format!("req-{}", N.fetch_add(1, Ordering::Relaxed)),
        SLUG,
        Some(1),
        max_tokens,
        None,
        SystemTime::now() - age,
    )
}

/// A signed context for `tenant` allowing plenty of tokens.
fn signed(tenant: u64) -> String {
    ring().sign(&statement(tenant, 100_000, Duration::ZERO))
}

async fn post(engine: &Arc<Engine>, tenant: u64, body: &str) -> (StatusCode, String) {
    post_as(engine, Some(CertRole::Gateway), Some(signed(tenant)), body).await
}

/// A request that came in on a connection whose certificate names
/// `caller`, with the context header `ctx`.
async fn post_as(
    engine: &Arc<Engine>,
    caller: Option<CertRole>,
    ctx: Option<String>,
    body: &str,
) -> (StatusCode, String) {
    post_with(
        engine,
        &ContextCheck::new(ring().verifying(), SLUG),
        caller,
        ctx,
        body,
    )
    .await
}

/// As [`post_as`], through a worker whose context check is `check` (its
/// record of spent request ids).
async fn post_with(
    engine: &Arc<Engine>,
    check: &Arc<ContextCheck>,
    caller: Option<CertRole>,
    ctx: Option<String>,
    body: &str,
) -> (StatusCode, String) {
    let mut req = Request::post("/v1/generate");
    if let Some(c) = ctx {
        req = req.header(CONTEXT_HEADER, c);
    }
    let mut req = req.body(Body::from(body.to_owned())).expect("request");
    if let Some(role) = caller {
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(Peer {
                addr: std::net::SocketAddr::from(([127, 0, 0, 1], 9)),
                role: Some(role),
                scope: Default::default(),
            }));
    }
    let res = app(Role::Colocated(Arc::clone(engine)), Arc::clone(check))
        .oneshot(req)
        .await
        .expect("router answers");
    let status = res.status();
    let bytes = to_bytes(res.into_body(), 1 << 20).await.expect("body");
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

fn error_code(body: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap_or_default();
    v["error"]["code"]
        .as_str()
        .unwrap_or("(not an error)")
        .to_owned()
}

#[tokio::test]
async fn only_the_gateways_certificate_may_generate() {
    let e = engine();
    let body = r#"{"prompt":"hi","max_tokens":1}"#;
    for caller in [None, Some(CertRole::Operator), Some(CertRole::Decode)] {
        let (status, text) = post_as(&e, caller, Some(signed(1)), body).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{caller:?}: {text}");
        assert_eq!(error_code(&text), "forbidden");
    }
    let (status, text) = post_as(&e, Some(CertRole::Gateway), Some(signed(1)), body).await;
    assert_eq!(status, StatusCode::OK, "{text}");
}

#[tokio::test]
async fn a_missing_forged_expired_replayed_or_mismatched_context_is_refused_before_allocation() {
    let e = engine();
    let body = r#"{"raw":"hi","max_tokens":4}"#;
    let gw = Some(CertRole::Gateway);
    let theirs = SigningKey::parse(&format!("k1 {}\n", "77".repeat(32)), "other").expect("ring");
    let tampered = {
        let good = ring().sign(&statement(1, 100, Duration::ZERO));
        let mut other = statement(2, 100, Duration::ZERO);
        other.request_id = "tampered".to_owned();
        let forged = ring().sign(&other);
        let (_, tag) = good.rsplit_once('.').expect("tag");
        let (payload, _) = forged.rsplit_once('.').expect("payload");
        format!("{payload}.{tag}")
    };
    let mut other_model = statement(1, 100, Duration::ZERO);
    other_model.model = "@cf/meta/llama-3.1-8b-instruct".to_owned();
    let mut window = statement(1, 100, Duration::ZERO);
    window.context_limit = Some(512);
    let mut embedding = statement(1, 100, Duration::ZERO);
    embedding.audience = bulkhead_worker_api::context::Audience::Embed;
    let cases: Vec<(Option<String>, &str, StatusCode, &str)> = vec![
        (None, body, StatusCode::UNAUTHORIZED, "missing_context"),
        (
            Some("v1.k1.e30.AAAA".to_owned()),
            body,
            StatusCode::UNAUTHORIZED,
            "invalid_context",
        ),
        (
            Some(theirs.sign(&statement(1, 100, Duration::ZERO))),
            body,
            StatusCode::UNAUTHORIZED,
            "invalid_context",
        ),
        (
            Some(tampered),
            body,
            StatusCode::UNAUTHORIZED,
            "invalid_context",
        ),
        (
            Some(ring().sign(&statement(1, 100, Duration::from_secs(60)))),
            body,
            StatusCode::UNAUTHORIZED,
            "expired_context",
        ),
        (
            Some(ring().sign(&other_model)),
            body,
            StatusCode::FORBIDDEN,
            "wrong_model",
        ),
        (
            Some(ring().sign(&embedding)),
            body,
            StatusCode::FORBIDDEN,
            "wrong_audience",
        ),
        (
            Some(ring().sign(&statement(1, 3, Duration::ZERO))),
            body,
            StatusCode::FORBIDDEN,
            "limits_exceeded",
        ),
        (
            Some(ring().sign(&window)),
            r#"{"raw":"hi","max_tokens":4,"context_limit":4096}"#,
            StatusCode::FORBIDDEN,
            "limits_exceeded",
        ),
    ];
    for (ctx, body, status, code) in cases {
        let (got, text) = post_as(&e, gw, ctx.clone(), body).await;
        assert_eq!(
            (got, error_code(&text).as_str()),
            (status, code),
            "{ctx:?}: {text}"
        );
    }
    assert_eq!(
        e.counters().expect("counters").allocations,
        0,
        "nothing was allocated"
    );
    // A context is good for one call.
    let once = ring().sign(&statement(1, 100, Duration::ZERO));
    let worker = ContextCheck::new(ring().verifying(), SLUG);
    let (got, text) = post_with(&e, &worker, gw, Some(once.clone()), body).await;
    assert_eq!(got, StatusCode::OK, "{text}");
    let before = e.counters().expect("counters").allocations;
    let (got, text) = post_with(&e, &worker, gw, Some(once), body).await;
    assert_eq!(
        (got, error_code(&text).as_str()),
        (StatusCode::FORBIDDEN, "replayed_context"),
        "{text}"
    );
    assert_eq!(e.counters().expect("counters").allocations, before);
    // The tenant is the context's, whatever a header says.
    let mut req = Request::post("/v1/generate")
        .header(CONTEXT_HEADER, signed(5))
        .header("x-bulkhead-tenant", "6")
        .body(Body::from(body))
        .expect("request");
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(Peer {
            addr: std::net::SocketAddr::from(([127, 0, 0, 1], 9)),
            role: Some(CertRole::Gateway),
            scope: Default::default(),
        }));
    let res = app(
        Role::Colocated(Arc::clone(&e)),
        ContextCheck::new(ring().verifying(), SLUG),
    )
    .oneshot(req)
    .await
    .expect("answer");
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test]
async fn bad_requests_get_clear_errors_in_the_api_format() {
    let cases: &[(u64, &str, StatusCode, &str)] = &[
        (1, "{not json", StatusCode::BAD_REQUEST, "invalid_request"),
        (
            1,
            r#"{"raw": "hi", "nope": 1}"#,
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            1,
            r#"{"raw": "hi", "tokens": [1]}"#,
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            1,
            r#"{"tokens": [99999999]}"#,
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            1,
            r#"{"raw": "hi", "max_tokens": 0}"#,
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            1,
            r#"{"tokens": []}"#,
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        // 16 MiB of f16 pages hold 45 pages = 720 tokens.
        (
            1,
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
    // Stop strings past their stated count or length, at the worker's own
    // door too.
    let long = serde_json::json!({"raw": "hi", "stop": ["s".repeat(1025)]}).to_string();
    let many = serde_json::json!({"raw": "hi", "stop": ["a", "b", "c", "d", "e"]}).to_string();
    for body in [long, many] {
        let (got, text) = post(&engine, 1, &body).await;
        assert_eq!(got, StatusCode::BAD_REQUEST, "{text}");
        assert_eq!(error_code(&text), "invalid_request", "{text}");
    }
    let stats = engine.counters().expect("counters");
    assert_eq!(stats.allocations, 0, "no rejected request touched a page");
}

#[tokio::test]
async fn a_request_streams_ndjson_tokens_then_a_summary() {
    let (status, text) = post(
        &engine(),
        3,
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

/// Property-based fuzzing of the body through the router: whatever JSON
/// (or not) arrives, the answer is a 200 NDJSON stream or a 4xx in the
/// API's error format, and a refused request touches no page. The context
/// allows 8 tokens, so an accepted body stays cheap. Cases:
/// `PROPTEST_CASES` (64 by default here).
#[test]
fn any_body_gets_an_answer_in_the_api_format() {
    use bulkhead_test_support::fuzz;
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-2i64..12).prop_map(Value::from),
        any::<f32>().prop_map(|f| serde_json::json!(f)),
        ".{0,24}".prop_map(Value::from),
    ];
    let keys = prop::sample::select(vec!["role", "content", "x"]).prop_map(str::to_owned);
    let tree = fuzz::Tree {
        depth: 2,
        size: 12,
        branch: 3,
        width: 3,
    };
    let value = fuzz::json_tree(leaf.boxed(), keys.boxed(), tree);
    let fields = prop::sample::select(vec![
        "prompt",
        "messages",
        "raw",
        "tokens",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "repetition_penalty",
        "seed",
        "stop",
        "ignore_eos",
        "context_limit",
        "stream",
    ])
    .prop_map(str::to_owned);
    // A valid body with a field replaced, removed or added (so some are
    // served), or text.
    let valid = serde_json::json!({"raw": "hi", "max_tokens": 4});
    let fields = fields.boxed();
    let mutated = fuzz::mutations(valid, fields.clone(), (value, fields), true);
    let mutated = mutated.prop_map(|b| b.to_string());
    let body = prop_oneof![4 => mutated, 1 => ".{0,80}"];
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(64);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let engine = engine();
    let mut runner =
        proptest::test_runner::TestRunner::new(proptest::test_runner::Config::with_cases(cases));
    let (answered, refused) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
    let result = runner.run(&body, |b| {
        rt.block_on(async {
            let before = engine.counters().expect("counters").allocations;
            let ctx = ring().sign(&statement(1, 8, Duration::ZERO));
            let (status, text) = post_as(&engine, Some(CertRole::Gateway), Some(ctx), &b).await;
            if status == StatusCode::OK {
                answered.set(answered.get() + 1);
                for line in text.lines() {
                    prop_assert!(serde_json::from_str::<Value>(line).is_ok(), "{line}");
                }
            } else {
                refused.set(refused.get() + 1);
                prop_assert!(status.is_client_error(), "{b}: {status} {text}");
                prop_assert_ne!(error_code(&text), "(not an error)", "{}: {}", b, text);
                let after = engine.counters().expect("counters").allocations;
                prop_assert_eq!(before, after, "a refused body allocated: {}", b);
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    assert!(
        refused.get() > 0 && answered.get() > 0,
        "{} answered, {} refused: the fuzzer must make both",
        answered.get(),
        refused.get()
    );
    eprintln!("{} answered, {} refused", answered.get(), refused.get());
}
