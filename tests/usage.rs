//! Usage metering through the whole platform (`bulkhead up`, disaggregated):
//! after a mixed run (answers of several lengths, a stream the client
//! dropped after its first tokens, a prompt refused at admission) the
//! control plane's ledger holds exactly what the workers counted: the
//! answered requests' usage as the API reported it, the dropped stream's
//! computed tokens, and nothing for the refusal; the tenant reads the same
//! through the gateway's usage route, and operators with `bulkhead usage`.

mod support;

use serde_json::{Value, json};
use std::io::{Read, Write};
use std::time::{Duration, Instant};
use support::platform::{credentials, data_dir, get, post, up};

#[test]
fn the_ledger_holds_what_the_workers_counted_and_nothing_for_refusals() {
    let dir = data_dir("usage");
    let _up = up(&dir, &["--no-prober"]);
    let creds = credentials(&dir);
    let gw = creds["gateway_url"].as_str().expect("gateway");
    let cp = creds["control_plane_url"].as_str().expect("control plane");
    let admin = creds["operator_token"].as_str().expect("operator token");
    let model = creds["model"].as_str().expect("model");
    let account = &creds["accounts"][0];
    let (id, token) = (
        account["id"].as_str().expect("id"),
        account["token"].as_str().expect("token"),
    );
    let ledger = || -> (u64, u64, u64) {
        let rows = get(cp, &format!("/admin/v1/usage?account={id}"), admin);
        rows.as_array()
            .expect("rows")
            .iter()
            .fold((0, 0, 0), |(r, p, c), row| {
                (
                    r + row["requests"].as_u64().unwrap_or(0),
                    p + row["prompt_tokens"].as_u64().unwrap_or(0),
                    c + row["completion_tokens"].as_u64().unwrap_or(0),
                )
            })
    };
    let before = ledger();

    // Answered requests: the API's own usage is the worker's count.
    let (mut prompt, mut completion) = (0, 0);
    for (i, max) in [3u64, 9, 17].iter().enumerate() {
        let body = json!({"model": model, "max_tokens": max, "temperature": 0,
            "messages": [{"role": "user", "content": format!("Count to {i}.")}]});
        let (code, text) = post(gw, "/v1/chat/completions", token, &body.to_string());
        assert_eq!(code, 200, "{text}");
        let v: Value = serde_json::from_str(&text).expect("JSON");
        prompt += v["usage"]["prompt_tokens"].as_u64().expect("usage");
        completion += v["usage"]["completion_tokens"].as_u64().expect("usage");
    }
    // Refused at admission: costs nothing.
    let long = "word ".repeat(20_000);
    let body =
        json!({"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": long}]});
    let (code, _) = post(gw, "/v1/chat/completions", token, &body.to_string());
    assert_eq!(code, 400);
    // A stream dropped after its first tokens.
    let body = json!({"model": model, "max_tokens": 200, "stream": true, "temperature": 0,
        "messages": [{"role": "user", "content": "Tell me a long story about the sea."}]})
    .to_string();
    let addr = gw.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    while seen.matches("\"content\":").count() < 4 {
        let n = s.read(&mut buf).expect("read");
        assert!(n > 0, "the stream ended early: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    drop(s);

    // The workers report within a second or so; wait for all four calls.
    let until = Instant::now() + Duration::from_secs(30);
    let mut now = ledger();
    while now.0 < before.0 + 4 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(200));
        now = ledger();
    }
    let (requests, p, c) = (now.0 - before.0, now.1 - before.1, now.2 - before.2);
    assert_eq!(
        requests, 4,
        "three answers and the dropped stream, not the refusal"
    );
    let dropped_prompt = p - prompt;
    let dropped_output = c - completion;
    assert!(
        dropped_prompt > 5,
        "the dropped stream's prompt is billed: {dropped_prompt}"
    );
    assert!(
        (3..200).contains(&dropped_output),
        "the dropped stream is billed what was computed: {dropped_output}"
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(ledger(), now, "nothing is counted twice");

    // The tenant reads the same through the gateway, Workers AI style...
    let mine = get(gw, &format!("/client/v4/accounts/{id}/ai/usage"), token);
    assert_eq!(mine["success"], true, "{mine}");
    let total = |key: &str| -> u64 {
        mine["result"]
            .as_array()
            .expect("rows")
            .iter()
            .filter_map(|r| r[key].as_u64())
            .sum()
    };
    assert_eq!(
        (
            total("requests"),
            total("prompt_tokens"),
            total("completion_tokens")
        ),
        now
    );
    // ...but not another account's.
    let other = creds["accounts"][1]["id"].as_str().expect("second account");
    let (code, _) = support::platform::try_call(
        gw,
        "GET",
        &format!("/client/v4/accounts/{other}/ai/usage"),
        token,
        "",
    )
    .expect("answer");
    assert_eq!(code, 403);
    // Operators read it with `bulkhead usage`.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_bulkhead"))
        .args(["usage", "--json", "--account", id, "--data-dir"])
        .arg(&dir)
        .env_remove("BULKHEAD_CONTROL_PLANE_URL")
        .env_remove("BULKHEAD_TOKEN")
        .output()
        .expect("bulkhead usage");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        rows,
        get(cp, &format!("/admin/v1/usage?account={id}"), admin)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
