//! `bulkhead up` as a child process, and a bearer-token HTTP/1.0 client for
//! its gateway and control plane.

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running `bulkhead up`, stopped with SIGTERM when dropped.
pub struct Up {
    pub child: Child,
    pub lines: Vec<String>,
}

impl Drop for Up {
    fn drop(&mut self) {
        // SIGTERM first: `up` stops its components; SIGKILL would orphan them.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < until {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fresh data directory under the system's temp directory.
pub fn data_dir(tag: &str) -> std::path::PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    std::env::temp_dir().join(format!("bulkhead-{tag}-{}-{nanos}", std::process::id()))
}

/// Starts `bulkhead up --port 0 --threads 1 --data-dir DIR EXTRA...` and
/// waits for its summary.
pub fn up(dir: &std::path::Path, extra: &[&str]) -> Up {
    // `up` reuses valid identities in its data directory: give it this test
    // binary's CA, so the tests' operator certificate reaches its workers.
    let tls = dir.join("tls");
    std::fs::create_dir_all(&tls).expect("tls dir");
    for f in std::fs::read_dir(super::tls_dir()).expect("test CA") {
        let f = f.expect("entry").path();
        if let Some(name) = f.file_name() {
            std::fs::copy(&f, tls.join(name)).expect("copy identity");
        }
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_bulkhead"))
        .args(["up", "--port", "0", "--threads", "1"])
        .args(extra)
        .arg("--data-dir")
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("bulkhead up starts");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let mut lines = Vec::new();
    loop {
        let l = rx
            .recv_timeout(Duration::from_secs(180))
            .expect("up prints its summary");
        let done = l.contains("Ctrl-C stops everything");
        lines.push(l);
        if done {
            break;
        }
    }
    Up { child, lines }
}

/// `credentials.json` of a data directory.
pub fn credentials(dir: &std::path::Path) -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(dir.join("credentials.json")).expect("credentials.json"),
    )
    .expect("JSON")
}

/// One HTTP/1.0 request with a bearer token: status and body, or the
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
pub fn exchange(
    url: &str,
    method: &str,
    path: &str,
    token: &str,
    body: &str,
) -> std::io::Result<(u16, String, String)> {
    let req = |addr: &str| {
        format!(
            "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let mut raw = Vec::new();
    if let Some(addr) = url.strip_prefix("https://") {
        // A worker's API: mutual TLS with the test CA's operator certificate.
        let mut s = super::try_tls_connect(
            addr,
            bulkhead_trust::Role::Operator,
            Duration::from_secs(600),
        )?;
        s.write_all(req(addr).as_bytes())?;
        s.flush()?;
        let mut text = String::new();
        super::read_to_close(&mut s, &mut text)?;
        raw = text.into_bytes();
    } else {
        let addr = url.trim_start_matches("http://");
        let mut s = TcpStream::connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(600)))?;
        s.write_all(req(addr).as_bytes())?;
        s.read_to_end(&mut raw)?;
    }
    let raw = String::from_utf8_lossy(&raw);
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no HTTP head"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("no status"))?;
    Ok((status, head.to_owned(), body.to_owned()))
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
    let out = Command::new("pgrep")
        .args([
            "-a",
            "-P",
            &up.to_string(),
            "-f",
            &format!("bulkhead {role} "),
        ])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.contains(needle))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
}

/// Mints an operator token with `role` straight in the database under
/// `dir` (`bulkhead control-plane token create`).
pub fn operator_token(dir: &str, name: &str, role: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_bulkhead"))
        .args([
            "control-plane",
            "token",
            "create",
            "--name",
            name,
            "--role",
            role,
        ])
        .args(["--data-dir", dir])
        .output()
        .expect("token create");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}
