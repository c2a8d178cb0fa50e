//! Every gateway route through the real router (`oneshot`), against a real
//! control plane on a socket: both slug encodings, every error in its API's
//! shape, a private model indistinguishable from a missing one, paging, rate
//! limits (in memory, and in Redis shared by two gateways), and a visibility
//! flip acknowledged only after both gateways applied it. No worker runs
//! here, so an admitted request ends in 503 "no worker": that is how these
//! tests tell admitted from refused. Generation itself is tested with a real
//! model in the workspace's `tests/gateway.rs`.

// Tests read their services from the environment (clippy.toml keeps
// library code from it).
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)]

mod support;

use bulkhead_gateway::{Limiter, Limits};
use bulkhead_test_support::json::{items, strings};
use serde_json::{Value, json};
use std::time::Duration;
use support::{OPEN, OPEN_ENCODED, Platform, SECRET, bearer, call, get, platform, post};

const PROMPT: &str = r#"{"prompt": "hello", "max_tokens": 8}"#;

fn chat(model: &str) -> String {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
        .to_string()
}

fn run_path(account: &str, slug: &str) -> String {
    format!("/client/v4/accounts/{account}/ai/run/{slug}")
}

/// [`OPEN`] as the admin API's paths spell it.
const OPEN_ADMIN: &str = "%40cf%2Ftest%2Fopen-model";

fn assert_wa(v: &Value, code: u64) {
    assert_eq!(v["success"], false, "{v}");
    assert_eq!(v["result"], Value::Null, "{v}");
    assert_eq!(v["messages"], json!([]), "{v}");
    assert_eq!(v["errors"][0]["code"], code, "{v}");
    assert!(
        v["errors"][0]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{v}"
    );
}

/// `v` is an error in the format of the API `wa` names: Workers AI's with
/// `wa_code`, or OpenAI's of type `kind` with `code`.
fn assert_api_error(v: &Value, wa: bool, wa_code: u64, (kind, code): (&str, &str)) {
    if wa {
        assert_wa(v, wa_code);
    } else {
        assert_oa(v, kind, &json!(code));
    }
}

fn assert_oa(v: &Value, kind: &str, code: &Value) {
    assert_eq!(v["error"]["type"], kind, "{v}");
    assert_eq!(&v["error"]["code"], code, "{v}");
    assert!(v["error"].get("param").is_some(), "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{v}"
    );
}

#[tokio::test]
async fn routes_slugs_and_errors_in_each_apis_shape() {
    let p = platform().await;
    let gw = p.gateway(None, Platform::limiter()).await;
    let a = bearer(&p.a_token);
    let b = bearer(&p.b_token);

    // Both slug encodings reach the same model (admitted: no worker, 503)...
    for slug in [OPEN, OPEN_ENCODED] {
        let r = post(&gw, &run_path(&p.a, slug), &a, PROMPT).await;
        assert_eq!(r.status, 503, "{slug}: {}", r.body);
        assert_wa(&r.json(), 3040);
    }
    // ...and an unknown model is 400 with code 5007 in both.
    for slug in ["@cf/test/nothing", "@cf%2Ftest%2Fnothing"] {
        let r = post(&gw, &run_path(&p.a, slug), &a, PROMPT).await;
        assert_eq!(r.status, 400, "{slug}");
        assert_wa(&r.json(), 5007);
    }
    // A private model is indistinguishable from a missing one...
    let missing = post(&gw, &run_path(&p.a, "@cf/test/zzzzzz-model"), &a, PROMPT).await;
    let private = post(&gw, &run_path(&p.a, SECRET), &a, PROMPT).await;
    assert_eq!(
        (private.status, missing.status),
        (missing.status, missing.status)
    );
    assert_eq!(
        private.body.replace(SECRET, "SLUG"),
        missing.body.replace("@cf/test/zzzzzz-model", "SLUG"),
        "same status, same body"
    );
    for route in [
        "/v1/chat/completions",
        &format!("/client/v4/accounts/{}/ai/v1/chat/completions", p.a),
    ] {
        let missing = post(&gw, route, &a, &chat("@cf/test/zzzzzz-model")).await;
        let private = post(&gw, route, &a, &chat(SECRET)).await;
        assert_eq!(
            (private.status.as_u16(), missing.status.as_u16()),
            (404, 404),
            "{route}"
        );
        assert_oa(
            &private.json(),
            "invalid_request_error",
            &json!("model_not_found"),
        );
        assert_eq!(
            private.body.replace(SECRET, "SLUG"),
            missing.body.replace("@cf/test/zzzzzz-model", "SLUG")
        );
    }
    let r = get(&gw, &format!("/v1/models/{SECRET}"), &a).await;
    assert_eq!(r.status, 404);
    // ...while the allowlisted account gets through.
    let r = post(&gw, &run_path(&p.b, SECRET), &b, PROMPT).await;
    assert_eq!(r.status, 503, "{}", r.body);
    let r = get(&gw, &format!("/v1/models/{SECRET}"), &b).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["id"], SECRET);

    // A token on another account's URL is 403.
    let r = post(&gw, &run_path(&p.b, OPEN), &a, PROMPT).await;
    assert_eq!(r.status, 403);
    assert_wa(&r.json(), 10000);

    // Bad input, in each shape.
    let wa_bad = [
        "",
        "{",
        r#"{"max_tokens": 8}"#,
        r#"{"prompt": "x", "messages": [{"role": "user", "content": "y"}]}"#,
        r#"{"prompt": ""}"#,
        r#"{"prompt": "x", "temperature": 9}"#,
        r#"{"prompt": "x", "top_k": 0}"#,
        r#"{"prompt": "x", "seed": 0}"#,
        r#"{"prompt": "x", "max_tokens": 0}"#,
        r#"{"prompt": "x", "max_tokens": "many"}"#,
        r#"{"messages": [{"role": "wizard", "content": "y"}]}"#,
        r#"{"messages": []}"#,
        r#"{"prompt": "x", "max_tokens": 100000}"#,
    ];
    for body in wa_bad {
        let r = post(&gw, &run_path(&p.a, OPEN), &a, body).await;
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert_wa(&r.json(), 5006);
    }
    let oa_bad = [
        r#"{"messages": [{"role": "user", "content": "hi"}]}"#.to_owned(),
        json!({"model": OPEN, "messages": []}).to_string(),
        json!({"model": OPEN, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}).to_string(),
        json!({"model": OPEN, "messages": [{"role": "user", "content": "hi"}], "temperature": 3}).to_string(),
        json!({"model": OPEN, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000}).to_string(),
        json!({"model": OPEN, "messages": [{"role": "user", "content": "hi"}], "n": 9}).to_string(),
        json!({"model": OPEN, "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}).to_string(),
        json!({"model": OPEN, "messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 21}).to_string(),
        json!({"model": OPEN, "messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "yaml"}}).to_string(),
        // A stop string past its stated length.
        json!({"model": OPEN, "messages": [{"role": "user", "content": "hi"}], "stop": "s".repeat(1025)}).to_string(),
        json!({"model": OPEN, "messages": [{"role": "user", "content": "hi"}],
               "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "required": ["a"]}}}}).to_string(),
        "not json".to_owned(),
    ];
    // A completion prompt of token ids (as OpenAI's API takes one) is
    // admitted (no worker here: 503); ids that are not token ids are not.
    let ids = json!({"model": OPEN, "prompt": [1000, 1001, 1002], "max_tokens": 4});
    let r = post(&gw, "/v1/completions", &a, &ids.to_string()).await;
    assert_eq!(r.status, 503, "{}", r.body);
    for prompt in [
        json!([1000, -1]),
        json!([1000, "x"]),
        json!([4_294_967_296u64]),
        json!([]),
    ] {
        let body = json!({"model": OPEN, "prompt": prompt, "max_tokens": 4});
        let r = post(&gw, "/v1/completions", &a, &body.to_string()).await;
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert_oa(&r.json(), "invalid_request_error", &Value::Null);
    }
    for body in &oa_bad {
        let r = post(&gw, "/v1/chat/completions", &a, body).await;
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert_oa(&r.json(), "invalid_request_error", &Value::Null);
    }
    // What Bulkhead does not do is refused by name, never ignored.
    let msgs = json!([{"role": "user", "content": "hi"}]);
    for (extra, param) in [
        (json!({"n": 2, "stream": true}), "n"),
        // Tools: a schema that cannot be enforced, a kind of tool that is
        // not served, and settings that cannot go with tools.
        (
            json!({"tools": [{"type": "function", "function": {"name": "f",
                   "parameters": {"type": "object", "properties": {"a": {"oneOf": []}}}}}]}),
            "tools",
        ),
        (json!({"tools": [{"type": "file_search"}]}), "tools[0].type"),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f"}}], "logprobs": true}),
            "logprobs",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                   "schema": {"type": "string", "pattern": "^a+$"}}}}),
            "response_format",
        ),
        // A property name past its stated size (its per-token cost is
        // bounded, its size too).
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                   "schema": {"type": "object", "properties": {"k".repeat(60_000): {"type": "string"}}}}}}),
            "response_format",
        ),
        (json!({"presence_penalty": 1.5}), "presence_penalty"),
        // Tiers not served are refused by name; `flex` is served.
        (json!({"service_tier": "priority"}), "service_tier"),
        (json!({"max_tokns": 8}), "max_tokns"),
    ] {
        let mut body = json!({"model": OPEN, "messages": msgs});
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        let r = post(&gw, "/v1/chat/completions", &a, &body.to_string()).await;
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        let v = r.json();
        assert_eq!(v["error"]["code"], "unsupported_parameter", "{v}");
        assert_eq!(v["error"]["param"], param, "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains(param),
            "{v}"
        );
    }
    let r = post(
        &gw,
        &run_path(&p.a, OPEN),
        &a,
        &json!({"prompt": "x", "response_format": {"type": "json_schema",
                     "json_schema": {"type": "object", "properties": {"a": {"anyOf": []}}}}})
        .to_string(),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_wa(&r.json(), 5006);
    assert!(r.body.contains("'response_format'"), "{}", r.body);
    assert!(
        r.body.contains("`anyOf`"),
        "the keyword is named: {}",
        r.body
    );
    // Workers AI's `tools` follow the same rule: what cannot be enforced
    // is refused by name.
    let tools = json!({"prompt": "x", "tools": [{"name": "w", "description": "d",
        "parameters": {"type": "object", "properties": {"a": {"allOf": []}}}}]});
    let r = post(&gw, &run_path(&p.a, OPEN), &a, &tools.to_string()).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_wa(&r.json(), 5006);
    assert!(r.body.contains("'tools'"), "{}", r.body);
    assert!(r.body.contains("`allOf`"), "{}", r.body);
    // Tool settings that make no sense are bad input: a choice without
    // tools, a function not among them, a tool message answering no call.
    for extra in [
        json!({"tool_choice": "required"}),
        json!({"tools": [{"type": "function", "function": {"name": "f"}}],
               "tool_choice": {"type": "function", "function": {"name": "g"}}}),
        json!({"messages": [{"role": "tool", "content": "42"}]}),
        json!({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}),
    ] {
        let mut body = json!({"model": OPEN, "messages": msgs});
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        let r = post(&gw, "/v1/chat/completions", &a, &body.to_string()).await;
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert_oa(&r.json(), "invalid_request_error", &Value::Null);
    }
    // Defaults a client library sends explicitly ask for nothing: admitted.
    let defaults = json!({"model": OPEN, "messages": msgs, "n": 1, "user": "u-1", "logprobs": false,
                          "frequency_penalty": 0, "presence_penalty": 0, "tools": null,
                          "response_format": {"type": "text"}, "stream": false});
    let r = post(&gw, "/v1/chat/completions", &a, &defaults.to_string()).await;
    assert_eq!(r.status, 503, "admitted: {}", r.body);
    // Conversations that went through a call are admitted on both APIs: an
    // assistant message with no text and its calls (OpenAI's shape;
    // Workers AI's flat one), then the tool's result.
    let weather = json!({"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}});
    let openai = json!({"model": OPEN, "tools": [{"type": "function", "function": weather}],
        "messages": [{"role": "user", "content": "w?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]});
    let r = post(&gw, "/v1/chat/completions", &a, &openai.to_string()).await;
    assert_eq!(r.status, 503, "admitted: {}", r.body);
    let flat = json!({"tools": [weather],
        "messages": [{"role": "user", "content": "w?"},
            {"role": "assistant", "content": null,
             "tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]},
            {"role": "tool", "name": "get_weather", "content": "sunny"}]});
    let r = post(&gw, &run_path(&p.a, OPEN), &a, &flat.to_string()).await;
    assert_eq!(r.status, 503, "admitted: {}", r.body);
    for tier in ["flex", "auto", "default"] {
        let body = json!({"model": OPEN, "messages": msgs, "service_tier": tier});
        let r = post(&gw, "/v1/chat/completions", &a, &body.to_string()).await;
        assert_eq!(r.status, 503, "admitted: {}", r.body);
    }
    let r = post(
        &gw,
        "/v1/completions",
        &a,
        &json!({"model": OPEN}).to_string(),
    )
    .await;
    assert_eq!(r.status, 400);
    let r = post(
        &gw,
        "/v1/completions",
        &a,
        &json!({"model": OPEN, "prompt": "x"}).to_string(),
    )
    .await;
    assert_eq!(r.status, 503, "admitted: {}", r.body);

    // Missing token: 401 in both shapes, with WWW-Authenticate.
    let r = call(&gw, "POST", &run_path(&p.a, OPEN), None, Some(PROMPT)).await;
    assert_eq!(r.status, 401);
    assert_wa(&r.json(), 10000);
    let r = call(&gw, "POST", "/v1/chat/completions", None, Some(&chat(OPEN))).await;
    assert_eq!(r.status, 401);
    assert_oa(&r.json(), "authentication_error", &json!("invalid_api_key"));

    // Unknown routes answer in the prefix's shape.
    let r = get(&gw, &format!("/client/v4/accounts/{}/ai/nothing", p.a), &a).await;
    assert_eq!(r.status, 404);
    assert_wa(&r.json(), 7000);
    let r = get(&gw, "/v1/nothing", &a).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
}

#[tokio::test]
async fn models_list_and_search_page_like_the_sdks_expect() {
    let p = platform().await;
    let gw = p.gateway(None, Platform::limiter()).await;
    let (a, b) = (bearer(&p.a_token), bearer(&p.b_token));
    let r = get(&gw, "/v1/models", &a).await;
    let v = r.json();
    assert_eq!(v["object"], "list");
    let ids: Vec<&str> = strings(&v["data"], "id");
    assert_eq!(ids, vec![OPEN], "A does not see the private model");
    let m = &v["data"][0];
    assert_eq!(
        (m["object"].as_str(), m["owned_by"].as_str()),
        (Some("model"), Some("test"))
    );
    assert!(m["created"].as_u64().is_some_and(|c| c > 1_700_000_000));
    let r = get(&gw, "/v1/models", &b).await;
    assert_eq!(r.json()["data"].as_array().map(Vec::len), Some(2));

    let search = |acct: &str, q: &str| format!("/client/v4/accounts/{acct}/ai/models/search{q}");
    let r = get(&gw, &search(&p.b, "?per_page=1&page=1"), &b).await;
    let v = r.json();
    assert_eq!(v["success"], true);
    assert_eq!(v["result"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        v["result_info"],
        json!({"page": 1, "per_page": 1, "count": 1, "total_count": 2})
    );
    let item = &v["result"][0];
    assert_eq!(item["name"], OPEN);
    assert_eq!(item["task"]["name"], "Text Generation");
    assert_eq!(
        item["properties"][0],
        json!({"property_id": "context_window", "value": "2048"})
    );
    let r = get(&gw, &search(&p.b, "?per_page=1&page=2"), &b).await;
    assert_eq!(r.json()["result"][0]["name"], SECRET);
    let r = get(&gw, &search(&p.b, "?per_page=1&page=3"), &b).await;
    assert_eq!(
        r.json()["result"],
        json!([]),
        "a page past the end is empty, so the SDK stops"
    );
    let r = get(&gw, &search(&p.b, "?search=secret"), &b).await;
    assert_eq!(r.json()["result_info"]["total_count"], 1);
    let r = get(&gw, &search(&p.b, "?task=Text%20Generation"), &b).await;
    assert_eq!(r.json()["result_info"]["total_count"], 2);
    let r = get(&gw, &search(&p.b, "?task=Translation"), &b).await;
    assert_eq!(r.json()["result"], json!([]));
    let r = get(&gw, &search(&p.a, "?search=secret"), &a).await;
    assert_eq!(
        r.json()["result"],
        json!([]),
        "private models do not show up in search"
    );
    for q in ["?page=0", "?per_page=1000", "?page=x"] {
        let r = get(&gw, &search(&p.a, q), &a).await;
        assert_eq!(r.status, 400, "{q}");
        assert_wa(&r.json(), 5006);
    }
}

#[tokio::test]
async fn per_account_limits_answer_429_with_retry_after() {
    let p = platform().await;
    let limiter = Limiter::memory(Limits {
        requests_per_minute: 2,
        tokens_per_minute: 1_000_000,
        concurrency: 10,
    });
    let gw = p.gateway(None, limiter).await;
    let a = bearer(&p.a_token);
    // OpenAI's x-ratelimit-* headers on every answer the limiter decided.
    let reset = |r: &support::Reply| {
        let secs = |k: &str| {
            r.ratelimit
                .get(k)
                .and_then(|v| v.strip_suffix('s'))
                .map(|v| match v.split_once('m') {
                    Some((m, s)) => m
                        .parse::<u64>()
                        .ok()
                        .zip(s.parse::<u64>().ok())
                        .map(|(m, s)| m * 60 + s),
                    None => v.parse::<u64>().ok(),
                })
        };
        assert_eq!(
            secs("reset-requests"),
            secs("reset-tokens"),
            "{:?}",
            r.ratelimit
        );
        secs("reset-requests")
            .flatten()
            .filter(|s| (1..=60).contains(s))
    };
    for left in ["1", "0"] {
        let r = post(&gw, &run_path(&p.a, OPEN), &a, PROMPT).await;
        assert_eq!(r.status, 503);
        assert_eq!(r.ratelimit["limit-requests"], "2", "{:?}", r.ratelimit);
        assert_eq!(r.ratelimit["remaining-requests"], left, "{:?}", r.ratelimit);
        assert_eq!(r.ratelimit["limit-tokens"], "1000000", "{:?}", r.ratelimit);
        let tokens: u64 = r.ratelimit["remaining-tokens"].parse().expect("a number");
        assert!(
            tokens < 1_000_000,
            "the request's tokens were counted: {tokens}"
        );
        assert!(reset(&r).is_some(), "{:?}", r.ratelimit);
    }
    let r = post(&gw, &run_path(&p.a, OPEN), &a, PROMPT).await;
    assert_eq!(r.status, 429);
    assert_wa(&r.json(), 3036);
    assert_eq!(r.ratelimit["remaining-requests"], "0", "{:?}", r.ratelimit);
    assert!(reset(&r).is_some(), "{:?}", r.ratelimit);
    // A request the limiter never saw (refused at the door) has none.
    let stranger = call(&gw, "POST", &run_path(&p.a, OPEN), None, Some(PROMPT)).await;
    assert_eq!(stranger.status, 401);
    assert!(stranger.ratelimit.is_empty(), "{:?}", stranger.ratelimit);
    assert!(
        r.retry_after
            .as_deref()
            .and_then(|s| s.parse::<u64>().ok())
            .is_some_and(|s| (1..=60).contains(&s))
    );
    let r = post(&gw, "/v1/chat/completions", &a, &chat(OPEN)).await;
    assert_eq!(r.status, 429);
    assert_oa(&r.json(), "rate_limit_error", &json!("rate_limit_exceeded"));
    // File calls count against the same limits: they reach the control
    // plane's database no faster than requests reach a model.
    let r = call(&gw, "GET", "/v1/files", Some(&a), None).await;
    assert_eq!(r.status, 429, "{}", r.body);
    assert_oa(&r.json(), "rate_limit_error", &json!("rate_limit_exceeded"));
    // Another account has its own budget.
    let r = post(&gw, &run_path(&p.b, OPEN), &bearer(&p.b_token), PROMPT).await;
    assert_eq!(r.status, 503);
}

/// A request the budget refuses moves no rate-limit counter: after any
/// number of budget refusals, the first admitted request finds the
/// account's per-minute requests untouched.
#[tokio::test]
async fn a_budget_refusal_moves_no_rate_limit_counter() {
    let p = platform().await;
    let budget = |daily: u64| json!({"daily_neurons": daily, "free_neurons_per_day": 0, "reason": "router test"});
    // No request fits a daily budget of nothing.
    p.admin(
        "PUT",
        &format!("/admin/v1/accounts/{}/budget", p.a),
        Some(budget(0)),
    )
    .await;
    let limits = Limits {
        requests_per_minute: 2,
        tokens_per_minute: 1_000_000,
        concurrency: 10,
    };
    let gw = p.gateway(None, Limiter::memory(limits)).await;
    let (a, path) = (bearer(&p.a_token), run_path(&p.a, OPEN));
    for _ in 0..5 {
        let r = post(&gw, &path, &a, PROMPT).await;
        assert_eq!(r.status, 429);
        let v = r.json();
        assert!(
            v["errors"][0]["message"]
                .as_str()
                .is_some_and(|m| m.contains("budget")),
            "refused by the budget: {v}"
        );
        assert!(
            r.ratelimit.is_empty(),
            "the limiter never saw it: {:?}",
            r.ratelimit
        );
    }
    // A budget that fits: the first admitted request (no worker runs here,
    // so 503) is the first the limiter counts.
    p.admin(
        "PUT",
        &format!("/admin/v1/accounts/{}/budget", p.a),
        Some(budget(1_000_000)),
    )
    .await;
    let until = std::time::Instant::now() + Duration::from_secs(20);
    let admitted = loop {
        let r = post(&gw, &path, &a, PROMPT).await;
        if r.status == 503 {
            break r;
        }
        assert_eq!(r.status, 429, "{}", r.json());
        assert!(std::time::Instant::now() < until, "the budget never rose");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        admitted.ratelimit["remaining-requests"], "1",
        "budget refusals took no request of the minute: {:?}",
        admitted.ratelimit
    );
}

fn redis_url() -> Option<String> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let reachable = url
        .strip_prefix("redis://")
        .and_then(|rest| rest.split('/').next())
        .is_some_and(|hp| {
            std::net::TcpStream::connect_timeout(
                &hp.parse()
                    .unwrap_or_else(|_| "127.0.0.1:6379".parse().expect("addr")),
                Duration::from_secs(1),
            )
            .is_ok()
        });
    if reachable {
        return Some(url);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true but Redis at {url} is unreachable"
    );
    eprintln!("note: Redis at {url} unreachable; the shared rate-limit test is skipped outside CI");
    None
}

#[tokio::test]
async fn a_redis_rate_limit_holds_across_two_gateways() {
    let Some(url) = redis_url() else { return };
    let p = platform().await;
    let limits = Limits {
        requests_per_minute: 3,
        tokens_per_minute: 1_000_000,
        concurrency: 10,
    };
    let prefix = support::unique("bulkhead-test-rl");
    let g1 = p
        .gateway(
            None,
            Limiter::redis(limits, &url, &prefix).await.expect("redis"),
        )
        .await;
    let g2 = p
        .gateway(
            None,
            Limiter::redis(limits, &url, &prefix).await.expect("redis"),
        )
        .await;
    let a = bearer(&p.a_token);
    let path = run_path(&p.a, OPEN);
    // The windows are calendar minutes: start well inside one, so all five
    // requests fall in the same window and the budget is exact.
    let into_minute = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        % 60;
    if into_minute > 45 {
        tokio::time::sleep(Duration::from_secs(61 - into_minute)).await;
    }
    let mut outcomes = Vec::new();
    let mut remaining = Vec::new();
    for g in [&g1, &g2, &g1, &g2, &g1] {
        let r = post(g, &path, &a, PROMPT).await;
        remaining.push(
            r.ratelimit
                .get("remaining-requests")
                .cloned()
                .unwrap_or_default(),
        );
        let v = r.json();
        let message = v["errors"][0]["message"].as_str().unwrap_or("").to_owned();
        // Admitted requests find no worker (this test runs none); a store
        // failure is also a 503, but says so.
        let outcome = match (r.status.as_u16(), v["errors"][0]["code"].as_u64()) {
            (503, Some(3040)) if message.contains("no worker") => "admitted",
            (429, Some(3036)) => "limited",
            _ => panic!("unexpected answer {}: {v}", r.status),
        };
        outcomes.push(outcome);
    }
    assert_eq!(
        outcomes,
        ["admitted", "admitted", "admitted", "limited", "limited"],
        "exactly the budget of 3 passes, across both gateways"
    );
    // Both gateways tell the client the shared count.
    assert_eq!(remaining, ["2", "1", "0", "0", "0"]);
    // The counter the gateways shared is in Redis, and holds the budget.
    let client = redis::Client::open(url.as_str()).expect("redis url");
    let mut con = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*:req"))
        .query_async(&mut con)
        .await
        .expect("KEYS");
    assert_eq!(keys.len(), 1, "one request window in Redis: {keys:?}");
    let count: u64 = redis::cmd("GET")
        .arg(&keys[0])
        .query_async(&mut con)
        .await
        .expect("GET");
    assert_eq!(count, 3, "Redis counted the three admitted requests");
}

#[tokio::test]
async fn a_private_flip_is_acknowledged_after_both_gateways_apply_it_and_nothing_is_admitted_after()
{
    let p = platform().await;
    let g1 = p.gateway(None, Platform::limiter()).await;
    let g2 = p.gateway(None, Platform::limiter()).await;
    let a = bearer(&p.a_token);
    let path = run_path(&p.a, OPEN);
    for g in [&g1, &g2] {
        assert_eq!(
            post(g, &path, &a, PROMPT).await.status,
            503,
            "admitted before"
        );
    }
    // Let both gateways settle into their long polls.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = std::time::Instant::now();
    let change = format!("/admin/v1/models/{OPEN_ADMIN}/visibility");
    let v = p
        .admin(
            "POST",
            &change,
            Some(json!({"visibility": "private", "reason": "drill"})),
        )
        .await;
    let flip_ms = started.elapsed().as_millis();
    assert_eq!(v["propagation"]["gateways"], 2, "{v}");
    assert_eq!(v["propagation"]["applied"], 2, "{v}");
    eprintln!("flip applied by both gateways in {flip_ms} ms");
    // From the acknowledgement on, no request for the model is admitted on either gateway.
    let mut refused = 0;
    for i in 0..40 {
        let g = if i % 2 == 0 { &g1 } else { &g2 };
        let r = post(g, &path, &a, PROMPT).await;
        assert_eq!(r.status, 400, "request {i}: {}", r.body);
        assert_wa(&r.json(), 5007);
        let r = post(g, "/v1/chat/completions", &a, &chat(OPEN)).await;
        assert_eq!(r.status, 404, "request {i}");
        refused += 2;
    }
    assert_eq!(refused, 80);
    // The allowlist still lets an account in.
    let change = format!("/admin/v1/models/{OPEN_ADMIN}/allowlist");
    let v = p
        .admin(
            "POST",
            &change,
            Some(json!({"account_id": p.a, "allowed": true, "reason": "verifies the fix"})),
        )
        .await;
    assert_eq!(v["propagation"]["applied"], 2, "{v}");
    for g in [&g1, &g2] {
        assert_eq!(post(g, &path, &a, PROMPT).await.status, 503);
    }
}

#[tokio::test]
async fn a_gateway_cut_off_from_the_control_plane_stops_admitting_within_the_lease() {
    let p = platform().await;
    let gw = p.gateway(None, Platform::limiter()).await;
    let a = bearer(&p.a_token);
    let path = run_path(&p.a, OPEN);
    assert_eq!(post(&gw, &path, &a, PROMPT).await.status, 503);
    assert_eq!(get(&gw, "/v1/models", &a).await.status, 200);
    p.stop_control_plane();
    // The lease is 3 s; the last poll may have been sent up to a second ago.
    let poll = (Duration::from_millis(100), Duration::from_millis(3600));
    let (r, took) = until_status(&gw, &a, 503, poll, "still serving after the lease").await;
    assert_oa(&r.json(), "service_unavailable", &Value::Null);
    assert!(
        took >= Duration::from_millis(1500),
        "not before the lease ran out"
    );
    let r = post(&gw, &path, &a, PROMPT).await;
    assert_eq!(r.status, 503);
    assert_wa(&r.json(), 3040);
    let r = call(&gw, "GET", "/health", None, None).await;
    assert_eq!(r.status, 503);
}

#[tokio::test]
async fn a_token_revoked_while_gateways_run_stops_working_at_once() {
    let p = platform().await;
    let gw = p.gateway(None, Platform::limiter()).await;
    let a = bearer(&p.a_token);
    assert_eq!(get(&gw, "/v1/models", &a).await.status, 200);
    let tokens = p
        .admin("GET", &format!("/admin/v1/accounts/{}/tokens", p.a), None)
        .await;
    let id = items(&tokens)
        .find(|t| t["name"] == "main")
        .and_then(|t| t["id"].as_i64())
        .expect("token id");
    let token = format!("/admin/v1/accounts/{}/tokens/{id}", p.a);
    p.admin("DELETE", &token, None).await;
    let poll = (Duration::from_millis(20), Duration::from_secs(1));
    until_status(&gw, &a, 401, poll, "the revoked token still works").await;
    // B's token is untouched.
    assert_eq!(
        get(&gw, "/v1/models", &bearer(&p.b_token)).await.status,
        200
    );
}

/// Polls `GET /v1/models` with `auth` every `every` until it answers
/// `status`; fails with `what` when that takes `limit` or longer. The
/// answer, and how long it took.
async fn until_status(
    gw: &axum::Router,
    auth: &str,
    status: u16,
    (every, limit): (Duration, Duration),
    what: &str,
) -> (support::Reply, Duration) {
    let started = std::time::Instant::now();
    loop {
        let r = get(gw, "/v1/models", auth).await;
        if r.status == status {
            return (r, started.elapsed());
        }
        assert!(started.elapsed() < limit, "{what}");
        tokio::time::sleep(every).await;
    }
}

/// A request whose body never ends: a handler that read it would wait forever.
fn endless_body() -> axum::body::Body {
    let first = futures_once(bytes_of(b"{\"prompt\": \""));
    axum::body::Body::from_stream(first)
}

fn bytes_of(b: &'static [u8]) -> Result<axum::body::Bytes, std::io::Error> {
    Ok(axum::body::Bytes::from_static(b))
}

/// One chunk, then a stream that never yields again.
fn futures_once(
    chunk: Result<axum::body::Bytes, std::io::Error>,
) -> impl tokio_stream::Stream<Item = Result<axum::body::Bytes, std::io::Error>> {
    use tokio_stream::StreamExt;
    tokio_stream::once(chunk).chain(tokio_stream::pending())
}

#[tokio::test]
async fn strangers_and_oversized_bodies_are_refused_before_the_body_is_read_in_each_apis_shape() {
    use tower::ServiceExt;
    let p = platform().await;
    let gw = p.gateway(None, Platform::limiter()).await;
    let a = bearer(&p.a_token);
    let send = |req: axum::http::Request<axum::body::Body>| {
        let gw = gw.clone();
        async move {
            let resp = tokio::time::timeout(Duration::from_secs(5), gw.oneshot(req))
                .await
                .expect("answered without reading the body")
                .expect("router");
            let status = resp.status().as_u16();
            let bytes = http_body_util::BodyExt::collect(resp.into_body())
                .await
                .expect("body")
                .to_bytes();
            let v: Value = serde_json::from_slice(&bytes).expect("a JSON error body");
            (status, v)
        }
    };
    let wa_path = run_path(&p.a, OPEN);
    for (path, wa) in [(wa_path.as_str(), true), ("/v1/chat/completions", false)] {
        // No credential, a body that never ends: refused at once.
        let req = axum::http::Request::post(path)
            .header("content-type", "application/json")
            .body(endless_body())
            .expect("request");
        let (status, v) = send(req).await;
        assert_eq!(status, 401, "{v}");
        assert_api_error(&v, wa, 10000, ("authentication_error", "invalid_api_key"));
        // A declared 50 MiB body: 413 from the header alone.
        let req = axum::http::Request::post(path)
            .header("authorization", &a)
            .header("content-type", "application/json")
            .header("content-length", (50u64 << 20).to_string())
            .body(endless_body())
            .expect("request");
        let (status, v) = send(req).await;
        assert_eq!(status, 413, "{v}");
        assert_api_error(&v, wa, 3006, ("invalid_request_error", "request_too_large"));
        // An undeclared body past the limit: 413 in the same shape.
        let big = format!("{{\"prompt\": \"{}\"}}", "x".repeat(3 << 20));
        let req = axum::http::Request::post(path)
            .header("authorization", &a)
            .header("content-type", "application/json")
            .body(axum::body::Body::from_stream(tokio_stream::iter(
                big.into_bytes()
                    .chunks(64 << 10)
                    .map(|c| Ok::<_, std::io::Error>(axum::body::Bytes::copy_from_slice(c)))
                    .collect::<Vec<_>>(),
            )))
            .expect("request");
        let (status, v) = send(req).await;
        assert_eq!(status, 413, "{v}");
        // A method the route does not take: 405 in the API's shape.
        let req = axum::http::Request::delete(path)
            .header("authorization", &a)
            .body(axum::body::Body::empty())
            .expect("request");
        let (status, v) = send(req).await;
        assert_eq!(status, 405, "{v}");
        assert_api_error(
            &v,
            wa,
            7001,
            ("invalid_request_error", "method_not_allowed"),
        );
    }
}

#[tokio::test]
async fn after_a_redis_flush_a_spent_budget_still_refuses() {
    let Some(url) = redis_url() else { return };
    let p = platform().await;
    // Alpha has spent 5.58 neurons today, per the ledger (2,000 prompt and
    // 2,000 output tokens at 330 and 2,460 neurons per million).
    let now = bulkhead_control_api::Timestamp::now();
    let spent = bulkhead_control_api::UsageEvent {
        call_id: support::unique("spent"),
        account_id: p.a.clone(),
        model: OPEN.parse().expect("slug"),
        prompt_tokens: 2_000,
        completion_tokens: 2_000,
        context: String::new(),
        finish: "stop".to_owned(),
        at: now,
    };
    let mut conn = p.db.pool().acquire().await.expect("connection");
    bulkhead_control_plane::store::usage::record(&mut conn, "worker", &[spent])
        .await
        .expect("recorded");
    drop(conn);
    let client = bulkhead_control_api::Client::with_identity(
        &bulkhead_control_api::Credentials {
            control_plane_url: p.url.clone(),
            operator_token: p.gateway_token.clone(),
        },
        &support::identity(bulkhead_trust::Role::Gateway),
    )
    .expect("client");
    let budget = bulkhead_control_api::Budget {
        daily_neurons: Some(5),
        monthly_neurons: None,
        free_neurons_per_day: 0,
    };
    let prefix = support::unique("bulkhead-test-budget");
    let budgets = bulkhead_gateway::Budgets::redis_from_ledger(&url, &prefix, client)
        .await
        .expect("redis");
    let over = |r: Result<bulkhead_gateway::Reservation, bulkhead_gateway::BudgetError>| {
        matches!(r, Err(bulkhead_gateway::BudgetError::Over { .. }))
    };
    assert!(
        over(budgets.reserve(&p.a, &budget, 1, now).await),
        "spent per the ledger"
    );
    // The flush: every counter under the prefix is gone.
    let redis = redis::Client::open(url.as_str()).expect("redis url");
    let mut con = redis
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection");
    let flush = async |con: &mut redis::aio::MultiplexedConnection| -> usize {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}:*"))
            .query_async(con)
            .await
            .expect("KEYS");
        for k in &keys {
            let _: i64 = redis::cmd("DEL")
                .arg(k)
                .query_async(con)
                .await
                .expect("DEL");
        }
        keys.len()
    };
    assert_eq!(
        flush(&mut con).await,
        2,
        "the day's and the month's counters were flushed"
    );
    assert!(
        over(budgets.reserve(&p.a, &budget, 1, now).await),
        "a flushed counter is rebuilt from the ledger before it admits"
    );
    // Counters that start from nothing (what a flush did before) would
    // have admitted it.
    assert_eq!(flush(&mut con).await, 2);
    let forgetful = bulkhead_gateway::Budgets::redis(&url, &prefix)
        .await
        .expect("redis");
    let admitted = forgetful.reserve(&p.a, &budget, 1, now).await;
    assert!(admitted.is_ok(), "{admitted:?}");
    if let Ok(r) = admitted {
        r.settle(0);
    }
    flush(&mut con).await;
}
