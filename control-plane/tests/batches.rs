//! Batches on SQLite and on PostgreSQL: created from an account's file for
//! that account alone (another account's id is not found, exactly as an
//! unknown one is not); taken by one runner at a time, with a token of the
//! account that the next taking or the finish revokes; each line answered
//! once however often a runner that died runs it again; finished into an
//! output and an error file in input order; refused input and cancels.

#[macro_use]
mod support;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use bulkhead_control_api::{BatchAnswer, Timestamp};
use bulkhead_control_plane::store::{api_tokens, batches::run};
use serde_json::{Value, json};
use support::Harness;
use tower::ServiceExt;

/// A new account's id.
async fn account(h: &Harness, name: &str) -> anyhow::Result<String> {
    let v = h.create_account(name).await?;
    Ok(v["id"].as_str().unwrap_or_default().to_owned())
}

fn line(id: &str, url: &str) -> String {
    json!({"custom_id": id, "method": "POST", "url": url,
           "body": {"model": "@cf/test/model", "messages": [{"role": "user", "content": id}]}})
    .to_string()
}

/// Uploads `lines` for `account`; the file's id.
async fn file(h: &Harness, account: &str, lines: &[String]) -> anyhow::Result<String> {
    let body = json!({"account_id": account, "purpose": "batch", "filename": "in.jsonl",
                      "content": lines.join("\n")});
    let (code, v) = h
        .call(
            Method::POST,
            "/admin/v1/files",
            Some(&h.gateway),
            Some(body),
        )
        .await;
    anyhow::ensure!(code == StatusCode::OK, "{code} {v}");
    Ok(v["id"].as_str().unwrap_or_default().to_owned())
}

async fn batch(h: &Harness, account: &str, file: &str) -> (StatusCode, Value) {
    let body = json!({"account_id": account, "input_file_id": file,
                      "endpoint": "/v1/chat/completions", "completion_window": "24h",
                      "metadata": {"job": "nightly"}});
    h.call(
        Method::POST,
        "/admin/v1/batches",
        Some(&h.gateway),
        Some(body),
    )
    .await
}

fn answer(index: u64, status_code: u16, text: &str) -> BatchAnswer {
    BatchAnswer {
        index,
        status_code,
        request_id: Some(format!("req-{index}")),
        body: json!({"text": text}).to_string(),
    }
}

backend_test!(
    a_batch_answers_each_line_once_through_a_runner_that_dies,
    |h| {
        let (alice, bob) = (account(&h, "alice").await?, account(&h, "bob").await?);
        let (alice, bob) = (alice.as_str(), bob.as_str());
        let lines: Vec<String> = ["a", "b", "c"]
            .iter()
            .map(|id| line(id, "/v1/chat/completions"))
            .collect();
        let input = file(&h, alice, &lines).await?;
        let (code, b) = batch(&h, alice, &input).await;
        anyhow::ensure!(code == StatusCode::OK, "{code} {b}");
        let id = b["id"].as_str().unwrap_or_default().to_owned();
        assert!(id.starts_with("batch_") && id.len() == 30, "{id}");
        assert_eq!(b["status"], "validating");
        assert_eq!(
            b["request_counts"],
            json!({"total": 3, "completed": 0, "failed": 0})
        );
        assert_eq!(b["metadata"], json!({"job": "nightly"}));

        // Bob asks for Alice's batch: what an unknown id gets, byte for byte.
        let unknown = "batch_000000000000000000000000";
        for suffix in ["", "/cancel"] {
            let method = if suffix.is_empty() {
                Method::GET
            } else {
                Method::POST
            };
            let path = |b: &str| format!("/admin/v1/batches/{b}{suffix}?account={bob}");
            let theirs = h
                .raw(method.clone(), &path(&id), Some(&h.gateway), None)
                .await;
            let none = h.raw(method, &path(unknown), Some(&h.gateway), None).await;
            assert_eq!(theirs.0, StatusCode::NOT_FOUND);
            assert_eq!(
                theirs.2.replace(&id, unknown),
                none.2,
                "only the id differs"
            );
        }
        let (_, listed) = h
            .call(
                Method::GET,
                &format!("/admin/v1/batches?account={bob}"),
                Some(&h.gateway),
                None,
            )
            .await;
        assert_eq!(listed, json!({"data": [], "has_more": false}));

        // The runner takes it: every line, and a token of Alice's.
        let (code, lease) = h
            .call(Method::POST, "/admin/v1/batch-runs/take", None, None)
            .await;
        anyhow::ensure!(code == StatusCode::OK, "{code} {lease}");
        assert_eq!(lease["batch"]["status"], "in_progress");
        assert_eq!(lease["lines"].as_array().map(Vec::len), Some(3));
        assert_eq!(lease["lines"][1]["custom_id"], "b");
        let first_token = lease["token"].as_str().unwrap_or_default().to_owned();
        let mut c = h.db.pool().acquire().await?;
        assert_eq!(
            api_tokens::account_of(&mut c, &first_token)
                .await?
                .as_deref(),
            Some(alice)
        );
        drop(c); // SQLite's pool holds one connection.
        let (_, none) = h
            .call(Method::POST, "/admin/v1/batch-runs/take", None, None)
            .await;
        assert_eq!(none, Value::Null, "a held batch is not taken twice");

        // Two answers, then the runner dies; its lease runs out.
        let (code, rec) = h
            .call(
                Method::POST,
                &format!("/admin/v1/batch-runs/{id}/answers"),
                None,
                Some(json!({"answers": [answer(0, 200, "A"), answer(1, 200, "B")]})),
            )
            .await;
        anyhow::ensure!(code == StatusCode::OK, "{code} {rec}");
        assert_eq!(rec, json!({"recorded": 2, "duplicates": 0}));
        let mut c = h.db.pool().acquire().await?;
        let later = Timestamp::from_millis(Timestamp::now().millis() + 60_000);
        let again = run::take(&mut c, later, 30_000)
            .await?
            .expect("the lease ran out");
        let left: Vec<u64> = again.lines.iter().map(|l| l.index).collect();
        assert_eq!(left, [2], "only the unanswered line runs again");
        assert_eq!(
            api_tokens::account_of(&mut c, &first_token).await?,
            None,
            "old token revoked"
        );
        assert_eq!(
            api_tokens::account_of(&mut c, &again.token)
                .await?
                .as_deref(),
            Some(alice)
        );
        // The dead runner's late duplicate keeps the first answer.
        let rec = run::record(
            &mut c,
            &id,
            &[answer(1, 200, "B again"), answer(2, 429, "slow")],
        )
        .await?;
        assert_eq!((rec.recorded, rec.duplicates), (1, 1));
        let err = run::record(&mut c, &id, &[answer(3, 200, "no such line")]).await;
        assert!(err.is_err(), "a line the input lacks is refused");
        drop(c);

        let (code, done) = h
            .call(
                Method::POST,
                &format!("/admin/v1/batch-runs/{id}/finish"),
                None,
                None,
            )
            .await;
        anyhow::ensure!(code == StatusCode::OK, "{code} {done}");
        assert_eq!(done["status"], "completed");
        assert_eq!(
            done["request_counts"],
            json!({"total": 3, "completed": 2, "failed": 1})
        );
        let mut c = h.db.pool().acquire().await?;
        assert_eq!(
            api_tokens::account_of(&mut c, &again.token).await?,
            None,
            "revoked at the end"
        );
        drop(c);
        let content = |f: &Value| {
            let path = format!(
                "/admin/v1/files/{}/content?account={alice}",
                f.as_str().unwrap_or("-")
            );
            let h = &h;
            async move { h.call(Method::GET, &path, Some(&h.gateway), None).await.1["content"].clone() }
        };
        let out = content(&done["output_file_id"]).await;
        let out: Vec<Value> = out
            .as_str()
            .unwrap_or_default()
            .lines()
            .map(serde_json::from_str)
            .collect::<Result<_, _>>()?;
        assert_eq!(out.len(), 2);
        assert_eq!(out[0]["custom_id"], "a");
        assert_eq!(out[1]["custom_id"], "b");
        assert_eq!(
            out[1]["response"]["body"],
            json!({"text": "B"}),
            "the first answer kept"
        );
        assert_eq!(out[1]["response"]["status_code"], 200);
        assert_eq!(out[1]["response"]["request_id"], "req-1");
        let errs = content(&done["error_file_id"]).await;
        let errs: Value = serde_json::from_str(errs.as_str().unwrap_or_default().trim())?;
        assert_eq!(
            (
                errs["custom_id"].as_str(),
                errs["response"]["status_code"].as_u64()
            ),
            (Some("c"), Some(429))
        );

        // Finished: no more answers, no cancel, listed for Alice.
        let mut c = h.db.pool().acquire().await?;
        assert!(
            run::record(&mut c, &id, &[answer(2, 200, "late")])
                .await
                .is_err()
        );
        drop(c);
        let (code, _) = h
            .call(
                Method::POST,
                &format!("/admin/v1/batches/{id}/cancel?account={alice}"),
                Some(&h.gateway),
                None,
            )
            .await;
        assert_eq!(code, StatusCode::CONFLICT);
        let (_, listed) = h
            .call(
                Method::GET,
                &format!("/admin/v1/batches?account={alice}"),
                Some(&h.gateway),
                None,
            )
            .await;
        assert_eq!(listed["data"][0]["id"], id.as_str());
        Ok(())
    }
);

backend_test!(bad_input_fails_a_batch_and_a_cancel_stops_one, |h| {
    let alice = account(&h, "alice").await?;
    let alice = alice.as_str();
    // A line calling another endpoint and a repeated custom_id.
    let lines = [
        line("a", "/v1/chat/completions"),
        line("b", "/v1/completions"),
        line("a", "/v1/chat/completions"),
    ];
    let input = file(&h, alice, &lines).await?;
    let (code, b) = batch(&h, alice, &input).await;
    anyhow::ensure!(code == StatusCode::OK, "{code} {b}");
    assert_eq!(b["status"], "failed");
    let found: Vec<(String, u64)> = b["errors"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            (
                e["code"].as_str().unwrap_or("").to_owned(),
                e["line"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        found,
        [
            ("invalid_url".to_owned(), 2),
            ("duplicate_custom_id".to_owned(), 3)
        ]
    );
    let (_, none) = h
        .call(Method::POST, "/admin/v1/batch-runs/take", None, None)
        .await;
    assert_eq!(none, Value::Null, "a failed batch is not run");

    // Not yet taken: cancelled at once. Taken: cancelling, then finished
    // by the runner as cancelled with what it has.
    let good = file(
        &h,
        alice,
        &[
            line("x", "/v1/chat/completions"),
            line("y", "/v1/chat/completions"),
        ],
    )
    .await?;
    let (_, first) = batch(&h, alice, &good).await;
    let first = first["id"].as_str().unwrap_or_default().to_owned();
    let cancel = |id: String| {
        let h = &h;
        async move {
            h.call(
                Method::POST,
                &format!("/admin/v1/batches/{id}/cancel?account={alice}"),
                Some(&h.gateway),
                None,
            )
            .await
        }
    };
    let (code, v) = cancel(first.clone()).await;
    anyhow::ensure!(code == StatusCode::OK, "{code} {v}");
    assert_eq!(v["status"], "cancelled");
    let (_, second) = batch(&h, alice, &good).await;
    let second = second["id"].as_str().unwrap_or_default().to_owned();
    let (_, lease) = h
        .call(Method::POST, "/admin/v1/batch-runs/take", None, None)
        .await;
    assert_eq!(lease["batch"]["id"], second.as_str());
    let (_, rec) = h
        .call(
            Method::POST,
            &format!("/admin/v1/batch-runs/{second}/answers"),
            None,
            Some(json!({"answers": [answer(0, 200, "X")]})),
        )
        .await;
    assert_eq!(rec["recorded"], 1);
    let (_, v) = cancel(second.clone()).await;
    assert_eq!(v["status"], "cancelling");
    let (_, renewed) = h
        .call(
            Method::POST,
            &format!("/admin/v1/batch-runs/{second}/renew"),
            None,
            None,
        )
        .await;
    assert_eq!(
        renewed["status"], "cancelling",
        "the runner learns of the cancel"
    );
    let (code, done) = h
        .call(
            Method::POST,
            &format!("/admin/v1/batch-runs/{second}/finish"),
            None,
            None,
        )
        .await;
    anyhow::ensure!(code == StatusCode::OK, "{code} {done}");
    assert_eq!(done["status"], "cancelled");
    assert_eq!(
        done["request_counts"],
        json!({"total": 2, "completed": 1, "failed": 0})
    );
    assert!(done["output_file_id"].is_string() && done["error_file_id"].is_null());

    // An unfinished batch with unanswered lines is not finished.
    let (_, third) = batch(&h, alice, &good).await;
    let third = third["id"].as_str().unwrap_or_default().to_owned();
    let (_, _) = h
        .call(Method::POST, "/admin/v1/batch-runs/take", None, None)
        .await;
    let (code, _) = h
        .call(
            Method::POST,
            &format!("/admin/v1/batch-runs/{third}/finish"),
            None,
            None,
        )
        .await;
    assert_eq!(code, StatusCode::CONFLICT);
    Ok(())
});

backend_test!(
    batch_runs_need_the_runners_certificate_and_batches_the_gateways,
    |h| {
        let alice = account(&h, "alice").await?;
        let alice = alice.as_str();
        // The gateway's certificate and token reach no batch run.
        let req = Request::builder()
            .method(Method::POST)
            .uri("/admin/v1/batch-runs/take")
            .header("authorization", format!("Bearer {}", h.gateway))
            .body(Body::empty())?;
        let resp = h.app.clone().oneshot(support::from_gateway(req)).await?;
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        // Without the gateway's certificate, even the admin's token reaches
        // no batch.
        let req = Request::builder()
            .method(Method::GET)
            .uri(format!("/admin/v1/batches?account={alice}"))
            .header("authorization", format!("Bearer {}", h.admin))
            .body(Body::empty())?;
        let resp = h.app.clone().oneshot(req).await?;
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        Ok(())
    }
);

backend_test!(
    a_batch_line_bills_once_the_run_whose_answer_was_delivered,
    |h| {
        use bulkhead_control_api::{ModelSlug, UsageEvent};
        use bulkhead_control_plane::store::usage;
        let alice = account(&h, "alice").await?;
        let model: ModelSlug = "@cf/test/model".parse()?;
        let event = |call: &str, completion: u64, finish: &str| UsageEvent {
            call_id: call.to_owned(),
            account_id: alice.clone(),
            model: model.clone(),
            prompt_tokens: 10,
            completion_tokens: completion,
            context: String::new(),
            finish: finish.to_owned(),
            at: Timestamp::now(),
        };
        let key = |line: u32| vec![Some(format!("batch:batch_x:{line}:0"))];
        let mut c = h.db.pool().acquire().await?;
        // Line 0: a run cut when the runner died, then the rerun's answer,
        // then a third report under the same key: one call, the answer's.
        let cut = usage::record_keyed(&mut c, "n", &[event("c1", 5, "cancelled")], &key(0)).await?;
        let rerun = usage::record_keyed(&mut c, "n", &[event("c2", 20, "stop")], &key(0)).await?;
        let third = usage::record_keyed(&mut c, "n", &[event("c3", 20, "stop")], &key(0)).await?;
        assert_eq!((cut.recorded, rerun.recorded, third.duplicates), (1, 1, 1));
        // Line 1: the answer first, the cut run's report late: the answer's.
        usage::record_keyed(&mut c, "n", &[event("c4", 30, "stop")], &key(1)).await?;
        let late =
            usage::record_keyed(&mut c, "n", &[event("c5", 7, "cancelled")], &key(1)).await?;
        assert_eq!(late.duplicates, 1);
        let day = Timestamp::now();
        let rows = usage::daily(&mut c, Some(&alice), day, day).await?;
        let (requests, completion): (u64, u64) = rows.iter().fold((0, 0), |(r, t), row| {
            (r + row.requests, t + row.completion_tokens)
        });
        assert_eq!((requests, completion), (2, 50), "{rows:?}");
        // Without a key, each call is its own (the ledger as before).
        usage::record(&mut c, "n", &[event("c6", 1, "stop")]).await?;
        let rows = usage::daily(&mut c, Some(&alice), day, day).await?;
        assert_eq!(rows.iter().map(|r| r.requests).sum::<u64>(), 3);
        Ok(())
    }
);
