//! `bulkhead up` as a user runs it: the whole platform from one command,
//! the printed curl request answered by the real model through the gateway
//! and a disaggregated prefill/decode pair, responders' commands working
//! from the credentials it wrote, a clean stop on SIGTERM, and a second `up`
//! reusing the same accounts and tokens.
//!
//! One platform is started for all of it (the expensive part); each
//! behaviour is a named check in [`CHECKS`], run in turn whatever an
//! earlier one did, and the test fails naming every check that failed.

mod support;

use bulkhead_test_support::json::items;
use serde_json::Value;
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;
use support::platform::{Up, bulkhead, child_pid, get, post, succeeds};

fn up(dir: &std::path::Path) -> Up {
    // The prober runs, as by default; one round, so that the exact counts
    // below are this test's own.
    let u = support::platform::up(dir, &["--prober-interval-secs", "3600"]);
    prober_checked(dir);
    u
}

/// Waits until the prober finished its first round on both models: golden
/// answers recorded (or compared, on a second `up`) and canaries clean.
fn prober_checked(dir: &std::path::Path) {
    let creds = support::platform::credentials(dir);
    let url = &creds.metrics["prober"];
    let until = std::time::Instant::now() + Duration::from_secs(300);
    loop {
        let (base, path) = url.split_at(url.find("/metrics").expect("a /metrics URL"));
        let text = support::platform::try_call(base, "GET", path, "", "")
            .map(|(_, t)| t)
            .unwrap_or_default();
        let canaries: f64 = text
            .lines()
            .filter(|l| {
                l.starts_with("bulkhead_prober_checks_total") && l.contains("check=\"canary\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        assert!(
            !text.contains("bulkhead_prober_findings_total"),
            "the prober found something on a healthy platform: {text}"
        );
        if canaries >= 2.0 {
            return;
        }
        assert!(
            std::time::Instant::now() < until,
            "the prober never finished a round: {text}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Text the default model's tokenizer turns into exactly `n` tokens.
fn text_of_tokens(n: usize) -> String {
    use std::sync::OnceLock;
    static MODEL: OnceLock<bulkhead_engine::ModelFile> = OnceLock::new();
    let model = MODEL.get_or_init(|| {
        use bulkhead_engine::fetch::{Progress, Source, ensure_default_model};
        let source = Source::from_vars(|k| std::env::var_os(k), Progress::Quiet);
        let path = ensure_default_model(&source).expect("model");
        bulkhead_engine::ModelFile::load(&path).expect("model loads")
    });
    let count = |t: &str| model.tokenizer().encode(t).expect("tokenizes").len();
    let mut words = n;
    loop {
        let text = format!("the{}", " the".repeat(words.saturating_sub(1)));
        let got = count(&text);
        if got == n {
            return text;
        }
        assert!(words > 0 && words < 4 * n + 8, "no text of {n} tokens");
        words = if got > n { words - 1 } else { words + 1 };
    }
}

fn stop(mut u: Up, urls: &[&String]) {
    let pid = u.child.id().to_string();
    let status = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(status.success());
    let exit = u.child.wait().expect("up exits");
    assert!(exit.success(), "up stops cleanly on SIGTERM: {exit:?}");
    // Every component is gone with it.
    for url in urls {
        let addr = url.trim_start_matches("http://");
        assert!(
            TcpStream::connect(addr).is_err(),
            "{url} still answers after up stopped"
        );
    }
}

/// The first `up` and what its checks read.
struct Ctx {
    dir: std::path::PathBuf,
    first: Up,
    creds: Value,
    accounts: Vec<Value>,
    gw: String,
    model: String,
    /// Workers AI's run path of the default model for the first account.
    path: String,
    /// The body of the printed curl line.
    body: String,
}

impl Ctx {
    fn start(dir: std::path::PathBuf) -> Ctx {
        let first = up(&dir);
        let creds: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("credentials.json")).expect("credentials.json"),
        )
        .expect("JSON");
        let accounts = creds["accounts"].as_array().expect("accounts").clone();
        let gw = creds["gateway_url"].as_str().unwrap_or_default().to_owned();
        let model = creds["model"].as_str().unwrap_or_default().to_owned();
        let path = format!(
            "/client/v4/accounts/{}/ai/run/{model}",
            accounts[0]["id"].as_str().unwrap_or_default()
        );
        let body = first
            .lines
            .iter()
            .find_map(|l| l.split("-d '").nth(1)?.strip_suffix('\''))
            .expect("the printed curl line has a body")
            .to_owned();
        Ctx {
            dir,
            first,
            creds,
            accounts,
            gw,
            model,
            path,
            body,
        }
    }

    /// A responder command (`up`'s operator token) against `url`.
    fn responder(&self, args: &[&str], url: &str) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_bulkhead"))
            .args(args)
            .env("BULKHEAD_CONTROL_PLANE_URL", url)
            .env(
                "BULKHEAD_TOKEN",
                self.creds["operator_token"].as_str().unwrap_or_default(),
            )
            .output()
            .expect("bulkhead runs")
    }
}

/// One check of the first `up`.
type Check = fn(&Ctx);

/// Every check of the first `up`, by name, in the order they run (the
/// later ones restart a worker and stop a gateway for a moment).
const CHECKS: &[(&str, Check)] = &[
    (
        "credentials_name_every_url_token_and_the_sentinels",
        credentials_name_every_url_token_and_the_sentinels,
    ),
    (
        "worker_certificates_are_scoped_to_their_model_and_pool",
        worker_certificates_are_scoped_to_their_model_and_pool,
    ),
    (
        "the_credential_files_are_private",
        the_credential_files_are_private,
    ),
    (
        "a_second_up_on_the_same_directory_is_refused_while_one_runs",
        a_second_up_on_the_same_directory_is_refused_while_one_runs,
    ),
    (
        "no_command_line_holds_a_secret",
        no_command_line_holds_a_secret,
    ),
    (
        "the_printed_curl_line_gets_a_sensible_answer",
        the_printed_curl_line_gets_a_sensible_answer,
    ),
    (
        "tenant_port_status_page_and_metrics_speak_http2_in_clear_text",
        tenant_port_status_page_and_metrics_speak_http2_in_clear_text,
    ),
    (
        "each_model_has_its_own_workers_and_a_flip_hides_only_one",
        each_model_has_its_own_workers_and_a_flip_hides_only_one,
    ),
    (
        "a_prompt_at_the_full_window_is_served_and_one_token_more_refused",
        a_prompt_at_the_full_window_is_served_and_one_token_more_refused,
    ),
    (
        "another_account_cannot_use_a_url_and_responders_read_credentials",
        another_account_cannot_use_a_url_and_responders_read_credentials,
    ),
    (
        "a_killed_decode_worker_is_restarted_and_the_platform_serves_again",
        a_killed_decode_worker_is_restarted_and_the_platform_serves_again,
    ),
    (
        "responder_commands_pointed_at_the_gateway_say_so",
        responder_commands_pointed_at_the_gateway_say_so,
    ),
    (
        "a_flip_a_stopped_gateway_never_applies_fails_saying_so",
        a_flip_a_stopped_gateway_never_applies_fails_saying_so,
    ),
];

#[test]
fn up_starts_the_platform_and_a_second_up_reuses_its_data() {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = std::env::temp_dir().join(format!("bulkhead-up-{}-{nanos}", std::process::id()));
    let c = Ctx::start(dir.clone());
    let mut checks = support::Checks::default();
    for (name, check) in CHECKS {
        checks.run(name, || check(&c));
    }
    let Ctx {
        first,
        creds,
        accounts,
        gw,
        path,
        body,
        ..
    } = c;
    let cp = creds["control_plane_url"].as_str().unwrap_or_default();
    stop(first, &[&gw, &cp.to_owned()]);

    // A second `up` keeps the accounts and their tokens.
    let second = up(&dir);
    let again: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("credentials.json")).expect("credentials.json"),
    )
    .expect("JSON");
    assert_eq!(again["accounts"], Value::Array(accounts.clone()));
    assert_eq!(again["operator_token"], creds["operator_token"]);
    let gw = again["gateway_url"].as_str().unwrap_or_default().to_owned();
    let token = accounts[0]["token"].as_str().unwrap_or_default();
    let (status, text) = post(&gw, &path, token, &body);
    assert_eq!(status, 200, "{text}");
    let cp = again["control_plane_url"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    stop(second, &[&gw, &cp]);
    let _ = std::fs::remove_dir_all(&dir);
    checks.finish();
}

/// `credentials.json` names every URL and token; the prober's two accounts
/// are marked as sentinels, the tenants' not.
fn credentials_name_every_url_token_and_the_sentinels(c: &Ctx) {
    let creds = &c.creds;
    for key in [
        "gateway_url",
        "control_plane_url",
        "status_url",
        "operator_token",
        "model",
    ] {
        assert!(
            creds[key].as_str().is_some_and(|v| !v.is_empty()),
            "{key} in {creds}"
        );
    }
    let accounts = creds["accounts"].as_array().expect("accounts").clone();
    assert_eq!(accounts.len(), 2);
    // The prober's two accounts are marked as sentinels; the tenants' not.
    let listed = get(
        creds["control_plane_url"].as_str().unwrap_or_default(),
        "/admin/v1/accounts",
        creds["operator_token"].as_str().unwrap_or_default(),
    );
    // Accounts created in the same millisecond list in no fixed order.
    let mut sentinels: Vec<&str> = items(&listed)
        .filter(|a| a["sentinel"] == true)
        .filter_map(|a| a["name"].as_str())
        .collect();
    sentinels.sort_unstable();
    assert_eq!(sentinels, ["sentinel-a", "sentinel-b"], "{listed}");
}

/// Every worker's certificate is scoped to its model and its pool.
fn worker_certificates_are_scoped_to_their_model_and_pool(c: &Ctx) {
    let (dir, creds) = (&c.dir, &c.creds);
    // Every worker's certificate is scoped to its model and its pool.
    let tls = dir.join("tls");
    for model in creds["models"].as_array().expect("models") {
        let slug = model.as_str().expect("slug");
        for role in [bulkhead_trust::Role::Prefill, bulkhead_trust::Role::Decode] {
            // The file's name depends on the models alone.
            let files = bulkhead_trust::TlsFiles::scoped_in_dir(
                &tls,
                role,
                &bulkhead_trust::Scope::model(slug, None),
            );
            let id = bulkhead_trust::Identity::load(&files, role)
                .unwrap_or_else(|e| panic!("{role} certificate for {slug}: {e}"));
            assert_eq!(id.scope().models, [slug], "{role} for {slug}");
            // 512 MiB of f16 KV for this model: 1,456 pages of 16 tokens.
            assert_eq!(id.scope().max_kv_tokens, Some(23_296), "{role} for {slug}");
        }
    }
}

/// The files holding tokens are readable by their owner only.
fn the_credential_files_are_private(c: &Ctx) {
    let dir = &c.dir;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        for f in ["credentials.json", "internal-tokens.json"] {
            let mode = std::fs::metadata(dir.join(f))
                .expect("metadata")
                .permissions()
                .mode();
            assert_eq!(mode & 0o077, 0, "{f} is readable by others: {mode:o}");
        }
    }
}

/// A second `up` on the same data directory is refused while one runs.
fn a_second_up_on_the_same_directory_is_refused_while_one_runs(c: &Ctx) {
    let dir = &c.dir;
    // A second `up` on the same data directory is refused while this one runs.
    let out = Command::new(env!("CARGO_BIN_EXE_bulkhead"))
        .args(["up", "--port", "0", "--data-dir"])
        .arg(dir)
        .output()
        .expect("second up");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("another `bulkhead up`"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// No component's command line (readable by every local user) holds a
/// secret.
fn no_command_line_holds_a_secret(c: &Ctx) {
    let (dir, creds, first) = (&c.dir, &c.creds, &c.first);
    // No component's command line (readable by every local user) holds a
    // secret: up passes the internal tokens in the environment.
    let internal: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("internal-tokens.json")).expect("internal tokens"),
    )
    .expect("JSON");
    let secrets: Vec<&str> = ["admin", "gateway", "node"]
        .iter()
        .filter_map(|k| internal[*k].as_str())
        .collect();
    assert_eq!(secrets.len(), 3);
    let children = Command::new("pgrep")
        .args(["-P", &first.child.id().to_string()])
        .output()
        .expect("pgrep");
    let pids: Vec<String> = String::from_utf8_lossy(&children.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert!(
        pids.len() >= 7,
        "control plane, 4 workers, gateway, prober: {pids:?}"
    );
    let sentinels: Vec<&str> = internal["sentinels"]
        .as_array()
        .expect("sentinels")
        .iter()
        .filter_map(|s| s["token"].as_str())
        .collect();
    assert_eq!(sentinels.len(), 2);
    let secrets: Vec<&str> = secrets
        .into_iter()
        .chain(sentinels)
        .chain([creds["operator_token"].as_str().unwrap_or("?")])
        .collect();
    for pid in pids {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        for s in &secrets {
            assert!(!cmdline.contains(s), "a token on the command line of {pid}");
        }
    }
}

/// The printed curl line, as a user pastes it, gets a sensible answer.
fn the_printed_curl_line_gets_a_sensible_answer(c: &Ctx) {
    let (first, gw, model, accounts) = (&c.first, &c.gw, &c.model, &c.accounts);
    // The printed curl line, as a user pastes it, gets a sensible answer.
    let curl: String = first
        .lines
        .iter()
        .find(|l| l.trim_start().starts_with("curl -s "))
        .expect("curl line")
        .clone();
    let body = curl
        .split("-d '")
        .nth(1)
        .and_then(|b| b.strip_suffix('\''))
        .expect("curl body");
    let a = &accounts[0];
    let path = format!(
        "/client/v4/accounts/{}/ai/run/{model}",
        a["id"].as_str().unwrap_or_default()
    );
    assert!(
        curl.contains(&path) && curl.contains(a["token"].as_str().unwrap_or("?")),
        "{curl}"
    );
    let (status, text) = post(gw, &path, a["token"].as_str().unwrap_or_default(), body);
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    assert!(
        v["result"]["response"]
            .as_str()
            .is_some_and(|r| r.contains("Paris")),
        "{v}"
    );
}

/// HTTP/2 in clear text with prior knowledge on the tenant port, the status
/// page and `/metrics`.
fn tenant_port_status_page_and_metrics_speak_http2_in_clear_text(c: &Ctx) {
    let (creds, gw, a, path, body) = (&c.creds, &c.gw, &c.accounts[0], &c.path, c.body.as_str());
    // HTTP/2 in clear text with prior knowledge, as curl speaks it: the
    // tenant port, the status page and /metrics.
    let h2 = |url: &str, extra: &[&str]| -> (String, String) {
        let out = std::process::Command::new("curl")
            .args([
                "-sS",
                "--http2-prior-knowledge",
                "-o",
                "-",
                "-w",
                "\n%{http_version} %{http_code}",
            ])
            .args(extra)
            .arg(url)
            .output()
            .expect("curl runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, tail) = text.rsplit_once('\n').unwrap_or(("", &text));
        assert!(
            out.status.success(),
            "curl {url}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        (tail.to_owned(), body.to_owned())
    };
    let auth = format!(
        "Authorization: Bearer {}",
        a["token"].as_str().unwrap_or_default()
    );
    let (got, text) = h2(
        &format!("{gw}{path}"),
        &[
            "-H",
            &auth,
            "-H",
            "Content-Type: application/json",
            "-d",
            body,
        ],
    );
    assert_eq!(got, "2 200", "{text}");
    assert!(text.contains("Paris"), "{text}");
    let status_url = creds["status_url"].as_str().unwrap_or_default();
    let (got, text) = h2(&format!("{status_url}/api/v2/summary.json"), &[]);
    assert_eq!(got, "2 200", "{text}");
    let metrics_url = creds["metrics"]["gateway"].as_str().unwrap_or_default();
    let (got, text) = h2(metrics_url, &[]);
    assert_eq!(got, "2 200", "{text}");
    assert!(
        text.contains("http_server_request_duration_seconds"),
        "{text}"
    );
}

/// Two models on their own workers; a private flip hides one and leaves the
/// other serving.
fn each_model_has_its_own_workers_and_a_flip_hides_only_one(c: &Ctx) {
    let (dir, creds, accounts, gw, model, a, path, body) = (
        &c.dir,
        &c.creds,
        &c.accounts,
        &c.gw,
        &c.model,
        &c.accounts[0],
        &c.path,
        c.body.as_str(),
    );
    // Two models, each on its own workers: a request by slug reaches only
    // that model's decode worker; flipping one private leaves the other
    // serving; both listings show each account what it may see.
    let cp_url = creds["control_plane_url"].as_str().unwrap_or_default();
    let op = creds["operator_token"].as_str().unwrap_or_default();
    let models: Vec<String> = creds["models"]
        .as_array()
        .expect("models")
        .iter()
        .filter_map(|m| m.as_str().map(str::to_owned))
        .collect();
    let q8 = format!("{model}-q8");
    assert_eq!(models, vec![model.clone(), q8.clone()]);
    let decode_of = |name: &str| -> String {
        get(cp_url, "/admin/v1/nodes", op)
            .as_array()
            .and_then(|n| n.iter().find(|n| n["name"] == name).cloned())
            .and_then(|n| n["address"].as_str().map(str::to_owned))
            .unwrap_or_else(|| panic!("{name} registered"))
    };
    let started = |addr: &str| {
        get(&format!("https://{addr}"), "/stats", "")["transfer"]["started"]
            .as_u64()
            .expect("started")
    };
    let (q4_decode, q8_decode) = (decode_of("up-decode"), decode_of("up-q8-decode"));
    let before = (started(&q4_decode), started(&q8_decode));
    let q8_path = format!(
        "/client/v4/accounts/{}/ai/run/{q8}",
        a["id"].as_str().unwrap_or_default()
    );
    let token = a["token"].as_str().unwrap_or_default();
    let (status, text) = post(gw, &q8_path, token, body);
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    assert!(
        v["result"]["response"]
            .as_str()
            .is_some_and(|r| !r.is_empty()),
        "{v}"
    );
    assert_eq!(
        (started(&q4_decode), started(&q8_decode)),
        (before.0, before.1 + 1),
        "the -q8 request went to the -q8 decode worker only"
    );
    let listed = |tok: &str| -> (Vec<String>, Vec<String>) {
        let openai = get(gw, "/v1/models", tok)["data"]
            .as_array()
            .map(|d| {
                d.iter()
                    .filter_map(|m| m["id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let acct = accounts
            .iter()
            .find(|x| x["token"] == tok)
            .and_then(|x| x["id"].as_str())
            .unwrap_or_default()
            .to_owned();
        let search = get(
            gw,
            &format!("/client/v4/accounts/{acct}/ai/models/search"),
            tok,
        )["result"]
            .as_array()
            .map(|d| {
                d.iter()
                    .filter_map(|m| m["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        (openai, search)
    };
    for acct in accounts {
        let (openai, search) = listed(acct["token"].as_str().unwrap_or_default());
        for m in &models {
            assert!(
                openai.contains(m) && search.contains(m),
                "{m}: {openai:?} {search:?}"
            );
        }
    }
    let flip = |visibility: &str| {
        succeeds(
            bulkhead(&["model", visibility, &q8, "--reason", "two-model test"])
                .arg("--data-dir")
                .arg(dir),
        );
    };
    flip("private");
    let (status, text) = post(gw, &q8_path, token, body);
    // Workers AI's own answer for a model that does not exist.
    assert_eq!(status, 400, "{text}");
    assert!(
        text.contains("5007") && text.contains("No such model"),
        "a private model is as if it did not exist: {text}"
    );
    let (status, text) = post(gw, path, token, body);
    assert_eq!(status, 200, "the other model keeps serving: {text}");
    for acct in accounts {
        let (openai, search) = listed(acct["token"].as_str().unwrap_or_default());
        assert!(
            openai.contains(model) && search.contains(model),
            "{openai:?} {search:?}"
        );
        assert!(
            !openai.contains(&q8) && !search.contains(&q8),
            "{openai:?} {search:?}"
        );
    }
    flip("public");
    let (status, text) = post(gw, &q8_path, token, body);
    assert_eq!(status, 200, "{text}");
}

/// A prompt at the full served window succeeds; one token over is a 4xx at
/// once.
fn a_prompt_at_the_full_window_is_served_and_one_token_more_refused(c: &Ctx) {
    let (creds, gw, a, path) = (&c.creds, &c.gw, &c.accounts[0], &c.path);
    // A prompt at the full context window of up's config succeeds: `up`
    // serves the window this machine prefills within the deadline.
    let cp = creds["control_plane_url"].as_str().unwrap_or_default();
    let configs = get(
        cp,
        "/admin/v1/models/%40cf%2Fhuggingfacetb%2Fsmollm2-135m-instruct/configs",
        creds["operator_token"].as_str().unwrap_or_default(),
    );
    let active = configs
        .as_array()
        .and_then(|c| c.iter().find(|c| c["active"] == true))
        .expect("an active config")
        .clone();
    let window = active["context_window"].as_u64().expect("window");
    assert!(window >= 1_024, "{active}");
    let max_tokens = 4;
    let prompt_tokens = usize::try_from(window).expect("window") - max_tokens;
    let full = serde_json::json!({
        "prompt": text_of_tokens(prompt_tokens),
        "raw": true,
        "max_tokens": max_tokens,
    })
    .to_string();
    let started = std::time::Instant::now();
    let (status, text) = post(gw, path, a["token"].as_str().unwrap_or_default(), &full);
    assert_eq!(status, 200, "{}", &text[..text.len().min(500)]);
    let v: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(
        v["result"]["usage"]["prompt_tokens"].as_u64(),
        Some(prompt_tokens as u64),
        "{}",
        v["result"]["usage"]
    );
    eprintln!(
        "a {prompt_tokens}-token prompt at the {window}-token window took {:?}",
        started.elapsed()
    );
    // One token over the window is a 4xx at once.
    let over = serde_json::json!({
        "prompt": text_of_tokens(prompt_tokens + 1),
        "raw": true,
        "max_tokens": max_tokens,
    })
    .to_string();
    let (status, text) = post(gw, path, a["token"].as_str().unwrap_or_default(), &over);
    assert_eq!(status, 413, "{text}");
}

/// B cannot use A's URL; the responder commands work from
/// `credentials.json`.
fn another_account_cannot_use_a_url_and_responders_read_credentials(c: &Ctx) {
    let (dir, accounts, gw, path, body) = (&c.dir, &c.accounts, &c.gw, &c.path, c.body.as_str());
    // B cannot use A's URL; the responder commands work from credentials.json.
    let (status, _) = post(
        gw,
        path,
        accounts[1]["token"].as_str().unwrap_or_default(),
        body,
    );
    assert_eq!(status, 403);
    let listed = succeeds(bulkhead(&["model", "list", "--data-dir"]).arg(dir));
    assert!(listed.contains("public"), "{listed}");
}

/// A worker that dies is restarted where it was, and the platform answers
/// again.
fn a_killed_decode_worker_is_restarted_and_the_platform_serves_again(c: &Ctx) {
    let (first, gw, a, path, body) = (&c.first, &c.gw, &c.accounts[0], &c.path, c.body.as_str());
    // A worker that dies is restarted where it was; the platform keeps
    // serving and answers again once it is back.
    let decode_pid = child_pid(first.child.id(), "decode", "--node-name up-decode ");
    let killed = Command::new("kill")
        .args(["-KILL", &decode_pid.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success(), "the decode worker was killed");
    let until = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let (status, _) = post(gw, path, a["token"].as_str().unwrap_or_default(), body);
        if status == 200 {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "the platform did not serve again after its decode worker was killed (last status {status})"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_ne!(
        child_pid(first.child.id(), "decode", "--node-name up-decode "),
        decode_pid,
        "a new decode worker"
    );
}

/// Responder commands pointed at the gateway say so.
fn responder_commands_pointed_at_the_gateway_say_so(c: &Ctx) {
    let (gw, responder) = (&c.gw, |args: &[&str], url: &str| c.responder(args, url));
    // Responder commands pointed at the gateway say so.
    let out = responder(&["model", "list"], gw);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("answered like a Bulkhead gateway"), "{err}");
}

/// A flip that a live gateway does not apply fails, saying how many applied
/// and that the other fenced itself.
fn a_flip_a_stopped_gateway_never_applies_fails_saying_so(c: &Ctx) {
    let (first, cp, q8, responder) = (
        &c.first,
        c.creds["control_plane_url"].as_str().unwrap_or_default(),
        format!("{}-q8", c.model),
        |args: &[&str], url: &str| c.responder(args, url),
    );
    // A flip that a live gateway does not apply (stopped right after a
    // poll) shows its progress and fails, saying how many applied.
    let gateway_pid = child_pid(first.child.id(), "gateway", "gateway");
    let signal = |sig: &str| {
        let ok = Command::new("kill")
            .args([sig, &gateway_pid.to_string()])
            .status()
            .expect("kill");
        assert!(ok.success(), "kill {sig}");
    };
    signal("-STOP");
    let out = responder(&["model", "private", &q8, "--reason", "gateway test"], cp);
    signal("-CONT");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a flip one gateway never applied succeeded: {err}"
    );
    assert!(
        err.contains("waiting for every gateway to apply it: 1 s")
            && err.contains("only 0 of 1 gateways confirmed applying it"),
        "{err}"
    );
    // And when the one that did not has fenced itself.
    assert!(
        err.contains("stops serving every model once its lease")
            && err.contains("have stopped serving"),
        "{err}"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("is now private"),
        "the flip itself is recorded"
    );
    let out = responder(
        &["model", "public", &q8, "--reason", "gateway test over"],
        cp,
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("applied by all 1 gateways"), "{said}");
}

/// The runner the checks above rely on: a failing check stops no other,
/// and the end names each that failed.
#[test]
fn checks_run_every_check_and_name_each_failure() {
    let mut checks = support::Checks::default();
    let mut ran = Vec::new();
    checks.run("the first fails", || panic!("on purpose"));
    checks.run("the second runs", || ran.push(2));
    checks.run("the third fails", || assert_eq!(1 + 1, 3));
    assert_eq!(ran, [2], "a failure stopped no later check");
    let end = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| checks.finish()));
    let message = end
        .expect_err("finish fails when a check failed")
        .downcast::<String>()
        .expect("a message");
    assert!(
        message.contains("the first fails")
            && message.contains("the third fails")
            && !message.contains("the second runs"),
        "{message}"
    );
}
