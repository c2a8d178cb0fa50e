//! Prices and budgets on SQLite and on PostgreSQL: a config's price prices
//! each usage event exactly when it is recorded (a price change applies to
//! what is recorded after it); an admin sets an account's budgets and free
//! allowance (audited, carried in the routing table the gateways read),
//! and bad values are refused in the API's own error format.

#[macro_use]
mod support;

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use support::{Harness, SLUG, SLUG_PATH, config};

async fn priced_model(h: &Harness, input: u64, output: u64) -> anyhow::Result<()> {
    let mut spec = config(8192, 512);
    spec["price"] = json!({"input_neurons_per_mtok": input, "output_neurons_per_mtok": output});
    h.post(
        "/admin/v1/models",
        &h.admin,
        Some(
            json!({"slug": SLUG, "task": "Text Generation", "description": "SmolLM2",
                    "visibility": "public", "config": spec}),
        ),
        StatusCode::CREATED,
    )
    .await?;
    Ok(())
}

async fn account(h: &Harness) -> anyhow::Result<String> {
    let a = h.create_account("acme").await?;
    // A new account: no budget, Workers AI's free allowance.
    assert_eq!(
        a["budget"],
        json!({"daily_neurons": null, "monthly_neurons": null, "free_neurons_per_day": 10000})
    );
    Ok(a["id"].as_str().unwrap_or_default().to_owned())
}

fn event(call: &str, account: &str, prompt: u64, completion: u64) -> Value {
    json!({"call_id": call, "account_id": account, "model": SLUG, "prompt_tokens": prompt,
           "completion_tokens": completion, "finish": "stop",
           "context": support::signed_call(call, account, SLUG), "at": "2026-12-01T10:00:00Z"})
}

async fn micro_neurons(h: &Harness, account: &str) -> anyhow::Result<Value> {
    let path = format!("/admin/v1/usage?account={account}&since=2026-12-01&until=2026-12-01");
    let rows = h.get(&path, &h.responder).await?;
    Ok(rows[0]["micro_neurons"].clone())
}

backend_test!(
    usage_is_priced_exactly_at_the_price_in_force_when_recorded,
    |h| {
        priced_model(&h, 2_457, 18_252).await?;
        let id = account(&h).await?;
        let report = |events: Vec<Value>| {
            h.post(
                "/admin/v1/usage",
                &h.node,
                Some(json!({"events": events})),
                StatusCode::OK,
            )
        };
        report(vec![event("p1", &id, 1_000, 10), event("p2", &id, 7, 3)]).await?;
        let first = 1_007 * 2_457 + 13 * 18_252;
        assert_eq!(micro_neurons(&h, &id).await?, json!(first));
        // The routing table carries the price to the gateways.
        let table = h.get("/admin/v1/routing?gateway=g1", &h.gateway).await?;
        assert_eq!(
            table["models"][0]["price"],
            json!({"input_neurons_per_mtok": 2457, "output_neurons_per_mtok": 18252})
        );
        // A new price applies to what is recorded after it.
        let path = format!("/admin/v1/models/{SLUG_PATH}/configs");
        let mut spec = config(8192, 512);
        spec["price"] = json!({"input_neurons_per_mtok": 1, "output_neurons_per_mtok": 2});
        h.add_config(spec).await?;
        h.activate_ok(2, Some(json!({"reason": "cheaper"}))).await?;
        report(vec![event("p3", &id, 100, 100), event("p1", &id, 9, 9)]).await?;
        assert_eq!(micro_neurons(&h, &id).await?, json!(first + 100 + 200));
        // An absurd price is refused.
        let mut spec = config(8192, 512);
        spec["price"] =
            json!({"input_neurons_per_mtok": 2_000_000_000u64, "output_neurons_per_mtok": 0});
        let (code, v) = h.attempt(&path, &h.admin, spec).await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains("price"),
            "{v}"
        );
        Ok(())
    }
);

backend_test!(admins_set_budgets_audited_and_the_gateways_see_them, |h| {
    let id = account(&h).await?;
    let path = format!("/admin/v1/accounts/{id}/budget");
    let set = json!({"daily_neurons": 500, "monthly_neurons": 9000,
                     "free_neurons_per_day": 100, "reason": "trial"});
    let a = h
        .ok(
            Method::PUT,
            &path,
            &h.admin,
            Some(set.clone()),
            StatusCode::OK,
        )
        .await?;
    assert_eq!(
        a["budget"],
        json!({"daily_neurons": 500, "monthly_neurons": 9000, "free_neurons_per_day": 100})
    );
    let table = h.get("/admin/v1/routing?gateway=g1", &h.gateway).await?;
    let routed = table["accounts"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["id"] == id.as_str()).cloned())
        .unwrap_or_default();
    assert_eq!(routed["budget"], a["budget"], "{table}");
    let audit = h.get("/admin/v1/audit?limit=1", &h.responder).await?;
    assert_eq!(audit[0]["action"], "account.budget");
    assert_eq!(audit[0]["subject"], id.as_str());
    assert_eq!(audit[0]["reason"], "trial");
    assert_eq!(
        audit[0]["before"],
        "daily=unlimited monthly=unlimited free_per_day=10000"
    );
    assert_eq!(audit[0]["after"], "daily=500 monthly=9000 free_per_day=100");
    // Absent budgets are unlimited again.
    let a = h
        .ok(
            Method::PUT,
            &path,
            &h.admin,
            Some(json!({"reason": "paid"})),
            StatusCode::OK,
        )
        .await?;
    assert_eq!(a["budget"]["daily_neurons"], Value::Null);
    // Bad requests, in the API's error format.
    for (path, body, code) in [
        (
            path.clone(),
            json!({"daily_neurons": 5}),
            StatusCode::BAD_REQUEST,
        ),
        (
            path.clone(),
            json!({"daily_neurons": -1, "reason": "x"}),
            StatusCode::BAD_REQUEST,
        ),
        (
            path.clone(),
            json!({"daily_neurons": 5, "reason": " "}),
            StatusCode::BAD_REQUEST,
        ),
        (
            path.clone(),
            json!({"monthly_neurons": 1u64 << 62, "reason": "x"}),
            StatusCode::BAD_REQUEST,
        ),
        (
            path.clone(),
            json!({"weekly": 5, "reason": "x"}),
            StatusCode::BAD_REQUEST,
        ),
        (
            format!("/admin/v1/accounts/{}/budget", "c".repeat(32)),
            json!({"reason": "x"}),
            StatusCode::NOT_FOUND,
        ),
    ] {
        let (got, v) = h
            .call(Method::PUT, &path, Some(&h.admin), Some(body.clone()))
            .await;
        assert_eq!(got, code, "{body}: {v}");
        assert!(v["error"]["message"].is_string(), "{v}");
    }
    Ok(())
});
