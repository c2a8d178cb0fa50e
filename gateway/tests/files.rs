//! OpenAI's Files API through the real router, against a real control
//! plane on a socket: a file uploaded by one account is found by it and by
//! no other, and no id a client sends reaches the control plane's URL as
//! anything but an id (an id that smuggles a query is not found).

// Tests read their services from the environment (clippy.toml keeps
// library code from it).
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)]

mod support;

use serde_json::{Value, json};
use support::{Platform, bearer, call, platform};

async fn upload(gw: &axum::Router, token: &str, text: &str) -> (u16, Value) {
    support::upload_batch_file(gw, token, text).await
}

#[tokio::test]
async fn a_file_is_found_by_its_account_alone_and_ids_stay_ids() {
    let p = platform().await;
    let gw = p.gateway(None, Platform::limiter()).await;
    let line = json!({"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",
                      "body": {"model": "m", "messages": []}});
    let (status, file) = upload(&gw, &p.a_token, &line.to_string()).await;
    assert_eq!(status, 200, "{file}");
    let id = file["id"].as_str().expect("an id").to_owned();
    let (a, b) = (bearer(&p.a_token), bearer(&p.b_token));

    let mine = call(&gw, "GET", &format!("/v1/files/{id}"), Some(&a), None).await;
    assert_eq!(mine.status, 200, "{}", mine.body);
    assert_eq!(mine.json()["bytes"], file["bytes"]);

    // B: A's id is not found, exactly as an unknown one is not.
    let unknown = "file-000000000000000000000000";
    let theirs = call(&gw, "GET", &format!("/v1/files/{id}"), Some(&b), None).await;
    let none = call(&gw, "GET", &format!("/v1/files/{unknown}"), Some(&b), None).await;
    assert_eq!(theirs.status, 404);
    assert_eq!(theirs.body.replace(&id, unknown), none.body);

    // An id that carries a query of its own (A's account) is an id no file
    // has: it is not found, and never read as the control plane's query.
    let smuggled = format!("/v1/files/{id}%3Faccount%3D{}", p.a);
    let r = call(&gw, "GET", &smuggled, Some(&b), None).await;
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(r.body.contains("No such File object"), "{}", r.body);
}
