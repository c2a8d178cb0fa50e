//! OpenAI's Batch API through the real router, against a real control
//! plane on a socket: a batch made from an account's file is found, listed
//! and cancelled by that account alone (another account's id gets exactly
//! an unknown id's answer); a second cancel of a finished batch is a
//! conflict in OpenAI's error shape; a field not served is refused by name.
//! Workers AI's queued requests (`queueRequest=true`) answer a
//! `request_id` that polls as `queued` for its account and model alone.

// Tests read their services from the environment (clippy.toml keeps
// library code from it).
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)]

mod support;

use serde_json::{Value, json};
use support::{OPEN, Platform, SECRET, bearer, call, platform};

/// Uploads a two-line batch file for the token's account; its id.
async fn upload(gw: &axum::Router, token: &str) -> String {
    let line = |id: &str| {
        json!({"custom_id": id, "method": "POST", "url": "/v1/chat/completions",
               "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}})
        .to_string()
    };
    let text = format!("{}\n{}\n", line("r1"), line("r2"));
    let (status, v) = support::upload_batch_file(gw, token, &text).await;
    assert_eq!(status, 200, "{v}");
    v["id"].as_str().expect("an id").to_owned()
}

#[tokio::test]
async fn a_batch_is_its_accounts_alone_and_a_finished_one_cannot_be_cancelled() {
    let p = platform().await;
    let gw = p.gateway(None, Platform::limiter()).await;
    let (a, b) = (bearer(&p.a_token), bearer(&p.b_token));
    let file = upload(&gw, &p.a_token).await;
    let create = json!({"input_file_id": file, "endpoint": "/v1/chat/completions",
                        "completion_window": "24h", "metadata": {"run": "1"}});
    let made = call(
        &gw,
        "POST",
        "/v1/batches",
        Some(&a),
        Some(&create.to_string()),
    )
    .await;
    assert_eq!(made.status, 200, "{}", made.body);
    let batch = made.json();
    let id = batch["id"].as_str().expect("an id").to_owned();
    assert_eq!(batch["object"], "batch");
    assert_eq!(batch["status"], "validating");
    assert_eq!(
        batch["request_counts"],
        json!({"total": 2, "completed": 0, "failed": 0})
    );
    assert_eq!(batch["errors"], Value::Null);
    assert!(batch["expires_at"].as_i64() > batch["created_at"].as_i64());

    let mine = call(&gw, "GET", &format!("/v1/batches/{id}"), Some(&a), None).await;
    assert_eq!(mine.json(), batch);
    let listed = call(&gw, "GET", "/v1/batches?limit=5", Some(&a), None).await;
    assert_eq!(
        listed.json()["data"][0]["id"],
        id.as_str(),
        "{}",
        listed.body
    );
    assert_eq!(listed.json()["first_id"], id.as_str());

    // B: A's batch is not found, exactly as an unknown one is not; B's
    // own list is empty; B cannot make a batch of A's file.
    let unknown = "batch_000000000000000000000000";
    for (method, suffix) in [("GET", ""), ("POST", "/cancel")] {
        let theirs = call(
            &gw,
            method,
            &format!("/v1/batches/{id}{suffix}"),
            Some(&b),
            None,
        )
        .await;
        let none = call(
            &gw,
            method,
            &format!("/v1/batches/{unknown}{suffix}"),
            Some(&b),
            None,
        )
        .await;
        assert_eq!(theirs.status, 404, "{}", theirs.body);
        assert_eq!(theirs.body.replace(&id, unknown), none.body);
    }
    let theirs = call(&gw, "GET", "/v1/batches", Some(&b), None).await;
    assert_eq!(theirs.json()["data"], json!([]));
    let stolen = call(
        &gw,
        "POST",
        "/v1/batches",
        Some(&b),
        Some(&create.to_string()),
    )
    .await;
    assert_eq!(stolen.status, 404, "{}", stolen.body);
    assert!(
        stolen.body.contains("No such File object"),
        "{}",
        stolen.body
    );

    // Cancelled at once (no runner took it); a second cancel conflicts.
    let c = call(
        &gw,
        "POST",
        &format!("/v1/batches/{id}/cancel"),
        Some(&a),
        None,
    )
    .await;
    assert_eq!(
        (c.status.as_u16(), &c.json()["status"]),
        (200, &json!("cancelled"))
    );
    let again = call(
        &gw,
        "POST",
        &format!("/v1/batches/{id}/cancel"),
        Some(&a),
        None,
    )
    .await;
    assert_eq!(again.status, 409, "{}", again.body);
    assert_eq!(again.json()["error"]["type"], "invalid_request_error");

    // Not served, refused by name; a list option not served, too.
    let mut extra = create;
    extra["output_expires_after"] = json!({"anchor": "created_at", "seconds": 3600});
    let r = call(
        &gw,
        "POST",
        "/v1/batches",
        Some(&a),
        Some(&extra.to_string()),
    )
    .await;
    assert_eq!(r.status, 400);
    assert!(r.body.contains("output_expires_after"), "{}", r.body);
    let r = call(&gw, "GET", "/v1/batches?order=asc", Some(&a), None).await;
    assert_eq!(r.status, 400, "{}", r.body);
}

#[tokio::test]
async fn queued_workers_ai_requests_answer_a_request_id_for_their_account_and_model() {
    let p = platform().await;
    let gw = p.gateway(None, Platform::limiter()).await;
    let (a, b) = (bearer(&p.a_token), bearer(&p.b_token));
    let run = |account: &str, model: &str| {
        format!("/client/v4/accounts/{account}/ai/run/{model}?queueRequest=true")
    };
    let requests = json!({"requests": [
        {"prompt": "one", "max_tokens": 4, "external_reference": "ref-1"},
        {"messages": [{"role": "user", "content": "two"}], "max_tokens": 4},
    ]});
    let queued = call(
        &gw,
        "POST",
        &run(&p.a, OPEN),
        Some(&a),
        Some(&requests.to_string()),
    )
    .await;
    assert_eq!(queued.status, 200, "{}", queued.body);
    let v = queued.json();
    assert_eq!(
        (v["success"].as_bool(), v["result"]["status"].as_str()),
        (Some(true), Some("queued"))
    );
    assert_eq!(v["result"]["model"], OPEN);
    let id = v["result"]["request_id"]
        .as_str()
        .expect("a request id")
        .to_owned();

    // No runner here: it stays queued.
    let poll = json!({"request_id": id}).to_string();
    let mine = call(&gw, "POST", &run(&p.a, OPEN), Some(&a), Some(&poll)).await;
    assert_eq!(mine.json()["result"]["status"], "queued", "{}", mine.body);
    // Another account's poll and a poll under another model: not found,
    // exactly as an unknown id is.
    let unknown = json!({"request_id": "batch_000000000000000000000000"}).to_string();
    let none = call(&gw, "POST", &run(&p.b, OPEN), Some(&b), Some(&unknown)).await;
    let theirs = call(&gw, "POST", &run(&p.b, OPEN), Some(&b), Some(&poll)).await;
    assert_eq!(theirs.status, 404, "{}", theirs.body);
    assert_eq!(
        theirs.body.replace(&id, "batch_000000000000000000000000"),
        none.body
    );
    // B's queue of the private model B may call, polled under another model.
    let bq = call(
        &gw,
        "POST",
        &run(&p.b, SECRET),
        Some(&b),
        Some(&requests.to_string()),
    )
    .await;
    assert_eq!(bq.status, 200, "{}", bq.body);
    let bpoll = json!({"request_id": bq.json()["result"]["request_id"]}).to_string();
    let other_model = call(&gw, "POST", &run(&p.b, OPEN), Some(&b), Some(&bpoll)).await;
    assert_eq!(other_model.status, 404, "{}", other_model.body);
    // The queue is a batch of the account's, listed as such.
    let listed = call(&gw, "GET", "/v1/batches", Some(&a), None).await;
    assert_eq!(listed.json()["data"][0]["endpoint"], "/ai/run");
    // Refused before anything is queued.
    for (body, want) in [
        (json!({"requests": []}), "requests"),
        (
            json!({"requests": [{"prompt": "x", "stream": true}]}),
            "not streamed",
        ),
        (
            json!({"requests": [{"prompt": "x"}], "priority": 1}),
            "priority",
        ),
        (
            json!({"requests": [{"prompt": "x", "external_reference": 7}]}),
            "external_reference",
        ),
    ] {
        let r = call(
            &gw,
            "POST",
            &run(&p.a, OPEN),
            Some(&a),
            Some(&body.to_string()),
        )
        .await;
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert!(r.body.contains(want), "{}", r.body);
    }
}

#[tokio::test]
async fn a_batch_runners_token_must_name_the_line_it_runs() {
    let p = platform().await;
    // A token the control plane made for a batch of A's, before the
    // gateway reads its first routing table.
    let mut c = p.db.pool().acquire().await.expect("connection");
    let now = bulkhead_control_api::Timestamp::now();
    let token =
        bulkhead_control_plane::store::api_tokens::create_for_batch(&mut c, &p.a, "batch_x", now)
            .await
            .expect("a batch token");
    drop(c);
    let gw = p.gateway(None, Platform::limiter()).await;
    let body =
        json!({"model": OPEN, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let r = call(
        &gw,
        "POST",
        "/v1/chat/completions",
        Some(&bearer(&token)),
        Some(&body.to_string()),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.body.contains(bulkhead_gateway::BATCH_LINE_HEADER),
        "{}",
        r.body
    );
}
