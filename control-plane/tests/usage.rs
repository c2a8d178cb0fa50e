//! The usage ledger on SQLite and on PostgreSQL: workers' reports are
//! counted once per call id (a repeated batch changes nothing), rolled up
//! per account, model and UTC day, refused whole when malformed or for a
//! model the certificate does not serve, read by responders (every
//! account) and the gateway (one account's), and voided by the gateway
//! alone for a request that answered an error.

#[macro_use]
mod support;

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use support::{Harness, SLUG};

const ALICE: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const BOB: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

fn event(call: &str, account: &str, prompt: u64, completion: u64, at: &str) -> Value {
    json!({"call_id": call, "account_id": account, "model": SLUG, "prompt_tokens": prompt,
           "completion_tokens": completion, "finish": "stop",
           "context": support::signed_call(call, account, SLUG), "at": at})
}

async fn report(h: &Harness, events: Vec<Value>) -> (StatusCode, Value) {
    h.attempt("/admin/v1/usage", &h.node, json!({"events": events}))
        .await
}

backend_test!(
    reports_count_once_per_call_and_roll_up_by_account_model_and_day,
    |h| {
        let day1 = "2026-11-30T10:00:00Z";
        let day2 = "2026-12-01T23:59:59Z";
        let batch = vec![
            event("c1", ALICE, 10, 5, day1),
            event("c2", ALICE, 7, 3, day1),
            event("c3", BOB, 100, 0, day1),
            event("c4", ALICE, 1, 1, day2),
        ];
        let (code, v) = report(&h, batch.clone()).await;
        assert_eq!(
            (code, &v),
            (StatusCode::OK, &json!({"recorded": 4, "duplicates": 0}))
        );
        // The same batch again (an answer lost on the way): nothing moves.
        let (code, v) = report(&h, batch).await;
        assert_eq!(
            (code, &v),
            (StatusCode::OK, &json!({"recorded": 0, "duplicates": 4}))
        );

        let rows = h
            .get(
                "/admin/v1/usage?since=2026-11-01&until=2026-12-01",
                &h.responder,
            )
            .await?;
        assert_eq!(
            rows,
            json!([
                {"account_id": ALICE, "model": SLUG, "date": "2026-11-30", "requests": 2, "prompt_tokens": 17, "completion_tokens": 8, "micro_neurons": 0},
                {"account_id": BOB, "model": SLUG, "date": "2026-11-30", "requests": 1, "prompt_tokens": 100, "completion_tokens": 0, "micro_neurons": 0},
                {"account_id": ALICE, "model": SLUG, "date": "2026-12-01", "requests": 1, "prompt_tokens": 1, "completion_tokens": 1, "micro_neurons": 0},
            ])
        );
        // The gateway reads one account's, and must say which.
        let path = format!("/admin/v1/usage?account={ALICE}&since=2026-12-01&until=2026-12-01");
        let alice = h.get(&path, &h.gateway).await?;
        assert_eq!(alice.as_array().map(Vec::len), Some(1));
        let (code, _) = h
            .call(Method::GET, "/admin/v1/usage", Some(&h.gateway), None)
            .await;
        assert_eq!(code, StatusCode::BAD_REQUEST);
        Ok(())
    }
);

backend_test!(a_bad_report_is_refused_whole_and_only_workers_report, |h| {
    let at = "2026-12-01T10:00:00Z";
    for (bad, why) in [
        (event("x1", "not-an-account", 1, 1, at), "account"),
        (event("", ALICE, 1, 1, at), "call id"),
    ] {
        let (code, v) = report(&h, vec![event("ok-1", ALICE, 1, 1, at), bad]).await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{why}: {v}");
    }
    let (code, v) = report(&h, vec![json!({"call_id": "y"})]).await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{v}");
    // An event billed to another account, model or call than its signed
    // context names, or with a context the gateway never signed, is
    // refused with its batch: a worker bills only calls it was sent.
    let mut other_account = event("x2", ALICE, 1, 1, at);
    other_account["context"] = json!(support::signed_call("x2", BOB, SLUG));
    let mut other_call = event("x3", ALICE, 1, 1, at);
    other_call["context"] = json!(support::signed_call("x4", ALICE, SLUG));
    let mut other_model = event("x5", ALICE, 1, 1, at);
    other_model["context"] = json!(support::signed_call("x5", ALICE, "@cf/other/model"));
    let mut unsigned = event("x6", ALICE, 1, 1, at);
    let ctx = bulkhead_worker_api::context::TenantContext::new(
        ALICE,
        1,
        "x6".into(),
        SLUG,
        None,
        1,
        None,
        std::time::SystemTime::now(),
    );
    unsigned["context"] = json!(bulkhead_worker_api::context::SigningKey::generate().sign(&ctx));
    for (bad, why) in [
        (other_account, "another account"),
        (other_call, "another call"),
        (other_model, "another model"),
        (unsigned, "not signed by the gateway"),
    ] {
        let (code, v) = report(&h, vec![event("ok-2", ALICE, 1, 1, at), bad]).await;
        assert_eq!(code, StatusCode::FORBIDDEN, "{why}: {v}");
        assert!(v.to_string().contains("tenant context"), "{why}: {v}");
    }
    // Nothing of the refused batches was kept.
    let rows = h
        .get(
            "/admin/v1/usage?since=2026-12-01&until=2026-12-01",
            &h.responder,
        )
        .await?;
    assert_eq!(rows, json!([]));
    // A responder's token cannot report usage; a bad day is refused.
    let (code, _) = h
        .attempt("/admin/v1/usage", &h.responder, json!({"events": []}))
        .await;
    assert!(
        code == StatusCode::FORBIDDEN || code == StatusCode::UNAUTHORIZED,
        "{code}"
    );
    let (code, _) = h
        .call(
            Method::GET,
            "/admin/v1/usage?since=2026-02-31",
            Some(&h.responder),
            None,
        )
        .await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    Ok(())
});

backend_test!(
    a_void_reverses_reported_calls_and_bars_unreported_ones,
    |h| {
        let at = "2026-12-02T10:00:00Z";
        let (code, _) = report(
            &h,
            vec![event("n0", ALICE, 40, 9, at), event("k1", ALICE, 5, 5, at)],
        )
        .await;
        assert_eq!(code, StatusCode::OK);
        // One of a request's choices ran and reported (n0); another had
        // not reported yet (n1) when the request answered an error.
        let void = json!({"account_id": ALICE, "model": SLUG, "call_ids": ["n0", "n1"]});
        let (code, v) = h
            .attempt("/admin/v1/usage/void", &h.gateway, void.clone())
            .await;
        assert_eq!(
            (code, &v),
            (StatusCode::OK, &json!({"reversed": 1, "barred": 1}))
        );
        // Its report, when it comes, counts nothing; a second void neither.
        let (code, v) = report(&h, vec![event("n1", ALICE, 0, 7, at)]).await;
        assert_eq!(
            (code, &v),
            (StatusCode::OK, &json!({"recorded": 0, "duplicates": 1}))
        );
        let (code, v) = h.attempt("/admin/v1/usage/void", &h.gateway, void).await;
        assert_eq!(
            (code, &v),
            (StatusCode::OK, &json!({"reversed": 0, "barred": 0}))
        );
        assert_eq!(
            h.get("/admin/v1/usage?since=2026-12-02", &h.responder)
                .await?,
            json!([{"account_id": ALICE, "model": SLUG, "date": "2026-12-02", "requests": 1,
                    "prompt_tokens": 5, "completion_tokens": 5, "micro_neurons": 0}]),
            "only the call the client was answered for is billed"
        );
        // Only a gateway voids, and only the account's own calls.
        let theirs = json!({"account_id": BOB, "model": SLUG, "call_ids": ["k1"]});
        let (code, v) = h.attempt("/admin/v1/usage/void", &h.gateway, theirs).await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{v}");
        let mine = json!({"account_id": ALICE, "model": SLUG, "call_ids": ["k1"]});
        for who in [&h.node, &h.responder] {
            let (code, v) = h.attempt("/admin/v1/usage/void", who, mine.clone()).await;
            assert!(
                code == StatusCode::FORBIDDEN || code == StatusCode::UNAUTHORIZED,
                "{code}: {v}"
            );
        }
        Ok(())
    }
);
