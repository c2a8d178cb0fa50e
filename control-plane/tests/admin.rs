//! The admin API through the real router, on SQLite and on PostgreSQL:
//! config activation against measured pools, node routability, visibility
//! flips and their audit log, and who may call what.

#[macro_use]
mod support;

use axum::http::{Method, StatusCode};
use bulkhead_test_support::json::{items, three};
use serde_json::{Value, json};
use sha2::Digest;
use std::time::Duration;
use support::{SLUG, SLUG_PATH, config, configs_path, each_backend_with, node};

async fn create_model(h: &support::Harness, visibility: &str) -> anyhow::Result<Value> {
    h.post(
        "/admin/v1/models",
        &h.admin,
        Some(json!({
            "slug": SLUG,
            "task": "Text Generation",
            "description": "SmolLM2 135M Instruct",
            "visibility": visibility
        })),
        StatusCode::CREATED,
    )
    .await
}

fn nodes_by_name(v: &Value) -> std::collections::BTreeMap<String, Value> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|n| (n["name"].as_str().unwrap_or("").to_owned(), n.clone()))
        .collect()
}

backend_test!(
    a_config_that_does_not_fit_a_nodes_measured_pool_is_refused_naming_the_node,
    |h| {
        create_model(&h, "public").await?;
        // The incident's numbers: a prefill pool of 681,280 tokens under a
        // 1,048,576-token context window.
        h.register(node("prefill-0", "prefill", 681_280)).await?;
        h.register(node("decode-0", "decode", 2_000_000)).await?;
        let v = h.add_config(config(1_048_576, 4096)).await?;
        assert_eq!(v["version"], 1);
        assert_eq!(v["active"], false);

        let (status, err) = h.activate(1, Some(json!({"reason": "long context"}))).await;
        assert_eq!(status, StatusCode::CONFLICT, "{err}");
        assert_eq!(err["error"]["code"], "config_does_not_fit");
        let msg = err["error"]["message"].as_str().unwrap_or_default();
        for needle in ["`prefill-0`", "681280", "1048576", "4096", "1052672"] {
            assert!(msg.contains(needle), "{needle} missing from: {msg}");
        }
        assert!(!msg.contains("decode-0"), "{msg}");
        // Nothing changed: no active config, no audit entry.
        let m = h
            .get(&format!("/admin/v1/models/{SLUG_PATH}"), &h.responder)
            .await?;
        assert_eq!(m["active_config"], Value::Null);
        let audit = h.get("/admin/v1/audit", &h.responder).await?;
        assert!(
            audit
                .as_array()
                .is_some_and(|a| a.iter().all(|e| e["action"] != "config.activate"))
        );

        // A config that fits both is accepted and becomes the model's limits.
        h.add_config(config(600_000, 8192)).await?;
        let v = h.activate_ok(2, None).await?;
        assert_eq!(v["active"], true);
        let m = h
            .get(&format!("/admin/v1/models/{SLUG_PATH}"), &h.responder)
            .await?;
        assert_eq!(m["active_config"], 2);
        assert_eq!(
            m["properties"],
            json!({"context_window": 600_000, "max_output": 8192})
        );
        // Exactly at the limit fits: 681,280 = 677,184 + 4,096.
        h.add_config(config(677_184, 4096)).await?;
        h.activate_ok(3, None).await?;
        h.add_config(config(677_185, 4096)).await?;
        let (status, _) = h.activate(4, None).await;
        assert_eq!(status, StatusCode::CONFLICT);
        Ok(())
    }
);

backend_test!(
    a_node_that_re_registers_with_a_smaller_pool_becomes_unroutable_with_the_reason,
    |h| {
        create_model(&h, "public").await?;
        h.add_config(config(2048, 512)).await?;
        h.activate_ok(1, None).await?;

        let v = h.register(node("decode-0", "decode", 4096)).await?;
        assert_eq!(v["node"]["routable"], true, "{v}");
        assert_eq!(v["heartbeat_interval_ms"], 5000);
        let id = v["node"]["id"].as_i64().unwrap_or_default();
        h.register(node("prefill-0", "prefill", 4096)).await?;

        // Restarted with a smaller memory budget: same name, smaller pool.
        let v = h.register(node("decode-0", "decode", 2559)).await?;
        assert_eq!(
            v["node"]["id"].as_i64(),
            Some(id),
            "re-registration keeps the node's id"
        );
        assert_eq!(v["node"]["routable"], false);
        let reason = v["node"]["unroutable_reason"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        for needle in ["2559", "2048", "512", "2560", "v1"] {
            assert!(reason.contains(needle), "{needle} missing from: {reason}");
        }
        // Visible to responders, and a heartbeat does not clear it.
        let beat = json!({"load": {"free_pages": 100, "total_pages": 159, "queue_depth": 0}});
        let v = h
            .post(
                &format!("/admin/v1/nodes/{id}/heartbeat"),
                &h.node,
                Some(beat),
                StatusCode::OK,
            )
            .await?;
        assert_eq!(v["node"]["routable"], false);
        assert_eq!(v["node"]["load"]["free_pages"], 100);
        let all = nodes_by_name(&h.get("/admin/v1/nodes", &h.responder).await?);
        assert_eq!(all["decode-0"]["routable"], false);
        assert_eq!(
            all["decode-0"]["unroutable_reason"].as_str(),
            Some(reason.as_str())
        );
        assert_eq!(all["prefill-0"]["routable"], true);

        // Other changes of what a node runs are reasons too.
        let mut other = node("prefill-0", "prefill", 4096);
        other["weights_sha256"] = json!("b".repeat(64));
        other["quantization"] = json!("q8_0");
        other["parallelism"] = json!({"tensor": 2, "pipeline": 1});
        let v = h.register(other).await?;
        let reason = v["node"]["unroutable_reason"].as_str().unwrap_or_default();
        for needle in ["weights", "q8_0", "2×1"] {
            assert!(reason.contains(needle), "{needle} missing from: {reason}");
        }
        // Another node operator can neither take the name over nor keep it alive.
        let other = h.create_operator("other-fleet", "node").await?;
        let other = other["token"].as_str().unwrap_or_default().to_owned();
        let (status, err) = h
            .attempt("/admin/v1/nodes", &other, node("decode-0", "decode", 9999))
            .await;
        assert_eq!(
            (status, err["error"]["code"].as_str()),
            (StatusCode::CONFLICT, Some("conflict")),
            "{err}"
        );
        let (status, _) = h
            .call(
                Method::POST,
                &format!("/admin/v1/nodes/{id}/heartbeat"),
                Some(&other),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let all = nodes_by_name(&h.get("/admin/v1/nodes", &h.responder).await?);
        assert_eq!(
            all["decode-0"]["kv_pool_tokens"], 2559,
            "unchanged by the refused takeover"
        );

        // Back at full size and the right weights: routable again.
        let v = h.register(node("decode-0", "decode", 2560)).await?;
        assert_eq!(v["node"]["routable"], true, "{v}");
        Ok(())
    }
);

#[tokio::test]
async fn silent_nodes_become_unroutable_and_stop_blocking_activation() {
    each_backend_with(Duration::from_millis(1500), |h| async move {
        create_model(&h, "public").await?;
        h.add_config(config(2048, 512)).await?;
        h.activate_ok(1, None).await?;
        h.register(node("small-0", "decode", 3000)).await?;
        h.add_config(config(4096, 512)).await?;
        let (status, _) = h.activate(2, None).await;
        assert_eq!(
            status,
            StatusCode::CONFLICT,
            "a live node that does not fit blocks activation"
        );
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let all = nodes_by_name(&h.get("/admin/v1/nodes", &h.responder).await?);
        assert_eq!(all["small-0"]["routable"], false);
        let reason = all["small-0"]["unroutable_reason"]
            .as_str()
            .unwrap_or_default();
        assert!(reason.contains("no heartbeat"), "{reason}");
        h.activate_ok(2, None).await?;
        Ok(())
    })
    .await;
}

backend_test!(
    a_private_flip_is_in_the_append_only_audit_log_with_actor_and_reason,
    |h| {
        create_model(&h, "public").await?;
        let vis = format!("/admin/v1/models/{SLUG_PATH}/visibility");
        let v = h.flip("private", "INC-7: stale KV pages suspected").await?;
        assert_eq!(v["model"]["visibility"], "private");
        let entry = &v["audit"];
        assert_eq!(entry["actor"], "rita-responder");
        assert_eq!(entry["action"], "model.visibility");
        assert_eq!(entry["subject"], SLUG);
        assert_eq!(entry["reason"], "INC-7: stale KV pages suspected");
        assert_eq!(
            (entry["before"].as_str(), entry["after"].as_str()),
            (Some("public"), Some("private"))
        );
        assert!(entry["at"].as_str().is_some_and(|t| t.ends_with('Z')));

        // Flipping to the state it is in changes nothing and logs nothing.
        let v = h.flip("private", "again").await?;
        assert_eq!(v["audit"], Value::Null);
        // A reason is required.
        let body = json!({"visibility": "public", "reason": "  "});
        let (status, err) = h.attempt(&vis, &h.responder, body).await;
        assert_eq!(
            (status, err["error"]["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("invalid_request"))
        );

        // Allowlisted accounts are part of visibility, and audited too.
        let acct = h.create_account("acme").await?;
        let acct_id = acct["id"].as_str().unwrap_or_default().to_owned();
        assert_eq!(acct_id.len(), 32);
        let allow = format!("/admin/v1/models/{SLUG_PATH}/allowlist");
        let v = h.post(&allow, &h.responder, Some(json!({"account_id": acct_id, "allowed": true, "reason": "acme verifies the fix"})), StatusCode::OK)
        .await?;
        assert_eq!(v["model"]["allowlist"], json!([acct_id]));
        let body = json!({"account_id": "0".repeat(32), "allowed": true, "reason": "x"});
        let (status, _) = h.attempt(&allow, &h.responder, body).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        h.flip("public", "fixed").await?;

        let log = h.get("/admin/v1/audit", &h.responder).await?;
        let actions: Vec<(&str, &str, &str)> = items(&log)
            .map(|e| three(e, ["action", "after", "actor"]))
            .collect();
        assert_eq!(
            actions,
            vec![
                ("model.visibility", "public", "rita-responder"),
                ("model.allowlist", "allowed", "rita-responder"),
                ("model.visibility", "private", "rita-responder"),
            ],
            "newest first"
        );
        let path = format!("/admin/v1/audit?subject={SLUG_PATH}&limit=1");
        let by_subject = h.get(&path, &h.responder).await?;
        assert_eq!(by_subject.as_array().map(Vec::len), Some(1));

        // No API path alters the log: every other method on it is refused.
        for method in [Method::PUT, Method::PATCH, Method::DELETE, Method::POST] {
            for (path, expected, code) in [
                (
                    "/admin/v1/audit",
                    StatusCode::METHOD_NOT_ALLOWED,
                    "method_not_allowed",
                ),
                ("/admin/v1/audit/1", StatusCode::NOT_FOUND, "not_found"),
            ] {
                let (status, body) = h
                    .call(method.clone(), path, Some(&h.admin), Some(json!({})))
                    .await;
                assert_eq!(
                    (status, body["error"]["code"].as_str()),
                    (expected, Some(code)),
                    "{method} {path}: {body}"
                );
            }
        }
        // And the database itself refuses, whoever asks.
        let mut conn = h.db.pool().acquire().await?;
        for sql in [
            "UPDATE audit_log SET reason = 'nothing happened'",
            "DELETE FROM audit_log",
        ] {
            let err = sqlx::query(sql).execute(&mut *conn).await.expect_err(sql);
            assert!(err.to_string().contains("append-only"), "{sql}: {err}");
        }
        drop(conn);
        let after = h.get("/admin/v1/audit", &h.responder).await?;
        assert_eq!(after, log);
        Ok(())
    }
);

/// One row per refused call: method, path, which token, expected status.
const REFUSALS: &[(&str, &str, &str, u16)] = &[
    ("GET", "/admin/v1/models", "none", 401),
    ("GET", "/admin/v1/models", "garbage", 401),
    ("GET", "/admin/v1/models", "revoked", 401),
    ("GET", "/admin/v1/models", "basic", 401),
    ("GET", "/admin/v1/models", "unknown-bho", 401),
    ("GET", "/admin/v1/models", "node", 403),
    ("POST", "/admin/v1/models/{slug}/visibility", "none", 401),
    ("POST", "/admin/v1/models/{slug}/visibility", "node", 403),
    ("POST", "/admin/v1/models", "responder", 403),
    ("POST", "/admin/v1/models/{slug}/configs", "responder", 403),
    (
        "POST",
        "/admin/v1/models/{slug}/configs/1/activate",
        "responder",
        403,
    ),
    ("POST", "/admin/v1/accounts", "responder", 403),
    (
        "PUT",
        "/admin/v1/accounts/{account}/budget",
        "responder",
        403,
    ),
    ("PUT", "/admin/v1/accounts/{account}/budget", "none", 401),
    ("POST", "/admin/v1/operators", "responder", 403),
    ("GET", "/admin/v1/operators", "responder", 403),
    ("DELETE", "/admin/v1/operators/1", "responder", 403),
    ("POST", "/admin/v1/nodes", "responder", 403),
    ("DELETE", "/admin/v1/nodes/1", "responder", 403),
    ("POST", "/admin/v1/incidents", "node", 403),
    ("POST", "/admin/v1/incidents", "none", 401),
    ("GET", "/admin/v1/audit", "none", 401),
    ("GET", "/admin/v1/audit", "node", 403),
];

backend_test!(
    unauthenticated_or_under_privileged_admin_calls_are_refused,
    |h| {
        create_model(&h, "public").await?;
        let created = h.create_operator("leaver", "admin").await?;
        let revoked = created["token"].as_str().unwrap_or_default().to_owned();
        assert!(revoked.starts_with("bho_"));
        let id = created["operator"]["id"].as_i64().unwrap_or_default();
        h.get("/admin/v1/whoami", &revoked).await?;
        h.ok(
            Method::DELETE,
            &format!("/admin/v1/operators/{id}"),
            &h.admin,
            None,
            StatusCode::OK,
        )
        .await?;
        // What is stored is the token's sha256, not the token.
        let mut conn = h.db.pool().acquire().await?;
        let stored: String = sqlx::Row::try_get(
            &sqlx::query("SELECT token_sha256 FROM operators WHERE name = 'leaver'")
                .fetch_one(&mut *conn)
                .await?,
            "token_sha256",
        )?;
        let expected = hex::encode(sha2::Sha256::digest(revoked.as_bytes()));
        assert_eq!(stored, expected);
        drop(conn);

        for &(method, path, who, expected) in REFUSALS {
            let path = path
                .replace("{slug}", SLUG_PATH)
                .replace("{account}", &"a".repeat(32));
            let method: Method = method.parse()?;
            let header = match who {
                "none" => None,
                "garbage" => Some("Bearer not-a-token".to_owned()),
                "revoked" => Some(format!("Bearer {revoked}")),
                "basic" => Some(format!("Basic {}", h.admin)),
                "unknown-bho" => Some(format!("Bearer bho_{}", "0".repeat(64))),
                "node" => Some(format!("Bearer {}", h.node)),
                "responder" => Some(format!("Bearer {}", h.responder)),
                other => anyhow::bail!("unknown token kind {other}"),
            };
            let mut req = axum::http::Request::builder()
                .method(method.clone())
                .uri(&path);
            if let Some(v) = &header {
                req = req.header("authorization", v);
            }
            let req = req
                .header("content-type", "application/json")
                .body(axum::body::Body::from("{}"))?;
            let resp = tower::ServiceExt::oneshot(h.app.clone(), req).await?;
            let status = resp.status().as_u16();
            let www = resp.headers().get("www-authenticate").is_some();
            let bytes = http_body_util::BodyExt::collect(resp.into_body())
                .await?
                .to_bytes();
            let body: Value = serde_json::from_slice(&bytes)?;
            assert_eq!(status, expected, "{method} {path} as {who}: {body}");
            let code = if expected == 401 {
                "unauthorized"
            } else {
                "forbidden"
            };
            assert_eq!(body["error"]["code"], code, "{method} {path} as {who}");
            assert_eq!(www, expected == 401, "WWW-Authenticate on 401 only");
        }
        // Refused calls changed nothing.
        let m = h
            .get(&format!("/admin/v1/models/{SLUG_PATH}"), &h.responder)
            .await?;
        assert_eq!(m["visibility"], "public");
        Ok(())
    }
);

backend_test!(
    database_failures_reach_clients_only_as_internal_error,
    |h| {
        create_model(&h, "public").await?;
        let mut conn = h.db.pool().acquire().await?;
        sqlx::query("DROP TABLE incident_update_components")
            .execute(&mut *conn)
            .await?;
        drop(conn);
        let body = json!({"name": "x", "impact": "minor", "body": "b"});
        let (status, v) = h.attempt("/admin/v1/incidents", &h.responder, body).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{v}");
        assert_eq!(
            v,
            json!({"error": {"code": "internal_error", "message": "internal error"}})
        );
        let mut conn = h.db.pool().acquire().await?;
        sqlx::query("ALTER TABLE incidents RENAME TO incidents_gone")
            .execute(&mut *conn)
            .await?;
        drop(conn);
        let (status, v) = h.public("/api/v2/incidents.json").await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(v["error"]["message"], "internal error");
        Ok(())
    }
);

backend_test!(bad_input_gets_a_clear_error_in_the_api_format, |h| {
    create_model(&h, "public").await?;
    let cases: Vec<(Method, String, Value, u16, &str)> = vec![
        (
            Method::POST,
            "/admin/v1/models".into(),
            json!({"slug": "no-at/x", "task": "t", "visibility": "public"}),
            400,
            "invalid_request",
        ),
        (
            Method::POST,
            "/admin/v1/models".into(),
            json!({"slug": SLUG, "task": "t", "visibility": "public"}),
            409,
            "conflict",
        ),
        (
            Method::POST,
            "/admin/v1/models".into(),
            json!({"slug": "@cf/a/b", "task": "t", "visibility": "hidden"}),
            400,
            "invalid_request",
        ),
        (
            Method::GET,
            "/admin/v1/models/%40cf%2Fno%2Fsuch".into(),
            Value::Null,
            404,
            "not_found",
        ),
        (
            Method::GET,
            "/admin/v1/models/not-a-slug".into(),
            Value::Null,
            400,
            "invalid_request",
        ),
        (
            Method::POST,
            format!("/admin/v1/models/{SLUG_PATH}/configs"),
            json!({"context_window": 1}),
            400,
            "invalid_request",
        ),
        (
            Method::POST,
            format!("/admin/v1/models/{SLUG_PATH}/configs/9/activate"),
            Value::Null,
            404,
            "not_found",
        ),
        (
            Method::POST,
            format!("/admin/v1/models/{SLUG_PATH}/configs/x/activate"),
            Value::Null,
            400,
            "invalid_request",
        ),
        (
            Method::POST,
            "/admin/v1/nodes/77/heartbeat".into(),
            Value::Null,
            404,
            "not_found",
        ),
        (
            Method::GET,
            "/admin/v1/audit?limit=many".into(),
            Value::Null,
            400,
            "invalid_request",
        ),
        (
            Method::POST,
            "/admin/v1/incidents".into(),
            json!({"name": "x", "impact": "apocalyptic", "body": "b"}),
            400,
            "invalid_request",
        ),
        (
            Method::POST,
            "/admin/v1/incidents/5/updates".into(),
            json!({"status": "identified", "body": "b"}),
            404,
            "not_found",
        ),
    ];
    let mut bad_config = config(0, 10);
    bad_config["weights_sha256"] = json!("xyz");
    let mut all = cases;
    all.push((
        Method::POST,
        format!("/admin/v1/models/{SLUG_PATH}/configs"),
        bad_config,
        400,
        "invalid_request",
    ));
    for (method, path, body, status, code) in all {
        let body = (!body.is_null()).then_some(body);
        let (got, v) = h.call(method.clone(), &path, Some(&h.admin), body).await;
        assert_eq!(got.as_u16(), status, "{method} {path}: {v}");
        assert_eq!(v["error"]["code"], code, "{method} {path}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty() && !m.contains("sqlx")),
            "{v}"
        );
    }
    Ok(())
});

backend_test!(
    a_window_a_node_cannot_prefill_in_time_is_refused_and_makes_it_unroutable,
    |h| {
        create_model(&h, "public").await?;
        // The reference machine's figures: 5.9 ms per token, 8.1 µs per
        // pair, a 60 s deadline: about 3,180 tokens in time.
        let mut slow = node("decode-slow", "decode", 100_000);
        slow["prefill"] =
            json!({"ns_per_token": 5_900_000, "ns_per_pair": 8_100, "deadline_ms": 60_000});
        h.register(slow).await?;
        h.add_config(config(8_192, 2_048)).await?;
        let (status, err) = h.activate(1, Some(json!({"reason": "full window"}))).await;
        assert_eq!(status, StatusCode::CONFLICT, "{err}");
        assert_eq!(err["error"]["code"], "config_does_not_fit");
        let msg = err["error"]["message"].as_str().unwrap_or_default();
        for needle in ["`decode-slow`", "8192-token", "60 s", "at most 31"] {
            assert!(msg.contains(needle), "{needle} missing from: {msg}");
        }
        // A window it can prefill in time activates.
        h.add_config(config(3_072, 1_024)).await?;
        h.activate_ok(2, Some(json!({"reason": "what this machine serves"})))
            .await?;
        let nodes = h.get("/admin/v1/nodes", &h.responder).await?;
        let n = &nodes_by_name(&nodes)["decode-slow"];
        assert_eq!(n["routable"], true, "{n}");
        assert_eq!(n["prefill"]["deadline_ms"], 60_000);
        // Re-registered slower (another machine under the same name): it
        // is unroutable at once, with the numbers; one without figures too.
        let mut slower = node("decode-slow", "decode", 100_000);
        slower["prefill"] =
            json!({"ns_per_token": 20_000_000, "ns_per_pair": 30_000, "deadline_ms": 60_000});
        h.register(slower).await?;
        let mut blind = node("decode-blind", "decode", 100_000);
        blind.as_object_mut().map(|o| o.remove("prefill"));
        h.register(blind).await?;
        let nodes = h.get("/admin/v1/nodes", &h.responder).await?;
        let by = nodes_by_name(&nodes);
        let n = &by["decode-slow"];
        assert_eq!(n["routable"], false, "{n}");
        let why = n["unroutable_reason"].as_str().unwrap_or_default();
        assert!(why.contains("3072-token context window"), "{why}");
        let b = &by["decode-blind"];
        assert_eq!(b["routable"], false, "{b}");
        let why = b["unroutable_reason"].as_str().unwrap_or_default();
        assert!(why.contains("no measured prefill speed"), "{b}");
        Ok(())
    }
);

// Found by `fuzz_admin` with 2,000 cases: a NUL in any text of a body was
// a 500 on PostgreSQL (which cannot store one). It is a 400 on both
// backends, for bodies and queries alike, and nothing is written.
backend_test!(
    text_with_a_nul_character_is_refused_with_a_400_on_every_backend,
    |h| {
        create_model(&h, "public").await?;
        let mut body = config(2048, 256);
        body["quantization"] = json!("q4\u{0}1");
        let (status, v) = h.attempt(&configs_path(), h.admin.as_str(), body).await;
        anyhow::ensure!(status == StatusCode::BAD_REQUEST, "{status} {v}");
        anyhow::ensure!(v["error"]["code"] == "invalid_request", "{v}");
        anyhow::ensure!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("NUL")),
            "{v}"
        );
        let mut node = node("decode-\u{0}", "decode", 2_000_000);
        node["weights_sha256"] = json!("a".repeat(64));
        let (status, v) = h.attempt("/admin/v1/nodes", h.node.as_str(), node).await;
        anyhow::ensure!(status == StatusCode::BAD_REQUEST, "{status} {v}");
        let (status, v) = h
            .call(
                Method::GET,
                "/admin/v1/audit?subject=a%00b",
                Some(h.admin.as_str()),
                None,
            )
            .await;
        anyhow::ensure!(status == StatusCode::BAD_REQUEST, "{status} {v}");
        // Nothing was written: no config, no node.
        let configs = h.get(&configs_path(), &h.admin).await?;
        anyhow::ensure!(configs.as_array().is_some_and(Vec::is_empty), "{configs}");
        let nodes = h.get("/admin/v1/nodes", &h.admin).await?;
        anyhow::ensure!(nodes.as_array().is_some_and(Vec::is_empty), "{nodes}");
        Ok(())
    }
);
