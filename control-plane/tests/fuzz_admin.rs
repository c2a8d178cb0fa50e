//! Property-based fuzzing of the admin API's JSON bodies (models, configs,
//! visibility, allowlists, accounts, operators, nodes, heartbeats,
//! incidents and their updates, which the status page shows) through the
//! real router, on SQLite and on PostgreSQL: whatever body arrives, the
//! answer is a 2xx or a 4xx in `{"error":{"code","message"}}`, never a
//! 5xx, and the status page still renders afterwards.
//!
//! Cases per route: `PROPTEST_CASES` (24 by default here; each is one
//! router call per route on each backend).

// Tests read their services from the environment (clippy.toml keeps
// library code from it).
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)]

#[macro_use]
mod support;

use axum::http::{Method, StatusCode};
use bulkhead_test_support::fuzz;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};
use support::{SLUG, SLUG_PATH, config, each_backend, node};

fn value() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (0u64..2_000_000).prop_map(Value::from),
        ".{0,30}".prop_map(Value::from),
        prop::sample::select(vec![
            "public",
            "private",
            "prefill",
            "decode",
            "colocated",
            "investigating",
            "identified",
            "monitoring",
            "resolved",
            "major_outage",
            "admin",
            "responder",
            "node",
            "gateway",
            SLUG,
        ])
        .prop_map(Value::from),
    ];
    let tree = fuzz::Tree {
        depth: 3,
        size: 20,
        branch: 4,
        width: 5,
    };
    fuzz::json_tree(leaf.boxed(), field().boxed(), tree)
}

fn field() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "slug",
            "task",
            "description",
            "visibility",
            "reason",
            "config",
            "accounts",
            "name",
            "role",
            "pool_tokens",
            "context_window",
            "max_output",
            "properties",
            "weights_file",
            "weights_sha256",
            "quantization",
            "page_size",
            "kv_budget",
            "parallelism",
            "title",
            "status",
            "impact",
            "body",
            "models",
            "components",
            "message",
            "load",
            "free_pages",
            "total_pages",
            "queue_depth",
            "address",
            "model",
            "account_id",
            "allowed",
        ])
        .prop_map(str::to_owned),
        "[a-z_]{1,10}",
    ]
}

/// Mutations of a valid body (a field replaced, removed or added) and
/// bodies made from scratch.
fn body(valid: Value) -> impl Strategy<Value = Value> {
    let targets = fuzz::own_fields(&valid);
    let mutated = fuzz::mutations(valid, targets, (value(), field().boxed()), false);
    prop_oneof![3 => mutated, 1 => value()]
}

/// An id as the API gives it (a string or a number).
fn id_of(v: &Value) -> String {
    v["id"]
        .as_str()
        .map_or_else(|| v["id"].to_string(), str::to_owned)
}

#[tokio::test]
async fn admin_bodies_get_a_2xx_or_a_4xx_in_the_apis_shape() {
    let cases: u32 = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(24);
    each_backend(|h| async move {
        // Something to act on: a model with a config, a node, an incident.
        h.post("/admin/v1/models", &h.admin, Some(json!({"slug": SLUG, "task": "Text Generation", "description": "d", "visibility": "public"})), StatusCode::CREATED)
        .await?;
        let n = h.register(node("n0", "colocated", 200_000))
            .await?;
        let node_id = id_of(&n["node"]);
        let incident = json!({"name": "x", "impact": "minor", "body": "b"});
        let (status, i) = h.attempt("/admin/v1/incidents", &h.responder, incident.clone())
            .await;
        anyhow::ensure!(status.is_success(), "{status} {i}");
        let incident_id = id_of(&i);
        let (status, a) = h.attempt("/admin/v1/accounts", &h.admin, json!({"name": "acme"}))
            .await;
        anyhow::ensure!(status.is_success(), "{status} {a}");
        let account = id_of(&a);
        let routes: Vec<(String, &str, Value)> = vec![
            ("/admin/v1/models".into(), &h.admin, json!({"slug": SLUG, "task": "t", "description": "d", "visibility": "private"})),
            (format!("/admin/v1/models/{SLUG_PATH}/visibility"), &h.responder, json!({"visibility": "private", "reason": "r"})),
            (format!("/admin/v1/models/{SLUG_PATH}/allowlist"), &h.responder, json!({"account_id": account, "allowed": true, "reason": "r"})),
            (format!("/admin/v1/models/{SLUG_PATH}/configs"), &h.admin, config(2048, 256)),
            ("/admin/v1/accounts".into(), &h.admin, json!({"name": "acme"})),
            ("/admin/v1/operators".into(), &h.admin, json!({"name": "op", "role": "responder"})),
            ("/admin/v1/nodes".into(), &h.node, node("n1", "decode", 100_000)),
            (format!("/admin/v1/nodes/{node_id}/heartbeat"), &h.node, json!({"load": {"free_pages": 100, "total_pages": 159, "queue_depth": 0}})),
            ("/admin/v1/incidents".into(), &h.responder, incident),
            (format!("/admin/v1/incidents/{incident_id}/updates"), &h.responder, json!({"status": "identified", "body": "b"})),
        ];
        let mut runner = TestRunner::new(Config::with_cases(cases));
        let mut seen = std::collections::BTreeMap::<u16, u32>::new();
        for (path, token, valid) in &routes {
            let strategy = body(valid.clone());
            for _ in 0..cases {
                let b = strategy
                    .new_tree(&mut runner)
                    .map_err(|e| anyhow::anyhow!("{e}"))?
                    .current();
                let (status, _, text) = h.raw(Method::POST, path, Some(token), Some(b.clone())).await;
                *seen.entry(status.as_u16()).or_default() += 1;
                anyhow::ensure!(
                    status.is_success() || status.is_client_error(),
                    "POST {path} {b}: {status} {text}"
                );
                if status.is_client_error() {
                    let v: Value = serde_json::from_str(&text)
                        .map_err(|e| anyhow::anyhow!("POST {path} {b}: not JSON ({e}): {text}"))?;
                    anyhow::ensure!(
                        v["error"]["code"].is_string() && v["error"]["message"].is_string(),
                        "POST {path} {b}: {text}"
                    );
                }
            }
        }
        // Mostly refusals, some acceptances: the bodies reach past parsing.
        anyhow::ensure!(seen.keys().any(|s| *s >= 400), "{seen:?}");
        anyhow::ensure!(seen.keys().any(|s| *s < 300), "{seen:?}");
        for page in ["/", "/api/v2/summary.json", "/api/v2/incidents.json", "/history.rss"] {
            let (status, _, text) = h.raw(Method::GET, page, None, None).await;
            anyhow::ensure!(status == StatusCode::OK, "GET {page}: {status} {text}");
        }
        Ok(())
    })
    .await;
}
