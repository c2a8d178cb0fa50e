//! `bulkhead up` as a child process, and bearer-token calls to its gateway,
//! control plane and workers.
//!
//! What `up` wrote to `credentials.json` is read into a typed `Credentials`
//! (addresses, the operator token, the default model's slug, the demo
//! accounts).

use bulkhead_test_support::Request;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running `bulkhead up`, stopped with SIGTERM when dropped.
pub struct Up {
    pub child: Child,
    pub lines: Vec<String>,
}

impl Drop for Up {
    fn drop(&mut self) {
        bulkhead_test_support::process::terminate(&mut self.child, Duration::from_secs(10));
    }
}

/// A fresh data directory under the system's temp directory.
pub fn data_dir(tag: &str) -> std::path::PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    std::env::temp_dir().join(format!("bulkhead-{tag}-{}-{nanos}", std::process::id()))
}

/// Starts `bulkhead up --port 0 --threads 1 --no-embeddings --data-dir DIR
/// EXTRA...` and waits for its summary: the generating models alone (tests
/// of embeddings start [`up_with_embeddings`]).
pub fn up(dir: &std::path::Path, extra: &[&str]) -> Up {
    let mut args = vec!["--no-embeddings"];
    args.extend_from_slice(extra);
    up_with_embeddings(dir, &args)
}

/// As [`up`], serving the embedding model too (`up`'s default).
pub fn up_with_embeddings(dir: &std::path::Path, extra: &[&str]) -> Up {
    // `up` reuses valid identities in its data directory: give it this test
    // binary's CA, so the tests' operator certificate reaches its workers.
    let tls = dir.join("tls");
    std::fs::create_dir_all(&tls).expect("tls dir");
    for f in std::fs::read_dir(super::tls_dir()).expect("test CA") {
        let f = f.expect("entry").path();
        // Files only: `up` writes the bundles itself.
        if let Some(name) = f.file_name().filter(|_| f.is_file()) {
            std::fs::copy(&f, tls.join(name)).expect("copy identity");
        }
    }
    // Short test prompts take the transfer path the tests check (`up`'s
    // workers inherit the variable).
    let mut child = Command::new(env!("CARGO_BIN_EXE_bulkhead"))
        .env(super::LOCAL_PREFILL, "0")
        .args(["up", "--port", "0", "--threads", "1"])
        .args(extra)
        .arg("--data-dir")
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("bulkhead up starts");
    let rx = lines_of(child.stdout.take().expect("stdout"));
    let lines = until_summary(&rx);
    Up { child, lines }
}

/// A process's output lines, as they come.
pub fn lines_of(out: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    rx
}

/// The lines `up` prints up to the end of its summary (within 180 s).
pub fn until_summary(rx: &std::sync::mpsc::Receiver<String>) -> Vec<String> {
    let mut lines = Vec::new();
    loop {
        let l = rx
            .recv_timeout(Duration::from_secs(180))
            .expect("up prints its summary");
        let done = l.contains("Ctrl-C stops everything");
        lines.push(l);
        if done {
            return lines;
        }
    }
}

/// What `up` wrote to a data directory's `credentials.json`, as the tests
/// read it (`tests/up.rs` checks the file's every field itself).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Credentials {
    pub gateway_url: String,
    pub control_plane_url: String,
    pub status_url: String,
    pub operator_token: String,
    /// The default model's slug.
    pub model: String,
    /// The demo accounts.
    pub accounts: Vec<Account>,
    /// Each component's metrics URL.
    pub metrics: std::collections::BTreeMap<String, String>,
    /// The embedding model's slug, when one is served.
    #[serde(default)]
    pub embedding_model: Option<String>,
}

/// A demo account with its API token.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Account {
    pub id: String,
    pub token: String,
}

/// `credentials.json` of a data directory.
pub fn credentials(dir: &std::path::Path) -> Credentials {
    let text = std::fs::read_to_string(dir.join("credentials.json")).expect("credentials.json");
    serde_json::from_str(&text).expect("credentials.json as up writes it")
}

/// One request with a bearer token: status and body, or the
/// transport error (a connection cut before the response ended).
pub fn try_call(
    url: &str,
    method: &str,
    path: &str,
    token: &str,
    body: &str,
) -> std::io::Result<(u16, String)> {
    exchange(url, method, path, token, body).map(|(status, _, body)| (status, body))
}

/// As [`try_call`], with the response's head (status line and headers).
/// An `https://` URL is a worker's API: mutual TLS with the test CA's
/// operator certificate.
pub fn exchange(
    url: &str,
    method: &str,
    path: &str,
    token: &str,
    body: &str,
) -> std::io::Result<(u16, String, String)> {
    let mut req = Request::at(method, url, path).bearer(token).json(body);
    if url.starts_with("https://") {
        let config = super::identity(bulkhead_trust::Role::Operator)
            .client_config(&[
                bulkhead_trust::Role::Decode,
                bulkhead_trust::Role::Colocated,
                bulkhead_trust::Role::Prefill,
            ])
            .map_err(std::io::Error::other)?;
        req = req.tls(config, &bulkhead_trust::Role::Decode.dns_name());
    }
    let r = req.send().map_err(std::io::Error::other)?;
    match r.cut {
        Some(cut) => Err(std::io::Error::other(cut)),
        None => Ok((r.status, r.head(), r.body)),
    }
}

pub fn post(url: &str, path: &str, token: &str, body: &str) -> (u16, String) {
    try_call(url, "POST", path, token, body).expect("HTTP response")
}

pub fn get(url: &str, path: &str, token: &str) -> Value {
    let (_, body) = try_call(url, "GET", path, token, "").expect("HTTP response");
    serde_json::from_str(&body).expect("JSON")
}

/// The pid of `up`'s child running `bulkhead <role> ...` with `needle` in
/// its command line.
pub fn child_pid(up: u32, role: &str, needle: &str) -> u32 {
    find_child_pid(up, role, needle)
        .unwrap_or_else(|| panic!("no {role} child of up {up} with {needle}"))
}

/// As [`child_pid`], `None` when there is none (yet).
pub fn find_child_pid(up: u32, role: &str, needle: &str) -> Option<u32> {
    let mut found = bulkhead_test_support::process::children(up, role).into_iter();
    found
        .find(|(_, line)| line.contains(needle))
        .map(|(pid, _)| pid)
}

/// `bulkhead args...` with the responder environment cleared: what it
/// reaches, it reaches through its arguments (`--data-dir`) or what the
/// caller sets on the command.
pub fn bulkhead(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_bulkhead"));
    cmd.args(args)
        .env_remove("BULKHEAD_CONTROL_PLANE_URL")
        .env_remove("BULKHEAD_TOKEN");
    cmd
}

/// Runs `cmd` and asserts it succeeded (showing its stderr when not);
/// its stdout.
pub fn succeeds(cmd: &mut Command) -> String {
    let out = cmd.output().expect("the command runs");
    assert!(
        out.status.success(),
        "{:?}: {}",
        cmd.get_args().collect::<Vec<_>>(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Mints an operator token with `role` straight in the database under
/// `dir` (`bulkhead control-plane token create`).
pub fn operator_token(dir: &str, name: &str, role: &str) -> String {
    succeeds(
        bulkhead(&["control-plane", "token", "create", "--name", name]).args([
            "--role",
            role,
            "--data-dir",
            dir,
        ]),
    )
    .trim()
    .to_owned()
}
