//! Usage metering through the whole platform (`bulkhead up`, disaggregated):
//! after a mixed run (answers of several lengths, a stream the client
//! dropped after its first tokens, a prompt refused at admission) the
//! control plane's ledger holds exactly what the workers counted: the
//! answered requests' usage as the API reported it, the dropped stream's
//! computed tokens, and nothing for the refusal; the tenant reads the same
//! through the gateway's usage route, and operators with `bulkhead usage`,
//! each row priced at the model's price; `n` choices bill their prompt
//! once, as the response's usage reports it; a call whose client left while
//! its prompt was computed is billed the prompt tokens computed; a request
//! of `n` whose choice is refused answers an error and bills nothing; a
//! gateway killed mid-stream loses no usage; a budget refuses once spent.

mod support;

use serde_json::{Value, json};
use std::time::{Duration, Instant};
use support::Request;
use support::platform::{
    bulkhead, child_pid, credentials, data_dir, find_child_pid, get, post, succeeds, up,
};

#[test]
fn the_ledger_holds_what_the_workers_counted_and_nothing_for_refusals() {
    let dir = data_dir("usage");
    // A 10 s prefill deadline: the served window's prompts take seconds
    // (a dropped one is caught mid-prefill), and three of them more than
    // the deadline (prefill's queue refuses some of eight choices).
    let up = up(&dir, &["--no-prober", "--prefill-deadline-secs", "10"]);
    let creds = credentials(&dir);
    let (gw, cp) = (creds.gateway_url.as_str(), creds.control_plane_url.as_str());
    let (admin, model) = (creds.operator_token.as_str(), creds.model.as_str());
    let (id, token) = (
        creds.accounts[0].id.as_str(),
        creds.accounts[0].token.as_str(),
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
    // The stream the checks below drop and cut.
    let stream = json!({"model": model, "max_tokens": 200, "stream": true, "temperature": 0,
        "messages": [{"role": "user", "content": "Tell me a long story about the sea."}]})
    .to_string();
    let mut checks = support::Checks::default();
    checks.run("answers and a dropped stream billed, a refusal not", || {
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
        drop(stream_until(gw, token, &stream, 4));

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
    });
    checks.run(
        "n choices bill the prompt once, as the response's usage says",
        || {
            for n in [1u64, 2, 8] {
                let before = ledger();
                let body = json!({"model": model, "max_tokens": 6, "temperature": 0.7, "n": n,
                "messages": [{"role": "user", "content": "Name a colour."}]});
                let (code, text) = post(gw, "/v1/chat/completions", token, &body.to_string());
                assert_eq!(code, 200, "{text}");
                let v: Value = serde_json::from_str(&text).expect("JSON");
                assert_eq!(v["choices"].as_array().map(Vec::len), Some(n as usize));
                let told = (
                    v["usage"]["prompt_tokens"].as_u64().expect("usage"),
                    v["usage"]["completion_tokens"].as_u64().expect("usage"),
                );
                let until = Instant::now() + Duration::from_secs(30);
                let mut now = ledger();
                while now.0 < before.0 + n && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(200));
                    now = ledger();
                }
                assert_eq!(now.0 - before.0, n, "one ledger event per choice");
                assert_eq!(
                    (now.1 - before.1, now.2 - before.2),
                    told,
                    "n = {n}: the ledger against the response's usage"
                );
            }
        },
    );
    checks.run("the ledger equals the workers' own counts", || {
        // The ledger matches the workers' own counts exactly: their metering
        // metric, summed over every component of the platform.
        let all = get(cp, "/admin/v1/usage", admin);
        let ledger_all = |key: &str| -> u64 {
            all.as_array()
                .expect("rows")
                .iter()
                .filter(|r| r["model"] == model)
                .filter_map(|r| r[key].as_u64())
                .sum()
        };
        let counted = |kind: &str| -> u64 {
            let labels = [
                format!("gen_ai_request_model=\"{model}\""),
                format!("gen_ai_token_type=\"{kind}\""),
            ];
            let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
            metric_sum(&creds, "", "bulkhead_usage_tokens_total{", &labels) as u64
        };
        assert_eq!(
            (ledger_all("prompt_tokens"), ledger_all("completion_tokens")),
            (counted("input"), counted("output")),
            "the ledger against the workers' bulkhead.usage.tokens"
        );
    });
    checks.run("tenants and operators read the ledger, priced", || {
        let now = ledger();

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
        let other = &creds.accounts[1].id;
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
        let out = succeeds(bulkhead(&["usage", "--json", "--account", id, "--data-dir"]).arg(&dir));
        let rows: Value = serde_json::from_str(&out).expect("JSON");
        assert_eq!(
            rows,
            get(cp, &format!("/admin/v1/usage?account={id}"), admin)
        );
        // Every row is priced exactly at the model's price per token.
        for r in rows.as_array().expect("rows") {
            let (p, c) = (
                r["prompt_tokens"].as_u64().expect("prompt"),
                r["completion_tokens"].as_u64().expect("output"),
            );
            assert_eq!(r["micro_neurons"].as_u64(), Some(cost(p, c)), "{r}");
        }
        let billed: f64 = mine["result_info"]["days"]
            .as_array()
            .expect("days")
            .iter()
            .map(|d| d["neurons"].as_f64().unwrap_or(0.0))
            .sum();
        assert!(
            (billed * 1e6 - cost(now.1, now.2) as f64).abs() < 1.0,
            "the tenant's days add up to the ledger: {mine}"
        );
    });
    checks.run("a gateway killed mid-stream loses no usage", || {
        // The worker bills what it computed, and `up` brings the gateway back
        // on its address.
        let before_kill = ledger();
        let s = stream_until(gw, token, &stream, 4);
        let pid = kill_gateway(up.child.id());
        drop(s);
        let until = Instant::now() + Duration::from_secs(30);
        let mut after = ledger();
        while after.0 < before_kill.0 + 1 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(200));
            after = ledger();
        }
        assert_eq!(
            after.0,
            before_kill.0 + 1,
            "the killed gateway's stream is in the ledger"
        );
        assert!(
            after.2 - before_kill.2 >= 3,
            "billed what was computed: {after:?} after {before_kill:?}"
        );
        gateway_back(up.child.id(), pid, gw);
    });
    checks.run(
        "a call dropped while its prompt is computed is billed the prompt tokens computed",
        || {
            let before = ledger();
            // Most of the served window: seconds of prefill.
            let (window, words) = most_of_the_window(cp, admin, model);
            let body = json!({"model": model, "max_tokens": 4, "stream": true,
                "messages": [{"role": "user", "content": words}]})
            .to_string();
            hang_up_after(gw, token, &body, Duration::from_secs(3));
            let until = Instant::now() + Duration::from_secs(30);
            let mut now = ledger();
            while now.0 < before.0 + 1 && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(200));
                now = ledger();
            }
            assert_eq!(now.0, before.0 + 1, "the dropped call is in the ledger");
            let (p, c) = (now.1 - before.1, now.2 - before.2);
            assert_eq!(c, 0, "no token was computed");
            assert!(
                p > 0 && p < window * 9 / 10,
                "billed the part of the prompt computed in 3 s, not all of it: {p}"
            );
        },
    );
    checks.run(
        "a request of n whose choice is refused answers an error and bills nothing",
        || {
            let before = ledger();
            // Eight choices of most of the window cannot all be prefilled
            // within the deadline: prefill refuses some (its queue), so the
            // request answers a capacity error and the choices that ran are
            // voided.
            let (_, words) = most_of_the_window(cp, admin, model);
            let body = json!({"model": model, "max_tokens": 4, "n": 8, "temperature": 0.7,
                "messages": [{"role": "user", "content": words}]});
            let (code, text) = post(gw, "/v1/chat/completions", token, &body.to_string());
            assert_eq!(code, 503, "{text}");
            let v: Value = serde_json::from_str(&text).expect("JSON");
            assert_eq!(v["error"]["code"], "capacity_exceeded", "{v}");
            let refused = metric_sum(
                &creds,
                "prefill",
                "bulkhead_admission_rejections_total{",
                &["reason=\"prefill_queue_full\""],
            );
            assert!(refused > 0.0, "the prefill worker refused no choice");
            std::thread::sleep(Duration::from_secs(3));
            assert_eq!(
                ledger(),
                before,
                "the client got an error: nothing is billed"
            );
        },
    );
    checks.run("a budget refuses once spent, at no cost", || {
        budgets(
            &dir,
            up.child.id(),
            gw,
            cp,
            admin,
            model,
            &creds.accounts[1],
        );
    });
    let _ = std::fs::remove_dir_all(&dir);
    checks.finish();
}

/// A call that fails before its first token is billed nothing: `up` with
/// every prefill worker breaking its page frames (a test build's fault),
/// so each transfer fails and the decode worker's first event is the
/// failure; the gateway answers an error, and the ledger and the workers'
/// metering stay empty. Without the rule, each attempt billed its prompt.
#[test]
fn a_call_that_fails_before_its_first_token_is_billed_nothing() {
    let dir = data_dir("usage-faults");
    let up = up(&dir, &BROKEN_FRAMES);
    let creds = credentials(&dir);
    let a = &creds.accounts[0];
    // About 30 pages a prompt: every frame breaks one way or another, and
    // some break fatally (a forged tag, a dropped page).
    let body = json!({"model": creds.model, "max_tokens": 4, "temperature": 0,
        "messages": [{"role": "user", "content": "the sea ".repeat(200)}]})
    .to_string();
    for _ in 0..3 {
        let (code, text) = post(&creds.gateway_url, "/v1/chat/completions", &a.token, &body);
        assert!(
            code >= 500,
            "the broken transfer failed the call: {code} {text}"
        );
    }
    // The fault was injected: the prefill worker counted broken frames.
    let injected = metric_sum(
        &creds,
        "prefill",
        "bulkhead_kv_transfer_chaos_injected",
        &[],
    );
    assert!(injected > 0.0, "no frame was broken");
    // Reports arrive within a second or so: give them three.
    std::thread::sleep(Duration::from_secs(3));
    let path = format!("/admin/v1/usage?account={}", a.id);
    let rows = get(&creds.control_plane_url, &path, &creds.operator_token);
    assert_eq!(
        rows.as_array().map(Vec::len),
        Some(0),
        "a call that answered nothing is billed nothing: {rows}"
    );
    drop(up);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `up` with one model whose prefill workers break every page frame.
const BROKEN_FRAMES: [&str; 5] = [
    "--no-prober",
    "--models",
    "q4_1",
    "--frame-faults-percent",
    "100",
];

/// The sum of the samples of `metric` whose line contains every one of
/// `labels`, over every component whose name contains `component`.
fn metric_sum(
    creds: &support::platform::Credentials,
    component: &str,
    metric: &str,
    labels: &[&str],
) -> f64 {
    creds
        .metrics
        .iter()
        .filter(|(name, _)| name.contains(component))
        .filter_map(|(_, url)| {
            let base = url.trim_end_matches("/metrics");
            support::platform::try_call(base, "GET", "/metrics", "", "").ok()
        })
        .flat_map(|(_, text)| {
            text.lines()
                .filter(|l| l.starts_with(metric) && labels.iter().all(|x| l.contains(x)))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// The context window of `model`'s active config: the one `up` serves.
fn served_window(cp: &str, admin: &str, model: &str) -> u64 {
    let path = format!(
        "/admin/v1/models/{}/configs",
        model.replace('@', "%40").replace('/', "%2F")
    );
    get(cp, &path, admin)
        .as_array()
        .and_then(|c| c.iter().find(|c| c["active"] == true))
        .and_then(|c| c["context_window"].as_u64())
        .expect("an active config with a window")
}

/// The served window, and words that fill about nine tenths of it.
fn most_of_the_window(cp: &str, admin: &str, model: &str) -> (u64, String) {
    let window = served_window(cp, admin, model);
    (window, "the sea ".repeat(window as usize * 9 / 20))
}

/// SIGKILLs `up`'s gateway; its pid.
fn kill_gateway(up: u32) -> u32 {
    let pid = child_pid(up, "gateway", "");
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success(), "the gateway was killed");
    pid
}

/// Waits until `up` has brought a new gateway (not `pid`) back on `gw`.
fn gateway_back(up: u32, pid: u32, gw: &str) {
    let until = Instant::now() + Duration::from_secs(90);
    while !(find_child_pid(up, "gateway", "").is_some_and(|p| p != pid)
        && matches!(
            support::platform::try_call(gw, "GET", "/health", "", ""),
            Ok((200, _))
        ))
    {
        assert!(Instant::now() < until, "the gateway came back");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Opens a stream of `body` on the OpenAI chat route and reads until `n`
/// content deltas arrived; the stream, still open.
fn stream_until(gw: &str, token: &str, body: &str, n: usize) -> support::Streaming {
    let mut s = Request::at("POST", gw, "/v1/chat/completions")
        .bearer(token)
        .json(body)
        .stream()
        .expect("an answer");
    let seen = s
        .read_until(|t| t.matches("\"content\":").count() >= n)
        .expect("read");
    assert!(
        seen.matches("\"content\":").count() >= n,
        "the stream ended early: {seen}"
    );
    s
}

/// Sends `body` as a streamed chat completion and hangs up after `wait`,
/// before reading anything: a client gone while its prompt is computed.
fn hang_up_after(gw: &str, token: &str, body: &str, wait: Duration) {
    use std::io::Write;
    let addr = gw.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).expect("write");
    s.write_all(body.as_bytes()).expect("write");
    std::thread::sleep(wait);
    let _ = s.shutdown(std::net::Shutdown::Both);
}

/// `up`'s price: 330 and 2,460 neurons per million prompt and output
/// tokens, in micro-neurons.
fn cost(prompt: u64, output: u64) -> u64 {
    prompt * 330 + output * 2460
}

/// A budget set with `bulkhead budget` (audited) is spent by answered
/// requests at their actual cost and then refuses, in each API's shape,
/// with `retry-after` at the next UTC midnight; the refusal costs nothing,
/// a restarted gateway remembers the spend, and a larger budget lets
/// requests through again.
fn budgets(
    dir: &std::path::Path,
    up: u32,
    gw: &str,
    cp: &str,
    admin: &str,
    model: &str,
    account: &support::platform::Account,
) {
    // `admin` is `up`'s operator token (a responder's): it reads.
    let (id, token) = (account.id.as_str(), account.token.as_str());
    // Budgets are set by admins (`up`'s operator is a responder).
    let admin_token = support::platform::operator_token(
        dir.to_str().expect("UTF-8 path"),
        "budget-admin",
        "admin",
    );
    let set = |daily: &str| {
        let text = succeeds(
            bulkhead(&["budget", id, "--daily", daily, "--reason", "usage test"])
                .env("BULKHEAD_CONTROL_PLANE_URL", cp)
                .env("BULKHEAD_TOKEN", &admin_token),
        );
        assert!(text.contains(&format!("daily {daily} neurons")), "{text}");
    };
    // The budget covers one reservation of the served window (whose size
    // `up` sets from this machine's speed): the prompt the worker refuses
    // below must reach the worker, not be refused by the budget first.
    let window = served_window(cp, admin, model);
    let daily = (window * 330 + 4 * 2460).div_ceil(1_000_000);
    let budget = daily * 1_000_000;
    set(&daily.to_string());
    let audit = get(cp, "/admin/v1/audit?limit=5", admin);
    assert!(
        audit
            .as_array()
            .expect("audit")
            .iter()
            .any(|e| e["action"] == "account.budget"
                && e["subject"] == id
                && e["after"]
                    .as_str()
                    .is_some_and(|a| a.contains(&format!("daily={daily} ")))),
        "{audit}"
    );
    // The gateway applies the change with the next routing table.
    std::thread::sleep(Duration::from_secs(2));
    let body = json!({"model": model, "max_tokens": 4, "temperature": 0,
        "messages": [{"role": "user", "content": "Hi"}]})
    .to_string();
    // A prompt the worker refuses reserves the whole window's cost (most
    // of the budget) and must give it all back: kept, it would leave room
    // for a few answers, not the budget's worth.
    let long = json!({"model": model, "max_tokens": 4,
        "messages": [{"role": "user", "content": "word ".repeat(20_000)}]})
    .to_string();
    let (code, text) = post(gw, "/v1/chat/completions", token, &long);
    assert_eq!(code, 400, "{text}");
    let (mut spent, mut answered) = (0, 0);
    let refusal = loop {
        let (code, head, text) =
            support::platform::exchange(gw, "POST", "/v1/chat/completions", token, &body)
                .expect("answer");
        if code == 429 {
            break (head, text);
        }
        assert_eq!(code, 200, "{text}");
        let v: Value = serde_json::from_str(&text).expect("JSON");
        spent += cost(
            v["usage"]["prompt_tokens"].as_u64().expect("usage"),
            v["usage"]["completion_tokens"].as_u64().expect("usage"),
        );
        answered += 1;
        assert!(
            answered < 200 * daily,
            "a budget of {daily} neurons never refused"
        );
    };
    // What was answered fits the budget, and the refused request's
    // reservation (its prompt bound: 2 bytes, 2 messages' worth of
    // template, the system prompt; 4 output tokens) did not.
    let reservation = (2 + 4 + 16 * 2 + 64) * 330 + 4 * 2460;
    assert!(spent <= budget, "spent {spent} micro-neurons of {budget}");
    assert!(
        spent + reservation > budget,
        "refused with {spent} spent, room for another reservation of {reservation}"
    );
    let (head, text) = refusal;
    let v: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(v["error"]["type"], "insufficient_quota", "{v}");
    assert_eq!(v["error"]["code"], "insufficient_quota", "{v}");
    let message = v["error"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains(&format!("daily budget of {daily} neurons")),
        "{message}"
    );
    let header = |name: &str| {
        head.lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
            })
            .unwrap_or_default()
    };
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let to_midnight = 86_400 - secs % 86_400;
    let retry: u64 = header("retry-after").parse().expect("retry-after");
    assert!(retry.abs_diff(to_midnight) <= 5, "{retry} vs {to_midnight}");
    assert_eq!(header("x-should-retry"), "false");
    // Workers AI's shape: code 3036, the budget named.
    let run = json!({"prompt": "Hi", "max_tokens": 4}).to_string();
    let (code, text) = post(
        gw,
        &format!("/client/v4/accounts/{id}/ai/run/{model}"),
        token,
        &run,
    );
    assert_eq!(code, 429, "{text}");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(v["errors"][0]["code"], 3036, "{v}");
    assert!(
        v["errors"][0]["message"]
            .as_str()
            .unwrap_or("")
            .contains("daily budget")
    );
    // The refusals cost nothing: the ledger holds the answered requests.
    let until = Instant::now() + Duration::from_secs(30);
    let ledger = || -> (u64, u64) {
        get(cp, &format!("/admin/v1/usage?account={id}"), admin)
            .as_array()
            .expect("rows")
            .iter()
            .fold((0, 0), |(r, n), row| {
                (
                    r + row["requests"].as_u64().unwrap_or(0),
                    n + row["micro_neurons"].as_u64().unwrap_or(0),
                )
            })
    };
    let mut seen = ledger();
    while seen.0 < answered && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(200));
        seen = ledger();
    }
    assert_eq!(
        seen,
        (answered, spent),
        "the ledger holds the answered requests, exactly"
    );
    // A restarted gateway (budgets in its memory) starts from the ledger:
    // the budget is still spent.
    let pid = kill_gateway(up);
    gateway_back(up, pid, gw);
    let (code, text) = post(gw, "/v1/chat/completions", token, &body);
    assert_eq!(code, 429, "a restart forgot the spend: {text}");
    // A larger budget admits again.
    set("1000");
    std::thread::sleep(Duration::from_secs(2));
    let (code, text) = post(gw, "/v1/chat/completions", token, &body);
    assert_eq!(code, 200, "{text}");
}
