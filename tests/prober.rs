//! The leak prober catches a worker whose answers went wrong, by itself:
//! `bulkhead up` with a test build's fault (every request after the 10th
//! on each decode worker answers wrong), the prober every 2 s. The prober
//! records its golden answers in its first round and finds the change in
//! the next one, within an interval, a round and the flip: the model is private, a major incident is open on the status
//! page, the finding is counted, the webhook got it, and no tenant request
//! is served by the model afterwards. A prober that cannot reach the
//! gateway counts errors and flips nothing. An embedding worker whose
//! answers cross between calls is caught the same way, and only its model
//! is withdrawn.

mod support;

use bulkhead_test_support::json::items;
use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::platform::{credentials, get, post, try_call, up};

const MODEL: &str = "@cf/huggingfacetb/smollm2-135m-instruct";
const MODEL_PATH: &str = "%40cf%2Fhuggingfacetb%2Fsmollm2-135m-instruct";

/// The sum of the samples of metric `name` whose line contains `label`.
fn prober_metric(url: &str, name: &str, label: &str) -> f64 {
    let (base, path) = url.split_at(url.find("/metrics").expect("a /metrics URL"));
    let text = try_call(base, "GET", path, "", "")
        .map(|(_, t)| t)
        .unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn the_prober_withdraws_a_model_whose_answers_went_wrong_and_opens_an_incident() {
    let dir = support::platform::data_dir("prober");
    let (hook, hooked) = support::sink::start(axum::http::StatusCode::NO_CONTENT, "text/plain");
    let hook = format!("{hook}/hook");
    let interval = 2;
    let platform = up(
        &dir,
        &[
            "--models",
            "q4_1",
            "--kv-budget-mib",
            "16",
            "--context-window",
            "512",
            "--max-output",
            "128",
            "--prober-interval-secs",
            &interval.to_string(),
            "--prober-webhook",
            &hook,
            "--corrupt-answers-after",
            "10",
        ],
    );
    let creds = credentials(&dir);
    let (cp, gw) = (&creds.control_plane_url, &creds.gateway_url);
    let op = &creds.operator_token;
    let metrics = &creds.metrics["prober"];

    // A prober that cannot reach the gateway counts errors, flips nothing.
    let internal: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("internal-tokens.json")).expect("internal tokens"),
    )
    .expect("JSON");
    let lost = Command::new(env!("CARGO_BIN_EXE_bulkhead"))
        .args([
            "prober",
            "--gateway",
            "http://127.0.0.1:9",
            "--control-plane",
            cp,
        ])
        .args(["--rounds", "2", "--interval-secs", "1", "--state"])
        .arg(dir.join("lost-prober.json"))
        .env("BULKHEAD_PROBER_TOKEN", op)
        .env("BULKHEAD_SENTINELS", internal["sentinels"].to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("a prober run");
    assert!(
        lost.status.success(),
        "{}",
        String::from_utf8_lossy(&lost.stderr)
    );
    assert!(
        String::from_utf8_lossy(&lost.stderr).contains("probe gave no verdict"),
        "its errors are logged: {}",
        String::from_utf8_lossy(&lost.stderr)
    );
    let m = get(cp, &format!("/admin/v1/models/{MODEL_PATH}"), op);
    assert_eq!(
        m["visibility"], "public",
        "a network error flipped the model: {m}"
    );

    // The fault: every answer after the 10th on the decode worker is
    // wrong. The prober's first round records its golden answers (4
    // requests) and sends its canaries (6 or 7 more): by its end the fault
    // is in force, and the next round must find it.
    let until = Instant::now() + Duration::from_secs(120);
    while prober_metric(metrics, "bulkhead_prober_checks_total", "check=\"canary\"") < 1.0 {
        assert!(Instant::now() < until, "the prober never finished a round");
        std::thread::sleep(Duration::from_millis(100));
    }
    let round_one = Instant::now();
    // One interval, one round (a few seconds of model calls) and the flip.
    let limit = Duration::from_secs(interval) + Duration::from_secs(30);
    let private = loop {
        let m = get(cp, &format!("/admin/v1/models/{MODEL_PATH}"), op);
        if m["visibility"] == "private" {
            break round_one.elapsed();
        }
        assert!(
            round_one.elapsed() < limit,
            "the prober did not withdraw the model within {limit:?} of its first round: {m}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!("withdrawn {private:?} after the first round ended (probe interval {interval} s)");
    assert!(prober_metric(metrics, "bulkhead_prober_findings_total", "") >= 1.0);
    // The prober counts the withdrawal once the control plane has answered
    // the flip, which may be a moment after the flip is visible here.
    let until = Instant::now() + Duration::from_secs(10);
    while prober_metric(metrics, "bulkhead_prober_withdrawals_total", "") < 1.0 {
        assert!(Instant::now() < until, "the withdrawal was never counted");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        prober_metric(metrics, "bulkhead_prober_withdrawals_total", ""),
        1.0
    );

    // The flip carries the evidence.
    let audit = get(cp, "/admin/v1/audit?limit=10", op);
    let reason = items(&audit)
        .find(|e| e["subject"] == MODEL && e["after"] == "private")
        .and_then(|e| e["reason"].as_str())
        .unwrap_or_default()
        .to_owned();
    assert!(
        reason.contains("leak prober: golden_answer") && reason.contains("request"),
        "{audit}"
    );
    // A major incident on the status page (which may cache for a while).
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let summary = get(cp, "/api/v2/summary.json", "");
        let open = items(&summary["incidents"]).any(|i| {
            i["impact"] == "major" && i["name"].as_str().is_some_and(|n| n.contains(MODEL))
        });
        if open {
            break;
        }
        assert!(Instant::now() < until, "no incident: {summary}");
        std::thread::sleep(Duration::from_millis(500));
    }
    // The webhook got the finding.
    let body = hooked
        .first_within(Duration::from_secs(10))
        .expect("the prober called the webhook");
    let body: Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(body["model"], MODEL, "{body}");
    assert_eq!(body["check"], "golden_answer", "{body}");

    // No tenant is served by the model any more.
    let a = &creds.accounts[0];
    let path = format!("/client/v4/accounts/{}/ai/run/{MODEL}", a.id);
    let (status, text) = post(
        gw,
        &path,
        &a.token,
        r#"{"prompt": "hello", "max_tokens": 4}"#,
    );
    assert_ne!(status, 200, "{text}");
    assert!(text.contains("No such model"), "{text}");
    // Once only: later rounds see no public model to probe.
    std::thread::sleep(Duration::from_secs(2 * interval));
    assert_eq!(
        prober_metric(metrics, "bulkhead_prober_withdrawals_total", ""),
        1.0
    );
    drop(platform);
}

const EMBED_MODEL: &str = "@cf/sentence-transformers/all-minilm-l6-v2";
const EMBED_PATH: &str = "%40cf%2Fsentence-transformers%2Fall-minilm-l6-v2";

/// The embedding worker's fault: every call after the 7th is answered with
/// the previous call's vectors (another tenant's, as a leak would give
/// them). The prober's first round on the embedding model takes seven
/// calls (the golden vector twice, B's texts alone, then A's marker texts
/// and B's texts three ways, those four at once, so a fault inside them
/// could land on A's call and go unseen); a later round finds B's or the
/// golden text's vectors not their own, and withdraws that model alone.
#[test]
fn the_prober_withdraws_an_embedding_model_whose_vectors_cross_between_calls() {
    let dir = support::platform::data_dir("prober-embed");
    let interval = 2;
    let platform = support::platform::up_with_embeddings(
        &dir,
        &[
            "--models",
            "q4_1",
            "--kv-budget-mib",
            "16",
            "--context-window",
            "512",
            "--max-output",
            "128",
            "--prober-interval-secs",
            &interval.to_string(),
            "--corrupt-embeddings-after",
            "7",
        ],
    );
    let creds = credentials(&dir);
    let (cp, gw, op) = (
        &creds.control_plane_url,
        &creds.gateway_url,
        &creds.operator_token,
    );
    let metrics = &creds.metrics["prober"];
    let until = Instant::now() + Duration::from_secs(180);
    loop {
        let m = get(cp, &format!("/admin/v1/models/{EMBED_PATH}"), op);
        if m["visibility"] == "private" {
            break;
        }
        assert!(
            Instant::now() < until,
            "the prober did not withdraw the embedding model: {m}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // It had passed its checks before the fault began.
    assert!(
        prober_metric(
            metrics,
            "bulkhead_prober_checks_total",
            "check=\"embedding_canary\""
        ) >= 1.0
    );
    // The flip names the check that saw the crossing, with request ids.
    let audit = get(cp, "/admin/v1/audit?limit=20", op);
    let reason = items(&audit)
        .find(|e| e["subject"] == EMBED_MODEL && e["after"] == "private")
        .and_then(|e| e["reason"].as_str())
        .unwrap_or_default()
        .to_owned();
    assert!(
        (reason.contains("leak prober: canary_crossed")
            || reason.contains("leak prober: golden_vector"))
            && reason.contains("request"),
        "{audit}"
    );
    // The fault was injected (the embedding worker counts it) and seen: a
    // finding counted against the embedding model.
    assert!(
        prober_metric(
            &creds.metrics["embed"],
            "bulkhead_test_faults_injected_total",
            "fault=\"embedding_crossed\""
        ) >= 1.0
    );
    assert!(
        prober_metric(
            metrics,
            "bulkhead_prober_findings_total",
            "sentence-transformers"
        ) >= 1.0
    );
    // The generating model, whose answers are right, stays public.
    let m = get(cp, &format!("/admin/v1/models/{MODEL_PATH}"), op);
    assert_eq!(m["visibility"], "public", "{m}");
    // No tenant gets vectors from the withdrawn model.
    let a = &creds.accounts[0];
    let body = serde_json::json!({"model": EMBED_MODEL, "input": "hello"}).to_string();
    let (status, text) = post(gw, "/v1/embeddings", &a.token, &body);
    assert_eq!(status, 404, "{text}");
    drop(platform);
}
