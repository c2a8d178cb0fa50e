//! Tenants' files on SQLite and on PostgreSQL: stored for the account the
//! gateway names, read back whole, listed, deleted; another account's id
//! is not found exactly as an unknown one is not; past their bounds (size,
//! lines, purpose, NUL) refused before anything is written; for the
//! gateway's token alone.

#[macro_use]
mod support;

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use support::Harness;

const ALICE: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const BOB: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

fn upload(account: &str, content: &str) -> Value {
    json!({"account_id": account, "purpose": "batch", "filename": "in.jsonl", "content": content})
}

async fn file_call(
    h: &Harness,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    h.call(method, path, Some(&h.gateway), body).await
}

backend_test!(a_file_is_its_accounts_alone_and_survives_as_written, |h| {
    let text = "{\"custom_id\": \"a\"}\n\n{\"custom_id\": \"b\", \"x\": \"é\"}\n";
    let (code, v) = file_call(
        &h,
        Method::POST,
        "/admin/v1/files",
        Some(upload(ALICE, text)),
    )
    .await;
    anyhow::ensure!(code == StatusCode::OK, "{code} {v}");
    let id = v["id"].as_str().expect("id").to_owned();
    anyhow::ensure!(id.starts_with("file-") && id.len() == 29, "{id}");
    assert_eq!(v["lines"], 2, "blank lines are not lines");
    assert_eq!(v["bytes"], text.len());
    let (code, got) = file_call(
        &h,
        Method::GET,
        &format!("/admin/v1/files/{id}?account={ALICE}"),
        None,
    )
    .await;
    assert_eq!((code, &got), (StatusCode::OK, &v));
    let (_, c) = file_call(
        &h,
        Method::GET,
        &format!("/admin/v1/files/{id}/content?account={ALICE}"),
        None,
    )
    .await;
    assert_eq!(c["content"], text, "the text as uploaded");
    let (_, list) = file_call(
        &h,
        Method::GET,
        &format!("/admin/v1/files?account={ALICE}"),
        None,
    )
    .await;
    assert_eq!(list, json!([v]));

    // Bob asks for Alice's file: what an unknown id gets, byte for byte.
    let unknown = "file-000000000000000000000000";
    let as_bob = |file: String| {
        let h = &h;
        async move { h.raw(Method::GET, &file, Some(&h.gateway), None).await }
    };
    for suffix in ["", "/content"] {
        let theirs = as_bob(format!("/admin/v1/files/{id}{suffix}?account={BOB}")).await;
        let none = as_bob(format!("/admin/v1/files/{unknown}{suffix}?account={BOB}")).await;
        assert_eq!(theirs.0, StatusCode::NOT_FOUND);
        assert_eq!(
            theirs.2.replace(&id, unknown),
            none.2,
            "only the id differs"
        );
    }
    let (code, _) = file_call(
        &h,
        Method::DELETE,
        &format!("/admin/v1/files/{id}?account={BOB}"),
        None,
    )
    .await;
    assert_eq!(code, StatusCode::NOT_FOUND, "Bob cannot delete it");
    let (_, bob) = file_call(
        &h,
        Method::GET,
        &format!("/admin/v1/files?account={BOB}"),
        None,
    )
    .await;
    assert_eq!(bob, json!([]));

    let (code, _) = file_call(
        &h,
        Method::DELETE,
        &format!("/admin/v1/files/{id}?account={ALICE}"),
        None,
    )
    .await;
    assert_eq!(code, StatusCode::OK);
    let (code, _) = file_call(
        &h,
        Method::GET,
        &format!("/admin/v1/files/{id}?account={ALICE}"),
        None,
    )
    .await;
    assert_eq!(code, StatusCode::NOT_FOUND, "deleted");
    Ok(())
});

backend_test!(
    files_past_their_bounds_are_refused_and_nothing_is_written,
    |h| {
        let big = "x".repeat(bulkhead_control_api::MAX_FILE_BYTES + 1);
        let many = "{}\n".repeat(bulkhead_control_api::MAX_FILE_LINES + 1);
        let mut wrong_purpose = upload(ALICE, "{}\n");
        wrong_purpose["purpose"] = json!("fine-tune");
        let mut control_name = upload(ALICE, "{}\n");
        control_name["filename"] = json!("a\u{7}b");
        for (body, want) in [
            (upload(ALICE, &big), "at most"),
            (upload(ALICE, &many), "lines"),
            (upload(ALICE, "\n  \n"), "lines"),
            (upload(ALICE, "{\"a\": \"\u{0}\"}"), "NUL"),
            (upload("not-an-account", "{}"), "account_id"),
            (wrong_purpose, "purpose"),
            (control_name, "control"),
        ] {
            let (code, v) = file_call(&h, Method::POST, "/admin/v1/files", Some(body)).await;
            assert_eq!(code, StatusCode::BAD_REQUEST, "{v}");
            assert!(v.to_string().contains(want), "{want}: {v}");
        }
        let (_, list) = file_call(
            &h,
            Method::GET,
            &format!("/admin/v1/files?account={ALICE}"),
            None,
        )
        .await;
        assert_eq!(list, json!([]), "nothing written");
        // Every route names a real account id: anything else is refused
        // before a query runs.
        for path in [
            "/admin/v1/files?account=a%3Fb",
            "/admin/v1/files/file-000000000000000000000000?account=x",
        ] {
            let (code, v) = file_call(&h, Method::GET, path, None).await;
            assert_eq!(code, StatusCode::BAD_REQUEST, "{path}: {v}");
            assert!(v.to_string().contains("32 hex digits"), "{v}");
        }
        // Only the gateway's token: a responder's is refused.
        let (code, _) = h
            .call(
                Method::GET,
                &format!("/admin/v1/files?account={ALICE}"),
                Some(&h.responder),
                None,
            )
            .await;
        assert_eq!(code, StatusCode::FORBIDDEN);
        Ok(())
    }
);

backend_test!(an_accounts_files_have_a_quota_of_their_own, |h| {
    let max = bulkhead_control_api::MAX_FILES_PER_ACCOUNT;
    for _ in 0..max {
        let (code, v) = file_call(
            &h,
            Method::POST,
            "/admin/v1/files",
            Some(upload(ALICE, "{}\n")),
        )
        .await;
        anyhow::ensure!(code == StatusCode::OK, "{code} {v}");
    }
    let (code, v) = file_call(
        &h,
        Method::POST,
        "/admin/v1/files",
        Some(upload(ALICE, "{}\n")),
    )
    .await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{v}");
    assert!(v.to_string().contains("delete some first"), "{v}");
    // Another account's quota is its own.
    let (code, v) = file_call(
        &h,
        Method::POST,
        "/admin/v1/files",
        Some(upload(BOB, "{}\n")),
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{v}");
    Ok(())
});
