//! Self-healing under load: `bulkhead up` with two prefill and two decode
//! workers, clients streaming and not streaming through the gateway, and
//! each kind of component killed with SIGKILL in turn (a decode worker, a
//! prefill worker, the gateway, the control plane). Each comes back on its
//! addresses and re-registers; only requests in flight on it fail, and they
//! fail cleanly (an error event and no `[DONE]`, or an error in the API's
//! shape; for the gateway itself, a cut connection); no HTTP 200 ends early
//! without saying so; every KV pool returns to its baseline.

mod support;

use bulkhead_test_support::json::items;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use support::platform::{child_pid, credentials, data_dir, find_child_pid, get, try_call, up};

/// How one request ended.
#[derive(Debug)]
enum Outcome {
    /// A complete answer: a JSON result, or a stream that ended with `[DONE]`.
    Complete,
    /// A clean failure: an error event in the stream (no `[DONE]`) or an
    /// error status with an error body.
    Failed(String),
    /// The connection was refused or cut (only the gateway's own death may
    /// do this).
    Cut(String),
    /// Anything else: a 200 that stopped early without an error, a 4xx.
    Wrong(String),
}

struct Ended {
    started: Instant,
    ended: Instant,
    outcome: Outcome,
}

fn classify(stream: bool, r: std::io::Result<(u16, String)>) -> Outcome {
    let (status, body) = match r {
        Ok(r) => r,
        Err(e) => return Outcome::Cut(e.to_string()),
    };
    match (status, stream) {
        (200, true) if body.contains("data: [DONE]") => {
            if body.contains("\"error\"") {
                Outcome::Wrong(format!("an error event and [DONE]: {body}"))
            } else {
                Outcome::Complete
            }
        }
        (200, true) if body.contains("\"error\"") => Outcome::Failed(body),
        (200, true) => Outcome::Cut(format!("stream ended without [DONE] or error: {body}")),
        (200, false) => match serde_json::from_str::<Value>(&body) {
            Ok(v) if v["choices"][0]["message"]["content"].is_string() => Outcome::Complete,
            Ok(v) => Outcome::Wrong(format!("a 200 without an answer: {v}")),
            Err(_) => Outcome::Cut(format!("a 200 with a partial body: {body}")),
        },
        (s, _) if s >= 500 && body.contains("\"error\"") => Outcome::Failed(body),
        (s, _) => Outcome::Wrong(format!("HTTP {s}: {body}")),
    }
}

/// Clients sending requests back to back until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    clients: Vec<std::thread::JoinHandle<Vec<Ended>>>,
}

impl Load {
    fn start(gateway: &str, token: &str, clients: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let clients = (0..clients)
            .map(|c| {
                let (gw, token, stop) = (gateway.to_owned(), token.to_owned(), Arc::clone(&stop));
                std::thread::spawn(move || {
                    let mut out = Vec::new();
                    let mut n = 0usize;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let stream = (n + c).is_multiple_of(2);
                        let body = json!({
                            "model": "@cf/huggingfacetb/smollm2-135m-instruct",
                            "messages": [{"role": "user", "content": format!("Count to {n}, client {c}.")}],
                            "max_tokens": 24, "temperature": 0, "stream": stream,
                        })
                        .to_string();
                        let started = Instant::now();
                        let r = try_call(&gw, "POST", "/v1/chat/completions", &token, &body);
                        let outcome = classify(stream, r);
                        if matches!(outcome, Outcome::Cut(_)) {
                            // The gateway is down: do not spin.
                            std::thread::sleep(Duration::from_millis(100));
                        }
                        out.push(Ended {
                            started,
                            ended: Instant::now(),
                            outcome,
                        });
                    }
                    out
                })
            })
            .collect();
        Load { stop, clients }
    }

    fn finish(self) -> Vec<Ended> {
        self.stop.store(true, Ordering::Relaxed);
        self.clients
            .into_iter()
            .flat_map(|c| c.join().expect("client"))
            .collect()
    }
}

/// Every worker node, by name: (HTTP address, routable).
fn workers(cp: &str, op: &str) -> Vec<(String, String, bool)> {
    let all = get(cp, "/admin/v1/nodes", op);
    for n in items(&all) {
        if let Some(why) = n["unroutable_reason"].as_str() {
            eprintln!("{} is not routable: {why}", n["name"]);
        }
    }
    get(cp, "/admin/v1/nodes", op)
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|n| {
            (
                n["name"].as_str().unwrap_or_default().to_owned(),
                n["address"].as_str().unwrap_or_default().to_owned(),
                n["routable"] == true,
            )
        })
        .collect()
}

fn at_baseline(addr: &str) -> bool {
    let Ok((200, body)) = try_call(&format!("https://{addr}"), "GET", "/stats", "", "") else {
        return false;
    };
    let Ok(s) = serde_json::from_str::<Value>(&body) else {
        return false;
    };
    let (p, e) = (&s["pool"], &s["engine"]);
    p["free_pages"] == p["total_pages"]
        && p["receiving_pages"] == 0
        && e["draining_transfers"] == 0
        && e["held_transfers"] == 0
        && e["running"] == 0
}

fn wait_until(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < until, "{what} within {secs} s");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn each_component_killed_under_load_comes_back_and_costs_only_its_own_requests() {
    let dir = data_dir("supervise");
    let u = up(
        &dir,
        &[
            "--models",
            "q4_1",
            "--prefill-workers",
            "2",
            "--decode-workers",
            "2",
            "--kv-budget-mib",
            "128",
            // A worker restarted under this load measures its prefill speed
            // slower than at first; the prefill deadline is not what this
            // test is about (tests/control_plane.rs and control-plane/tests
            // cover it), so it must not make the restarted one unroutable.
            "--prefill-deadline-secs",
            "3600",
            "--context-window",
            "2048",
            "--max-output",
            "256",
        ],
    );
    let creds = credentials(&dir);
    let (gw, cp) = (&creds.gateway_url, &creds.control_plane_url);
    let (op, token) = (&creds.operator_token, &creds.accounts[0].token);
    assert_eq!(
        workers(cp, op).len(),
        4,
        "two prefill and two decode workers"
    );

    for (role, needle, node) in [
        ("decode", "--node-name up-decode ", Some("up-decode")),
        ("prefill", "--node-name up-prefill ", Some("up-prefill")),
        ("gateway", "", None),
        ("control-plane", "", None),
    ] {
        let load = Load::start(gw, token, 3);
        std::thread::sleep(Duration::from_millis(2500));
        let pid = child_pid(u.child.id(), role, needle);
        let killed_at = Instant::now();
        let status = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "the {role} was killed");
        // It comes back: a new process, and a worker registers again.
        wait_until(&format!("a new {role}"), 90, || {
            find_child_pid(u.child.id(), role, needle).is_some_and(|p| p != pid)
        });
        if let Some(name) = node {
            // The new process answers on the old address (it registers
            // before it listens), and the control plane routes to it.
            let addr = workers(cp, op)
                .into_iter()
                .find(|(n, _, _)| n == name)
                .map(|(_, a, _)| a)
                .expect("registered");
            wait_until(&format!("{name} back and routable"), 90, || {
                matches!(
                    try_call(&format!("https://{addr}"), "GET", "/health", "", ""),
                    Ok((200, _))
                ) && workers(cp, op).iter().any(|(n, _, r)| n == name && *r)
            });
        }
        if role == "gateway" {
            // Back means answering, not only a new process: a client that
            // connects before the new gateway listens is refused, and that
            // belongs to the gateway's death, before `back_at`.
            wait_until("the gateway back and answering", 90, || {
                matches!(try_call(gw, "GET", "/health", "", ""), Ok((200, _)))
            });
        }
        let back_at = Instant::now();
        std::thread::sleep(Duration::from_millis(3000));
        let ended = load.finish();
        let (mut complete, mut failed, mut cut, mut after) = (0, 0, 0, 0);
        for e in &ended {
            let in_flight = e.started <= killed_at && e.ended >= killed_at;
            match &e.outcome {
                Outcome::Complete => {
                    complete += 1;
                    if e.started >= back_at {
                        after += 1;
                    }
                }
                Outcome::Failed(why) => {
                    assert!(
                        in_flight || e.started >= killed_at && e.started < back_at,
                        "{role}: a request not near the kill failed: {why}"
                    );
                    failed += 1;
                }
                Outcome::Cut(why) => {
                    assert_eq!(role, "gateway", "{role}: a connection was cut: {why}");
                    assert!(
                        e.ended >= killed_at && e.started < back_at,
                        "a cut connection not during the gateway's death: {why}"
                    );
                    cut += 1;
                }
                Outcome::Wrong(why) => panic!("{role}: {why}"),
            }
        }
        if role == "control-plane" {
            assert_eq!(
                failed + cut,
                0,
                "gateways and workers serve through a control-plane restart"
            );
        }
        if role == "gateway" {
            assert!(
                cut >= 1,
                "the gateway's death was felt (the fault happened)"
            );
        }
        assert!(after >= 1, "{role}: requests succeed once it is back");
        eprintln!(
            "killed the {role}: {} requests, {complete} complete, {failed} failed cleanly, \
             {cut} cut; back after {:.1} s",
            ended.len(),
            (back_at - killed_at).as_secs_f64()
        );
    }
    // Every pool is back at its baseline.
    for (name, addr, _) in workers(cp, op) {
        wait_until(&format!("{name} at baseline"), 30, || at_baseline(&addr));
    }
    drop(u);
    let _ = std::fs::remove_dir_all(&dir);
}
