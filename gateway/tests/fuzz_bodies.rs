//! Property-based fuzzing of the gateway's request bodies and credentials
//! through the real router: OpenAI chat, completions and embeddings, the
//! Workers AI run route, and the Authorization header (API tokens and JWTs). Whatever
//! arrives, the answer is never a 5xx other than "no worker" (503: admitted,
//! as in router.rs, where no worker runs), always JSON in the API's own
//! error shape when it is an error, and never echoes a secret.
//!
//! Bodies are JSON built from the fields the APIs know, with values of
//! every type, and raw byte strings. Cases per property: `PROPTEST_CASES`
//! (64 by default here; each case is a few router calls).

// Tests read their services from the environment (clippy.toml keeps
// library code from it).
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)]

mod support;

use bulkhead_test_support::fuzz;
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use serde_json::{Value, json};
use support::{OPEN, Platform, bearer, platform, post};

/// Any JSON value, a few levels deep.
fn value() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        (-5i64..70_000).prop_map(Value::from),
        ".{0,40}".prop_map(Value::from),
        Just(Value::from(OPEN)),
        Just(Value::from("user")),
    ];
    let tree = fuzz::Tree {
        depth: 3,
        size: 24,
        branch: 4,
        width: 4,
    };
    fuzz::json_tree(leaf.boxed(), key().boxed(), tree)
}

/// A field name the APIs read, or another.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "model",
            "messages",
            "prompt",
            "max_tokens",
            "max_completion_tokens",
            "temperature",
            "top_p",
            "seed",
            "stream",
            "stream_options",
            "include_usage",
            "stop",
            "role",
            "content",
            "n",
            "raw",
            "lora",
            "response_format",
            "tools",
            "text",
            "type",
            "input",
            "encoding_format",
            "dimensions",
            "pooling",
        ])
        .prop_map(str::to_owned),
        "[a-z_]{1,12}",
    ]
}

/// A request body: a valid one with a field replaced, removed or added
/// (so many reach admission), any JSON, or arbitrary text.
fn body(valid: Value) -> impl Strategy<Value = String> {
    let targets = fuzz::own_fields(&valid);
    let mutated = fuzz::mutations(valid, targets, (value(), key().boxed()), true);
    let mutated = mutated.prop_map(|b| b.to_string());
    prop_oneof![
        6 => mutated,
        1 => value().prop_map(|v| v.to_string()),
        1 => ".{0,200}",
    ]
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(64);
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

/// The answer is admitted (503, no worker) or a client error in the
/// route's shape.
fn check(status: u16, text: &str, openai: bool) -> Result<(), TestCaseError> {
    prop_assert!(
        status == 503 || (400..500).contains(&status),
        "status {status}: {text}"
    );
    let v: Value = serde_json::from_str(text)
        .map_err(|e| TestCaseError::fail(format!("not JSON ({e}): {text}")))?;
    if openai {
        prop_assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{v}"
        );
        prop_assert!(v["error"]["type"].is_string(), "{v}");
    } else {
        prop_assert_eq!(&v["success"], &Value::Bool(false), "{}", v);
        prop_assert!(v["errors"][0]["code"].is_u64(), "{v}");
    }
    Ok(())
}

#[test]
fn request_bodies_get_an_answer_in_their_apis_shape() {
    let rt = runtime();
    let (p, gw) = rt.block_on(async {
        let p = platform().await;
        let gw = p.gateway(None, Platform::limiter()).await;
        (p, gw)
    });
    let auth = bearer(&p.a_token);
    let run_path = format!("/client/v4/accounts/{}/ai/run/{OPEN}", p.a);
    let routes = [
        (
            "/v1/chat/completions",
            true,
            json!({"model": OPEN, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}),
        ),
        (
            "/v1/completions",
            true,
            json!({"model": OPEN, "prompt": "hi", "max_tokens": 8}),
        ),
        (
            run_path.as_str(),
            false,
            json!({"prompt": "hi", "max_tokens": 8}),
        ),
        // The generating model refuses embeddings by its task: what is
        // fuzzed here is the body's reading before that.
        (
            "/v1/embeddings",
            true,
            json!({"model": OPEN, "input": ["hi", "there"], "encoding_format": "float"}),
        ),
    ];
    let (admitted, refused) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
    let mut result = Ok(());
    for (path, openai, valid) in routes {
        let mut runner = TestRunner::new(config());
        result = result.and(runner.run(&body(valid), |b| {
            rt.block_on(async {
                let r = post(&gw, path, &auth, &b).await;
                check(r.status.as_u16(), &r.body, openai)?;
                let n = if r.status.as_u16() == 503 {
                    &admitted
                } else {
                    &refused
                };
                n.set(n.get() + 1);
                prop_assert!(!r.body.contains(&p.a_token), "the token was echoed");
                Ok(())
            })
        }));
    }
    if let Err(e) = result {
        panic!("{e}");
    }
    // Both kinds of answer came: the bodies reach past parsing.
    let (a, r) = (admitted.get(), refused.get());
    assert!(a > 0 && r > 0, "{a} admitted, {r} refused");
    eprintln!("{a} admitted, {r} refused");
}

/// An Authorization header: garbage, a bearer of garbage, or a JWT-shaped
/// value of three base64url segments, some of them real JSON.
fn authorization() -> impl Strategy<Value = String> {
    use base64::Engine as _;
    let b64 = |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    prop_oneof![
        "[ -~]{0,80}",
        "[ -~]{0,80}".prop_map(|t| format!("Bearer {t}")),
        (value(), value(), "[A-Za-z0-9_-]{0,60}").prop_map(move |(h, c, s)| format!(
            "Bearer {}.{}.{s}",
            b64(&h),
            b64(&c)
        )),
        (
            prop::sample::select(vec!["HS256", "RS256", "EdDSA", "none", "ES256"]),
            value()
        )
            .prop_map(move |(alg, c)| {
                format!(
                    "Bearer {}.{}.",
                    b64(&json!({"alg": alg, "typ": "JWT"})),
                    b64(&c)
                )
            }),
    ]
}

#[test]
fn credentials_of_any_shape_are_refused_in_the_apis_shape() {
    let rt = runtime();
    let (p, gw) = rt.block_on(async {
        let p = platform().await;
        let jwt = bulkhead_gateway::JwtConfig::new(
            Some(b"a shared secret of thirty-two bytes!"),
            bulkhead_gateway::JwtKeys::default(),
        )
        .expect("jwt config");
        let gw = p.gateway(Some(jwt), Platform::limiter()).await;
        (p, gw)
    });
    let body = json!({"model": OPEN, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let run_path = format!("/client/v4/accounts/{}/ai/run/{OPEN}", p.a);
    let mut runner = TestRunner::new(config());
    let result = runner.run(&authorization(), |a| {
        rt.block_on(async {
            for (path, openai) in [("/v1/chat/completions", true), (run_path.as_str(), false)] {
                let r = post(&gw, path, &a, &body).await;
                prop_assert!(
                    r.status.as_u16() == 401 || r.status.as_u16() == 400,
                    "{a:?}: {} {}",
                    r.status,
                    r.body
                );
                check(r.status.as_u16(), &r.body, openai)?;
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
