//! The prefix cache through the whole platform (`bulkhead up --colocated`),
//! as tenants reach it: an account's second identical chat reuses its own
//! first one's pages; another account sending the same prompt, and even
//! the first account's `cache_salt`, reuses nothing, because the namespace
//! comes from what the gateway authenticated. Read from the worker's own
//! `/stats` (`prefix_hit_tokens`).

mod support;

use serde_json::{Value, json};
use support::platform::{credentials, data_dir, get, post, up};

#[test]
fn only_the_account_that_computed_a_prefix_reuses_it_whatever_salt_is_sent() {
    let dir = data_dir("prefix");
    let _up = up(&dir, &["--colocated", "--no-prober"]);
    let creds = credentials(&dir);
    let (gw, cp) = (&creds.gateway_url, &creds.control_plane_url);
    let (admin, model) = (&creds.operator_token, creds.model.as_str());
    let (alice, bob) = (&creds.accounts[0].token, &creds.accounts[1].token);
    let nodes = get(cp, "/admin/v1/nodes", admin);
    let worker = nodes
        .as_array()
        .and_then(|ns| ns.iter().find(|n| n["model"] == model))
        .and_then(|n| n["address"].as_str())
        .map(|a| format!("https://{a}"))
        .unwrap_or_else(|| panic!("a colocated worker in {nodes}"));
    let hits = || {
        get(&worker, "/stats", "")["pool"]["prefix_hit_tokens"]
            .as_u64()
            .expect("stats")
    };

    let history: String = (0..12)
        .map(|i| format!("Fact {i}: the harbor at dawn holds {i} boats and a quiet crane. "))
        .collect();
    let ask = |token: &str, salt: &str| {
        let body = json!({
            "model": model, "max_tokens": 4, "temperature": 0, "cache_salt": salt,
            "messages": [
                {"role": "system", "content": history},
                {"role": "user", "content": "How many boats were there at the end?"}
            ]
        });
        let (code, text) = post(gw, "/v1/chat/completions", token, &body.to_string());
        assert_eq!(code, 200, "{text}");
        let v: Value = serde_json::from_str(&text).expect("JSON");
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let start = hits();
    let first = ask(alice, "alice-salt");
    assert_eq!(hits(), start, "nothing cached yet");
    // Bob sends Alice's prompt and Alice's salt: no reuse.
    let bobs = ask(bob, "alice-salt");
    assert_eq!(hits(), start, "another account reused a cached prefix");
    assert_eq!(bobs, first);
    // Alice again, with any salt at all: her own pages are reused.
    let again = ask(alice, "something else");
    let reused = hits() - start;
    assert!(reused >= 64, "Alice reused only {reused} tokens");
    assert_eq!(again, first, "a warm answer equals the cold one");
    let _ = std::fs::remove_dir_all(&dir);
}
