//! A batch through `bulkhead up`, its runner killed with SIGKILL while
//! lines are in flight: `up` restarts the runner, the batch completes once
//! the dead runner's hold lapses, and every line has exactly one answer in
//! the output file and one call in the ledger, although the workers ran
//! some lines twice (their own token counts exceed the ledger's: the proof
//! that the kill cut lines mid-answer). Then Workers AI's queued requests
//! (`queueRequest=true`) on the same platform: queued, polled until the
//! runner has answered each, answered by place with their references.

mod support;

use bulkhead_test_support::Request;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use support::platform::{child_pid, credentials, data_dir, find_child_pid, get, post, up};

/// Lines in the batch.
const LINES: usize = 40;

fn wait_for<T>(what: &str, secs: u64, mut f: impl FnMut() -> Option<T>) -> T {
    let until = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < until, "{what} within {secs} s");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The sum of a metric's samples with `labels` across every component.
fn metric_sum(creds: &support::platform::Credentials, metric: &str, labels: &[String]) -> u64 {
    creds
        .metrics
        .values()
        .filter_map(|url| {
            let base = url.trim_end_matches("/metrics");
            support::platform::try_call(base, "GET", "/metrics", "", "").ok()
        })
        .flat_map(|(_, text)| {
            text.lines()
                .filter(|l| l.starts_with(metric) && labels.iter().all(|x| l.contains(x.as_str())))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .collect::<Vec<_>>()
        })
        .sum::<f64>() as u64
}

#[test]
fn a_batch_survives_its_runner_killed_mid_batch_with_each_line_answered_and_billed_once() {
    let dir = data_dir("batch-kill");
    let u = up(&dir, &["--colocated", "--no-prober", "--models", "q4_1"]);
    let creds = credentials(&dir);
    let (gw, account) = (creds.gateway_url.as_str(), &creds.accounts[0]);
    let model = creds.model.as_str();

    let text: Vec<String> = (0..LINES)
        .map(|i| {
            json!({"custom_id": format!("line-{i}"), "method": "POST", "url": "/v1/chat/completions",
                   "body": {"model": model, "max_tokens": 48, "temperature": 0,
                            "messages": [{"role": "user", "content": format!("Count from {i} upwards.")}]}})
            .to_string()
        })
        .collect();
    let form = format!(
        "--X\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
         --X\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\
         Content-Type: application/jsonl\r\n\r\n{}\r\n--X--\r\n",
        text.join("\n")
    );
    let uploaded = Request::at("POST", gw, "/v1/files")
        .bearer(&account.token)
        .header("content-type", "multipart/form-data; boundary=X")
        .body(form)
        .send()
        .expect("upload");
    assert_eq!(uploaded.status, 200, "{}", uploaded.body);
    let file = uploaded.json()["id"]
        .as_str()
        .expect("a file id")
        .to_owned();
    let body = json!({"input_file_id": file, "endpoint": "/v1/chat/completions",
                      "completion_window": "24h"});
    let (status, made) = post(gw, "/v1/batches", &account.token, &body.to_string());
    assert_eq!(status, 200, "{made}");
    let batch: Value = serde_json::from_str(&made).expect("a batch");
    let id = batch["id"].as_str().expect("an id").to_owned();
    let read = || get(gw, &format!("/v1/batches/{id}"), &account.token);

    // Kill the runner once a few lines are answered, while others run.
    let answered = wait_for("a few answered lines", 240, || {
        let n = read()["request_counts"]["completed"].as_u64()?;
        (n >= 4).then_some(n)
    });
    let pid = child_pid(u.child.id(), "batch-runner", "batch-runner");
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "the batch runner was killed");
    let at_kill = read();
    let done_at_kill = at_kill["request_counts"]["completed"].as_u64().unwrap_or(0);
    assert!(
        answered >= 4 && done_at_kill < LINES as u64,
        "the kill landed mid-batch: {at_kill}"
    );
    wait_for("a new batch runner", 90, || {
        find_child_pid(u.child.id(), "batch-runner", "batch-runner").filter(|p| *p != pid)
    });

    // It completes (the dead runner's hold lapses in 30 s).
    let done = wait_for("the batch to finish", 300, || {
        let b = read();
        (b["status"] != "in_progress" && b["status"] != "validating").then_some(b)
    });
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["request_counts"],
        json!({"total": LINES, "completed": LINES, "failed": 0})
    );
    let out = Request::at(
        "GET",
        gw,
        &format!(
            "/v1/files/{}/content",
            done["output_file_id"].as_str().unwrap_or("-")
        ),
    )
    .bearer(&account.token)
    .send()
    .expect("output");
    assert_eq!(out.status, 200);
    let ids: Vec<String> = out
        .body
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("an output line");
            assert_eq!(v["response"]["status_code"], 200, "{v}");
            v["custom_id"].as_str().unwrap_or_default().to_owned()
        })
        .collect();
    let distinct: BTreeSet<&String> = ids.iter().collect();
    assert_eq!(
        (ids.len(), distinct.len()),
        (LINES, LINES),
        "one answer per line"
    );

    // The ledger: one call per line. The workers' own counts (every run,
    // the cut ones too) exceed the ledger's tokens: lines did run twice.
    let labels = vec![
        format!("gen_ai_request_model=\"{model}\""),
        "gen_ai_token_type=\"output\"".to_owned(),
    ];
    let usage_path = format!("/client/v4/accounts/{}/ai/usage", account.id);
    let (requests, ledger_out) = wait_for("the ledger to count every line", 60, || {
        let u = get(gw, &usage_path, &account.token);
        let rows = u["result"].as_array()?;
        let sum = |k: &str| rows.iter().filter_map(|r| r[k].as_u64()).sum::<u64>();
        (sum("requests") >= LINES as u64).then(|| (sum("requests"), sum("completion_tokens")))
    });
    std::thread::sleep(Duration::from_secs(3));
    let again = get(gw, &usage_path, &account.token);
    let rows = again["result"].as_array().cloned().unwrap_or_default();
    assert_eq!(
        rows.iter()
            .filter_map(|r| r["requests"].as_u64())
            .sum::<u64>(),
        requests,
        "no late report adds a call"
    );
    assert_eq!(requests, LINES as u64, "one call per line in the ledger");
    let served = metric_sum(&creds, "bulkhead_usage_tokens_total{", &labels);
    assert!(
        served > ledger_out,
        "the workers served {served} output tokens and the ledger bills {ledger_out}: \
         no line was cut by the kill, so nothing ran twice"
    );

    // Workers AI's queued requests, run by the same runner.
    let run = format!(
        "/client/v4/accounts/{}/ai/run/{model}?queueRequest=true",
        account.id
    );
    let requests = json!({"requests": [
        {"prompt": "Name a colour.", "max_tokens": 6, "external_reference": "first"},
        {"messages": [{"role": "user", "content": "Name a fruit."}], "max_tokens": 6},
        {"prompt": "Name a city.", "max_tokens": 6},
    ]});
    let (status, queued) = post(gw, &run, &account.token, &requests.to_string());
    assert_eq!(status, 200, "{queued}");
    let queued: Value = serde_json::from_str(&queued).expect("JSON");
    assert_eq!(queued["result"]["status"], "queued", "{queued}");
    let poll = json!({"request_id": queued["result"]["request_id"]}).to_string();
    let answered = wait_for("the queued requests' answers", 180, || {
        let (status, body) = post(gw, &run, &account.token, &poll);
        assert_eq!(status, 200, "{body}");
        let v: Value = serde_json::from_str(&body).ok()?;
        v["result"]["responses"].is_array().then_some(v)
    });
    let responses = answered["result"]["responses"]
        .as_array()
        .expect("responses");
    let ids: Vec<u64> = responses.iter().filter_map(|r| r["id"].as_u64()).collect();
    assert_eq!(ids, [0, 1, 2], "{answered}");
    for r in responses {
        assert_eq!(r["success"], true, "{r}");
        assert!(
            r["result"]["response"]
                .as_str()
                .is_some_and(|t| !t.is_empty()),
            "{r}"
        );
    }
    assert_eq!(responses[0]["external_reference"], "first");
    assert!(responses[1]["external_reference"].is_null());
    assert!(
        answered["result"]["usage"]["total_tokens"].as_u64() > Some(0),
        "{answered}"
    );
}
