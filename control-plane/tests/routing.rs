//! What gateways read and how a flip reaches them, on SQLite and on
//! PostgreSQL: tenant API tokens (hashed, revocable), the long-polled
//! routing table, and visibility flips acknowledged only once every live
//! gateway has applied them.

#[macro_use]
mod support;

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use sha2::Digest;
use std::time::{Duration, Instant};
use support::{Harness, SLUG};

async fn setup(h: &Harness) -> anyhow::Result<String> {
    h.create_model(SLUG, "public").await?;
    let a = h.create_account("acme").await?;
    Ok(a["id"].as_str().unwrap_or_default().to_owned())
}

backend_test!(
    api_tokens_reach_gateways_only_as_hashes_and_revocation_removes_them,
    |h| {
        let account = setup(&h).await?;
        let path = format!("/admin/v1/accounts/{account}/tokens");
        let t = h
            .post(
                &path,
                &h.admin,
                Some(json!({"name": "ci"})),
                StatusCode::CREATED,
            )
            .await?;
        let token = t["token"].as_str().unwrap_or_default().to_owned();
        assert!(token.starts_with("bhk_") && token.len() == 68, "{token}");
        let id = t["id"].as_i64().unwrap_or_default();
        // Responders may not mint tenant tokens; gateways may not read anything else.
        let (s, _) = h.attempt(&path, &h.responder, json!({"name": "x"})).await;
        assert_eq!(s, StatusCode::FORBIDDEN);
        let (s, _) = h
            .call(Method::GET, "/admin/v1/models", Some(&h.gateway), None)
            .await;
        assert_eq!(s, StatusCode::FORBIDDEN);

        let table = h.get("/admin/v1/routing?gateway=g1", &h.gateway).await?;
        let hash = hex::encode(sha2::Sha256::digest(token.as_bytes()));
        assert_eq!(
            table["tokens"],
            json!([{"sha256": hash, "account_id": account}])
        );
        assert!(
            !table.to_string().contains(&token),
            "the table never carries a token"
        );
        let acct = &table["accounts"][0];
        assert_eq!(acct["id"], account.as_str());
        assert_eq!(
            acct["tenant"].as_u64(),
            u64::from_str_radix(&account[..16], 16).ok()
        );
        assert_eq!(table["models"][0]["slug"], SLUG);
        assert_eq!(table["models"][0]["visibility"], "public");
        assert_eq!(table["lease_ms"], 3000);

        let revoked = h
            .ok(
                Method::DELETE,
                &format!("{path}/{id}"),
                &h.responder,
                None,
                StatusCode::OK,
            )
            .await?;
        assert!(revoked["revoked_at"].is_string());
        let table = h.get("/admin/v1/routing?gateway=g1", &h.gateway).await?;
        assert_eq!(table["tokens"], json!([]));
        let (s, _) = h
            .call(
                Method::DELETE,
                &format!("/admin/v1/accounts/{}/tokens/{id}", "0".repeat(32)),
                Some(&h.admin),
                None,
            )
            .await;
        assert_eq!(
            s,
            StatusCode::NOT_FOUND,
            "a token is revoked only through its own account"
        );
        Ok(())
    }
);

backend_test!(the_routing_long_poll_answers_when_the_table_changes, |h| {
    setup(&h).await?;
    let first = h.get("/admin/v1/routing?gateway=g1", &h.gateway).await?;
    let v = first["version"].as_u64().unwrap_or_default();
    // Nothing changes: the poll is held for wait_ms (capped at a third of the lease).
    let started = Instant::now();
    let path = format!("/admin/v1/routing?gateway=g1&version={v}&wait_ms=300");
    let same = h.get(&path, &h.gateway).await?;
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert_eq!(same["version"].as_u64(), Some(v));
    // A write answers a held poll at once, with the new table.
    let app = h.app.clone();
    let gw = h.gateway.clone();
    let poll = tokio::spawn(async move {
        let req = axum::http::Request::get(format!(
            "/admin/v1/routing?gateway=g1&version={v}&wait_ms=900"
        ))
        .header("authorization", format!("Bearer {gw}"))
        .body(axum::body::Body::empty())
        .expect("request");
        let resp = tower::ServiceExt::oneshot(app, support::from_gateway(req))
            .await
            .expect("router");
        let bytes = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .expect("body")
            .to_bytes();
        serde_json::from_slice::<Value>(&bytes).expect("JSON")
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    h.create_account("beta").await?;
    let changed = poll.await?;
    assert!(
        started.elapsed() < Duration::from_millis(800),
        "answered on the change, not the timeout"
    );
    assert!(changed["version"].as_u64() > Some(v));
    assert_eq!(changed["accounts"].as_array().map(Vec::len), Some(2));
    Ok(())
});

/// A gateway as the control plane sees one: polls, applies, polls again.
fn gateway_loop(
    h: &Harness,
    id: &'static str,
    applied_delay: Duration,
) -> tokio::task::JoinHandle<()> {
    let app = h.app.clone();
    let token = h.gateway.clone();
    tokio::spawn(async move {
        let mut version = 0u64;
        loop {
            let req = axum::http::Request::get(format!(
                "/admin/v1/routing?gateway={id}&version={version}&wait_ms=900"
            ))
            .header("authorization", format!("Bearer {token}"))
            .body(axum::body::Body::empty())
            .expect("request");
            let Ok(resp) =
                tower::ServiceExt::oneshot(app.clone(), support::from_gateway(req)).await;
            let Ok(body) = http_body_util::BodyExt::collect(resp.into_body()).await else {
                return;
            };
            let Ok(v) = serde_json::from_slice::<Value>(&body.to_bytes()) else {
                return;
            };
            tokio::time::sleep(applied_delay).await;
            version = v["version"].as_u64().unwrap_or(0);
        }
    })
}

backend_test!(
    a_flip_is_acknowledged_only_after_every_live_gateway_applied_it,
    |h| {
        setup(&h).await?;
        let fast = gateway_loop(&h, "fast", Duration::ZERO);
        let slow = gateway_loop(&h, "slow", Duration::from_millis(400));
        tokio::time::sleep(Duration::from_millis(600)).await;
        let started = Instant::now();
        let v = h.flip("private", "drill").await?;
        let took = started.elapsed();
        let p = &v["propagation"];
        assert_eq!(
            (p["gateways"].as_u64(), p["applied"].as_u64()),
            (Some(2), Some(2)),
            "{v}"
        );
        assert!(
            took >= Duration::from_millis(350),
            "waited for the slow gateway: {took:?}"
        );
        assert!(p["waited_ms"].as_u64().is_some_and(|w| w >= 350));
        // The table any gateway fetches from now on has the model private.
        let table = h.get("/admin/v1/routing?gateway=late", &h.gateway).await?;
        assert_eq!(table["models"][0]["visibility"], "private");
        assert!(table["version"].as_u64() >= p["version"].as_u64());

        // A gateway that stops polling delays a flip by at most the lease (3 s here).
        slow.abort();
        fast.abort();
        let started = Instant::now();
        let v = h.flip("public", "drill over").await?;
        assert!(started.elapsed() < Duration::from_millis(3500));
        assert_eq!(v["propagation"]["applied"], 0, "{v}");
        Ok(())
    }
);
