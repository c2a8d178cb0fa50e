//! The end-to-end isolation suite: a platform started the way `bulkhead up`
//! starts it (control plane, prefill and decode workers, gateway, as
//! processes on loopback), two independent accounts, and the 2026 incident
//! replayed from the outside, as a tenant and as a responder would.
//!
//! The platform runs with a small KV pool (16 MiB per worker, about 728
//! tokens) so that "just under" and "just over" the limit are cheap to
//! compute on two cores.

mod support;

use bulkhead_test_support::Request;
use bulkhead_test_support::json::items;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MODEL: &str = "@cf/huggingfacetb/smollm2-135m-instruct";

struct Platform {
    child: Child,
    dir: PathBuf,
    creds: Value,
    internal: Value,
}

impl Drop for Platform {
    fn drop(&mut self) {
        bulkhead_test_support::process::terminate(&mut self.child, Duration::from_secs(10));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `up` on any port, one compute thread, a small pool and limits.
const UP: &str = "up --port 0 --threads 1 --kv-budget-mib 16 --context-window 512 --max-output 128";

fn unique(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{tag}-{}-{nanos:x}", std::process::id())
}

/// The e2e tests share two cores: one platform at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn platform() -> Platform {
    let dir = std::env::temp_dir().join(unique("bulkhead-e2e"));
    *TLS_DIR.lock().unwrap_or_else(|p| p.into_inner()) = Some(dir.join("tls"));
    let child = Command::new(env!("CARGO_BIN_EXE_bulkhead"))
        // The canary test below is the prober's checks by hand: no prober.
        .args(UP.split(' '))
        .args(["--no-prober", "--data-dir"])
        .arg(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("bulkhead up starts");
    // The guard exists before anything can fail, so a panic stops `up`.
    let mut p = Platform {
        child,
        dir,
        creds: Value::Null,
        internal: Value::Null,
    };
    let rx = support::platform::lines_of(p.child.stdout.take().expect("stdout"));
    support::platform::until_summary(&rx);
    let read = |f: &str| -> Value {
        serde_json::from_str(&std::fs::read_to_string(p.dir.join(f)).expect("file")).expect("JSON")
    };
    p.creds = read("credentials.json");
    p.internal = read("internal-tokens.json");
    p
}

/// The platform's CA directory (`up` writes it in its data directory).
/// (Tests run one platform at a time.)
static TLS_DIR: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);

/// The platform's gateway certificate, as a worker's API expects it.
fn gateway_config() -> std::sync::Arc<rustls::ClientConfig> {
    let role = bulkhead_trust::Role::Gateway;
    let dir = TLS_DIR
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .expect("the platform is up");
    bulkhead_trust::Identity::load(&bulkhead_trust::TlsFiles::in_dir(&dir, role), role)
        .expect("gateway identity")
        .client_config(&[
            bulkhead_trust::Role::Decode,
            bulkhead_trust::Role::Colocated,
            bulkhead_trust::Role::Prefill,
        ])
        .expect("config")
}

/// A context for `tenant` signed with the platform's gateway key.
fn signed_context(tenant: u64) -> String {
    let dir = TLS_DIR
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .expect("the platform is up");
    let ring = bulkhead_worker_api::context::SigningKey::load(&dir.join("context.sign"))
        .expect("context keys");
    ring.sign(&bulkhead_worker_api::context::TenantContext::new(
        &"0".repeat(32),
        tenant,
        unique("e2e-call"),
        MODEL,
        None,
        u64::from(u32::MAX),
        None,
        std::time::SystemTime::now(),
    ))
}

/// One exchange: status and body (status 0 when nothing came back).
/// `https://` is a worker's API: mutual TLS with the platform's gateway
/// certificate and, for a generation, the tenant context the gateway
/// would sign.
fn http(url: &str, method: &str, path: &str, token: Option<&str>, body: &str) -> (u16, String) {
    let mut req = Request::at(method, url, path)
        .bearer(token.unwrap_or_default())
        .json(body)
        .timeout(Duration::from_secs(180));
    if url.starts_with("https://") {
        req = req.tls(gateway_config(), "decode.bulkhead.internal");
        if path == "/v1/generate" {
            req = req.header("x-bulkhead-context", &signed_context(9));
        }
    }
    req.send()
        .map_or((0, String::new()), |r| (r.status, r.body))
}

/// Sends a request and reads at least `bytes` of the answer's body before
/// hanging up (0: hang up right after sending). Returns what was read.
fn hang_up(url: &str, path: &str, token: &str, body: &str, bytes: usize) -> String {
    let req = Request::at("POST", url, path)
        .bearer(token)
        .json(body)
        .timeout(Duration::from_secs(60));
    if bytes == 0 {
        req.send_and_hang_up().expect("sent");
        return String::new();
    }
    let mut s = req.stream().expect("an answer");
    s.read_until(|t| t.len() >= bytes).unwrap_or_default()
}

impl Platform {
    fn gw(&self) -> String {
        self.creds["gateway_url"]
            .as_str()
            .expect("gateway_url")
            .to_owned()
    }

    fn cp(&self) -> String {
        self.creds["control_plane_url"]
            .as_str()
            .expect("control_plane_url")
            .to_owned()
    }

    fn account(&self, i: usize) -> (String, String) {
        let a = &self.creds["accounts"][i];
        (
            a["id"].as_str().expect("id").to_owned(),
            a["token"].as_str().expect("token").to_owned(),
        )
    }

    fn run_path(&self, account: &str) -> String {
        format!("/client/v4/accounts/{account}/ai/run/{MODEL}")
    }

    fn operator(&self) -> String {
        self.creds["operator_token"]
            .as_str()
            .expect("operator")
            .to_owned()
    }

    fn nodes(&self) -> Vec<Value> {
        let (s, body) = http(
            &self.cp(),
            "GET",
            "/admin/v1/nodes",
            Some(&self.operator()),
            "",
        );
        assert_eq!(s, 200, "{body}");
        serde_json::from_str::<Value>(&body)
            .expect("nodes")
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    fn node(&self, name: &str) -> Value {
        self.nodes()
            .into_iter()
            .find(|n| n["name"] == name)
            .expect("node")
    }

    /// The smallest KV pool of the two workers, in tokens.
    fn pool(&self) -> u64 {
        self.nodes()
            .iter()
            .filter(|n| n["name"] == "up-prefill" || n["name"] == "up-decode")
            .filter_map(|n| n["kv_pool_tokens"].as_u64())
            .min()
            .expect("pools")
    }

    /// Prompt plus max_tokens a request may have: the model's configured
    /// context window, or the smallest pool if that is smaller.
    fn limit(&self) -> u64 {
        let path = format!(
            "/admin/v1/models/{}",
            MODEL.replace('@', "%40").replace('/', "%2F")
        );
        let (s, body) = http(&self.cp(), "GET", &path, Some(&self.operator()), "");
        assert_eq!(s, 200, "{body}");
        let model: Value = serde_json::from_str(&body).expect("model");
        self.pool().min(
            model["properties"]["context_window"]
                .as_u64()
                .expect("context window"),
        )
    }

    fn bulkhead(&self, args: &[&str]) -> Output {
        let out = Command::new(env!("CARGO_BIN_EXE_bulkhead"))
            .args(args)
            .arg("--data-dir")
            .arg(&self.dir)
            .env_remove("BULKHEAD_CONTROL_PLANE_URL")
            .env_remove("BULKHEAD_TOKEN")
            .output()
            .expect("bulkhead runs");
        Output {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

struct Output {
    ok: bool,
    stdout: String,
    stderr: String,
}

fn stats_at_baseline(url: &str) -> bool {
    let (s, body) = http(url, "GET", "/stats", None, "");
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let p = &v["pool"];
    let e = &v["engine"];
    s == 200
        && p["free_pages"] == p["total_pages"]
        && p["allocated_pages"] == 0
        && p["receiving_pages"] == 0
        && e["running"] == 0
        && e["draining_transfers"] == 0
        && e["held_transfers"] == 0
}

fn wait_baseline(url: &str) {
    let until = Instant::now() + Duration::from_secs(30);
    while !stats_at_baseline(url) {
        assert!(Instant::now() < until, "{url} never returned to baseline");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Everything a client can read in an answer: the raw bytes, and the text of
/// SSE events joined up (a canary split across events is still found).
fn visible(body: &str) -> String {
    let mut joined = String::new();
    for event in body.split("\n\n") {
        let Some(v) = event
            .strip_prefix("data: ")
            .and_then(|d| serde_json::from_str::<Value>(d).ok())
        else {
            continue;
        };
        for t in [
            &v["response"],
            &v["choices"][0]["delta"]["content"],
            &v["choices"][0]["text"],
        ] {
            if let Some(t) = t.as_str() {
                joined.push_str(t);
            }
        }
    }
    format!("{body}\n{joined}")
}

/// `n` tokens of raw text ("hello" is one token, " hello" another).
fn words(n: u64) -> String {
    let mut s = String::from("hello");
    for _ in 1..n {
        s.push_str(" hello");
    }
    s
}

#[test]
fn no_response_b_can_see_ever_carries_as_canary_and_every_over_long_prompt_is_refused() {
    let _serial = serial();
    let p = platform();
    let gw = p.gw();
    let (a_id, a_tok) = p.account(0);
    let (b_id, b_tok) = p.account(1);
    let limit = p.limit();
    // Calibrate: "hello hello …" is one token per word.
    let (s, body) = http(
        &gw,
        "POST",
        &p.run_path(&b_id),
        Some(&b_tok),
        &json!({"prompt": words(10), "raw": true, "max_tokens": 1}).to_string(),
    );
    assert_eq!(s, 200, "{body}");
    let v: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["result"]["usage"]["prompt_tokens"], 10, "{v}");

    let canaries: Vec<String> = (0..4)
        .map(|i| {
            let tag: String = unique("c")
                .replace('-', "")
                .chars()
                .rev()
                .take(10)
                .collect();
            format!("CANARY{i}x{tag}")
        })
        .collect();
    let b_done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let a = {
        let (gw, path, tok, canaries) = (gw.clone(), p.run_path(&a_id), a_tok, canaries.clone());
        let b_done = std::sync::Arc::clone(&b_done);
        std::thread::spawn(move || {
            // A keeps going until B is done, so their requests overlap.
            let (mut sent, mut echoed) = (0usize, 0usize);
            while sent < canaries.len() || !b_done.load(std::sync::atomic::Ordering::Acquire) {
                let c = &canaries[sent % canaries.len()];
                let body = json!({"prompt": format!("{c} {c} {c} {c}"), "raw": true, "max_tokens": 24,
                                  "temperature": 0, "stream": sent % 2 == 1});
                let (s, text) = http(&gw, "POST", &path, Some(&tok), &body.to_string());
                assert_eq!(s, 200, "A: {text}");
                if visible(&text).contains(c.as_str()) {
                    echoed += 1;
                }
                sent += 1;
            }
            (sent, echoed)
        })
    };
    // B, interleaved: normal, just under, just over, aborted and disconnected requests.
    let max = 8u64;
    let mut seen = Vec::new();
    let path = p.run_path(&b_id);
    for round in 0..3 {
        let normal = json!({"prompt": "Tell me about the sea.", "max_tokens": 16, "temperature": 0, "stream": round == 1});
        let (s, text) = http(&gw, "POST", &path, Some(&b_tok), &normal.to_string());
        assert_eq!(s, 200, "B normal: {text}");
        seen.push(text);
        let over_body =
            json!({"prompt": words(limit - max + 1 + round), "raw": true, "max_tokens": max});
        let (s, text) = http(&gw, "POST", &path, Some(&b_tok), &over_body.to_string());
        assert_eq!(
            s, 413,
            "B just over the limit must be refused, never answered: {text}"
        );
        assert!(text.contains("5021"), "{text}");
        seen.push(text);
        let (s, text) = http(&gw, "POST", "/v1/chat/completions", Some(&b_tok), &json!({"model": MODEL,
            "messages": [{"role": "user", "content": words(limit + 50 * round)}], "max_tokens": max}).to_string());
        assert_eq!(s, 400, "{text}");
        assert!(text.contains("context_length_exceeded"), "{text}");
        seen.push(text);
        seen.push(hang_up(
            &gw,
            &path,
            &b_tok,
            &json!({"prompt": "Count to fifty.", "max_tokens": 64, "stream": true}).to_string(),
            300,
        ));
        seen.push(hang_up(&gw, "/v1/chat/completions", &b_tok,
            &json!({"model": MODEL, "messages": [{"role": "user", "content": "Write a long poem."}], "max_tokens": 64}).to_string(), 0));
    }
    let under =
        json!({"prompt": words(limit - max), "raw": true, "max_tokens": max, "temperature": 0});
    let (s, text) = http(&gw, "POST", &path, Some(&b_tok), &under.to_string());
    assert_eq!(
        s, 200,
        "B just under (exactly at) the limit is served: {text}"
    );
    let v: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(
        v["result"]["usage"]["prompt_tokens"].as_u64(),
        Some(limit - max)
    );
    seen.push(text);
    b_done.store(true, std::sync::atomic::Ordering::Release);
    let (sent, echoed) = a.join().expect("A's requests");
    // The detector can fire: A's own answers carry A's canaries.
    assert!(
        sent >= canaries.len() && echoed == sent,
        "A sent {sent}, saw its canary in {echoed}"
    );
    for text in &seen {
        let text = visible(text);
        for c in &canaries {
            assert!(!text.contains(c.as_str()), "B saw A's canary {c}: {text}");
        }
    }
    // After all that traffic the pools' pages have been reused many times:
    // greedy answers still equal llama.cpp's golden outputs.
    golden_answers(&p);
    // Every page came back on both workers.
    for name in ["up-prefill", "up-decode"] {
        let addr = format!(
            "https://{}",
            p.node(name)["address"].as_str().expect("address")
        );
        wait_baseline(&addr);
    }
}

#[test]
fn the_incident_replayed_is_stopped_at_every_step() {
    let _serial = serial();
    let p = platform();
    let admin = p.internal["admin"].as_str().expect("admin").to_owned();
    let node_token = p.internal["node"].as_str().expect("node").to_owned();
    let slug = MODEL.replace('@', "%40").replace('/', "%2F");

    // 1. A config whose context window exceeds a node's KV pool is refused.
    let cfg = json!({"context_window": 1_048_576, "max_output": 4096, "weights_file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "weights_sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", "quantization": "q4_1",
        "page_size": 16, "kv_budget": {"prefill_bytes": 16 << 20, "decode_bytes": 16 << 20}});
    let (s, body) = http(
        &p.cp(),
        "POST",
        &format!("/admin/v1/models/{slug}/configs"),
        Some(&admin),
        &cfg.to_string(),
    );
    assert_eq!(s, 201, "{body}");
    let version = serde_json::from_str::<Value>(&body).expect("JSON")["version"]
        .as_u64()
        .expect("version");
    let (s, body) = http(
        &p.cp(),
        "POST",
        &format!("/admin/v1/models/{slug}/configs/{version}/activate"),
        Some(&admin),
        "",
    );
    assert_eq!(s, 409, "{body}");
    assert!(
        body.contains("up-prefill") || body.contains("up-decode"),
        "names the node: {body}"
    );
    assert!(body.contains("1048576"), "{body}");

    // 2. A worker started with a smaller pool than the registered config is unroutable.
    let mut small = Command::new(env!("CARGO_BIN_EXE_bulkhead"))
        .args([
            "serve",
            "--http",
            "127.0.0.1:0",
            "--kv-budget-mib",
            "4",
            "--threads",
            "1",
            "--control-plane",
            p.creds["internal_url"].as_str().expect("internal URL"),
        ])
        .args(["--node-token", &node_token, "--node-name", "small-worker"])
        .env("BULKHEAD_TLS_DIR", p.dir.join("tls"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("serve");
    let mut line = String::new();
    BufReader::new(small.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("announce");
    let n = p.node("small-worker");
    let _ = small.kill();
    let _ = small.wait();
    assert_eq!(n["routable"], false, "{n}");
    let why = n["unroutable_reason"].as_str().unwrap_or_default();
    assert!(why.contains("smaller than context window 512"), "{n}");

    // 3. A prompt longer than the pool, straight to a worker, is refused before allocation.
    let decode = format!(
        "https://{}",
        p.node("up-decode")["address"].as_str().expect("address")
    );
    let before: Value =
        serde_json::from_str(&http(&decode, "GET", "/stats", None, "").1).expect("stats");
    let over = p.pool() + 100;
    let (s, body) = http(
        &decode,
        "POST",
        "/v1/generate",
        None,
        &json!({"raw": words(over), "max_tokens": 1}).to_string(),
    );
    assert_eq!(s, 400, "{body}");
    assert!(body.contains("context_length_exceeded"), "{body}");
    let after: Value =
        serde_json::from_str(&http(&decode, "GET", "/stats", None, "").1).expect("stats");
    assert_eq!(
        after["pool"]["allocations"], before["pool"]["allocations"],
        "nothing was allocated"
    );
    assert_eq!(
        after["transfer"]["started"], before["transfer"]["started"],
        "nothing was transferred"
    );

    // 4. Greedy answers through the whole platform equal llama.cpp's golden outputs,
    //    so a stale-page answer would fail even with a 200.
    golden_answers(&p);
}

/// Greedy answers through the whole platform equal llama.cpp's golden
/// outputs for the golden file's prompts.
fn golden_answers(p: &Platform) {
    let golden: Value = support::golden();
    let (a_id, a_tok) = p.account(0);
    let mut checked = 0;
    for case in golden["cases"].as_array().expect("cases") {
        let body = match case.get("messages") {
            Some(m) => json!({"messages": m, "max_tokens": 32, "temperature": 0}),
            None => {
                json!({"prompt": case["prompt"], "raw": true, "max_tokens": 32, "temperature": 0})
            }
        };
        let (s, text) = http(
            &p.gw(),
            "POST",
            &p.run_path(&a_id),
            Some(&a_tok),
            &body.to_string(),
        );
        assert_eq!(s, 200, "{text}");
        let v: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(
            v["result"]["response"], case["greedy_text_until_eos"],
            "case {}",
            case["name"]
        );
        checked += 1;
    }
    assert_eq!(checked, 4);
}

#[test]
fn a_responder_flips_the_model_private_tells_the_world_and_restores_it() {
    let _serial = serial();
    let p = platform();
    let gw = p.gw();
    let (a_id, a_tok) = p.account(0);
    let (b_id, b_tok) = p.account(1);
    let ask = json!({"messages": [{"role": "system", "content": "You are a helpful assistant."},
                                   {"role": "user", "content": "What is the capital of France?"}], "max_tokens": 16, "temperature": 0})
    .to_string();
    assert_eq!(
        http(&gw, "POST", &p.run_path(&a_id), Some(&a_tok), &ask).0,
        200
    );
    // B stays allowed while the model is private.
    let slug = MODEL.replace('@', "%40").replace('/', "%2F");
    let (s, body) = http(
        &p.cp(),
        "POST",
        &format!("/admin/v1/models/{slug}/allowlist"),
        Some(&p.operator()),
        &json!({"account_id": b_id, "allowed": true, "reason": "B verifies the fix"}).to_string(),
    );
    assert_eq!(s, 200, "{body}");

    let flipped = Instant::now();
    let out = p.bulkhead(&[
        "model",
        "private",
        MODEL,
        "--reason",
        "INC-1: suspected cross-tenant output",
    ]);
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stdout.contains("is now private"), "{}", out.stdout);
    // Within the same second, A's calls fail as not found, in both APIs.
    let (s, body) = http(&gw, "POST", &p.run_path(&a_id), Some(&a_tok), &ask);
    assert_eq!(s, 400, "{body}");
    assert!(body.contains("5007"), "{body}");
    let (s, body) = http(
        &gw,
        "POST",
        "/v1/chat/completions",
        Some(&a_tok),
        &json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
            .to_string(),
    );
    assert_eq!(s, 404, "{body}");
    assert!(
        flipped.elapsed() < Duration::from_secs(1),
        "not found within the same second"
    );
    // The allowlisted account still gets answers.
    let (s, body) = http(&gw, "POST", &p.run_path(&b_id), Some(&b_tok), &ask);
    assert_eq!(s, 200, "{body}");
    assert!(body.contains("Paris"), "{body}");

    // The incident appears on the status feeds.
    let out = p.bulkhead(&[
        "incident",
        "open",
        "--name",
        "Cross-tenant output suspected",
        "--impact",
        "critical",
        "--body",
        "The model is private while we investigate.",
        "--component",
        &format!("{MODEL}=major_outage"),
        "--json",
    ]);
    assert!(out.ok, "{}", out.stderr);
    let id = serde_json::from_str::<Value>(&out.stdout).expect("JSON")["id"]
        .as_i64()
        .expect("id")
        .to_string();
    let status = p.creds["status_url"]
        .as_str()
        .expect("status_url")
        .to_owned();
    // The status page caches for up to a second.
    std::thread::sleep(Duration::from_millis(1100));
    let (_, summary) = http(&status, "GET", "/api/v2/summary.json", None, "");
    let v: Value = serde_json::from_str(&summary).expect("summary");
    assert_eq!(v["status"]["indicator"], "critical", "{v}");
    assert_eq!(v["incidents"][0]["name"], "Cross-tenant output suspected");
    assert_eq!(v["components"][0]["status"], "major_outage");
    let (_, atom) = http(&status, "GET", "/history.atom", None, "");
    assert!(atom.contains("Cross-tenant output suspected"), "{atom}");
    let (_, rss) = http(&status, "GET", "/history.rss", None, "");
    assert!(rss.contains("Cross-tenant output suspected"), "{rss}");

    // Flip back, resolve: A is served again and the page is green.
    let out = p.bulkhead(&[
        "model",
        "public",
        MODEL,
        "--reason",
        "fixed: pool checked against the context window",
    ]);
    assert!(out.ok, "{}", out.stderr);
    let (s, body) = http(&gw, "POST", &p.run_path(&a_id), Some(&a_tok), &ask);
    assert_eq!(s, 200, "{body}");
    let out = p.bulkhead(&["incident", "resolve", &id, "--body", "Resolved."]);
    assert!(out.ok, "{}", out.stderr);
    std::thread::sleep(Duration::from_millis(1100));
    let (_, unresolved) = http(
        &status,
        "GET",
        "/api/v2/incidents/unresolved.json",
        None,
        "",
    );
    assert_eq!(
        serde_json::from_str::<Value>(&unresolved).expect("JSON")["incidents"],
        json!([])
    );
    let (_, st) = http(&status, "GET", "/api/v2/status.json", None, "");
    assert_eq!(
        serde_json::from_str::<Value>(&st).expect("JSON")["status"]["indicator"],
        "none"
    );
    // Both flips are in the audit log with the responder and the reasons.
    let out = p.bulkhead(&["audit", "--json"]);
    let log: Value = serde_json::from_str(&out.stdout).expect("audit JSON");
    let reasons: Vec<&str> = items(&log)
        .filter(|e| e["action"] == "model.visibility")
        .filter_map(|e| e["reason"].as_str())
        .collect();
    assert_eq!(
        reasons,
        vec![
            "fixed: pool checked against the context window",
            "INC-1: suspected cross-tenant output"
        ]
    );
}
