//! Worker processes, a tiny HTTP/1.0 client and a frame-level proxy for the
//! disaggregation tests.

#![allow(dead_code, unreachable_pub)]

pub mod platform;

use bulkhead_transfer::Message;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A worker process, killed when dropped.
pub struct Worker {
    pub child: Child,
    pub line: String,
}

impl Worker {
    /// Starts `bulkhead <args>` and waits for its `listening` line.
    pub fn start(args: &[&str]) -> Worker {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_bulkhead"));
        cmd.args(args);
        Worker::spawn(cmd)
    }

    /// Starts `bulkhead <args>` in network namespace `ns` (`ip netns exec`).
    pub fn start_in(ns: &str, args: &[&str]) -> Worker {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_bulkhead")])
            .args(args);
        Worker::spawn(cmd)
    }

    fn spawn(mut cmd: Command) -> Worker {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("bulkhead starts");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                let _ = tx.send(line);
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("the worker announces its addresses");
        assert!(line.contains("listening"), "{line}");
        Worker { child, line }
    }

    /// The address after `key=` in the announcement.
    pub fn addr(&self, key: &str) -> String {
        let at = self.line.find(&format!("{key}=")).expect("address in line") + key.len() + 1;
        self.line[at..]
            .split_whitespace()
            .next()
            .expect("address")
            .to_owned()
    }

    /// `kill -9`; the signal that ended the process (`Some(9)` when this
    /// kill did it).
    pub fn kill9(&mut self) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        let _ = self.child.kill();
        self.child.wait().ok().and_then(|s| s.signal())
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.kill9();
    }
}

/// Common model flags: a small pool so each process starts fast.
pub const POOL: &[&str] = &["--kv-budget-mib", "64", "--threads", "1"];

pub fn prefill(extra: &[&str]) -> Worker {
    let mut args = vec![
        "prefill",
        "--listen",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(POOL);
    args.extend_from_slice(extra);
    Worker::start(&args)
}

pub fn decode(prefill_addr: &str, extra: &[&str]) -> Worker {
    let mut args = vec!["decode", "--http", "127.0.0.1:0", "--prefill", prefill_addr];
    args.extend_from_slice(POOL);
    args.extend_from_slice(extra);
    Worker::start(&args)
}

/// A decode worker pinned to several prefill workers.
pub fn decode_fleet(prefill_addrs: &[&str], extra: &[&str]) -> Worker {
    let mut args = vec!["decode", "--http", "127.0.0.1:0"];
    for a in prefill_addrs {
        args.extend_from_slice(&["--prefill", a]);
    }
    args.extend_from_slice(POOL);
    args.extend_from_slice(extra);
    Worker::start(&args)
}

pub fn colocated() -> Worker {
    let mut args = vec!["serve", "--http", "127.0.0.1:0"];
    args.extend_from_slice(POOL);
    Worker::start(&args)
}

/// A response: status and body.
pub struct Response {
    pub status: u16,
    pub body: String,
}

impl Response {
    /// The NDJSON lines.
    pub fn lines(&self) -> Vec<Value> {
        self.body
            .lines()
            .map(|l| serde_json::from_str(l).expect("JSON line"))
            .collect()
    }

    /// Generated token ids, and the last line.
    pub fn tokens(&self) -> (Vec<u64>, Value) {
        let lines = self.lines();
        let ids = lines.iter().filter_map(|l| l["token"].as_u64()).collect();
        (ids, lines.last().cloned().unwrap_or(Value::Null))
    }
}

/// One HTTP/1.0 request (no chunking: the body ends at close).
pub fn http(addr: &str, method: &str, path: &str, tenant: Option<u64>, body: &str) -> Response {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).ok();
    let tenant = tenant.map_or(String::new(), |t| format!("x-bulkhead-tenant: {t}\r\n"));
    let req = format!(
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\n{tenant}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("send");
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("read");
    let (head, body) = raw.split_once("\r\n\r\n").expect("HTTP response");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    Response {
        status,
        body: body.to_owned(),
    }
}

pub fn generate(addr: &str, tenant: u64, body: &Value) -> Response {
    http(
        addr,
        "POST",
        "/v1/generate",
        Some(tenant),
        &body.to_string(),
    )
}

pub fn stats(addr: &str) -> Value {
    let r = http(addr, "GET", "/stats", None, "");
    assert_eq!(r.status, 200, "{}", r.body);
    serde_json::from_str(&r.body).expect("stats JSON")
}

/// Waits until `f(stats)` holds, up to 20 s; returns the last stats.
pub fn wait_stats(addr: &str, f: impl Fn(&Value) -> bool) -> Value {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let s = stats(addr);
        if f(&s) || Instant::now() > until {
            return s;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every page free and nothing held, landing or draining.
pub fn at_baseline(s: &Value) -> bool {
    let p = &s["pool"];
    let e = &s["engine"];
    p["free_pages"] == p["total_pages"]
        && p["allocated_pages"] == 0
        && p["receiving_pages"] == 0
        && p["quarantined_pages"] == 0
        && e["draining_transfers"] == 0
        && e["held_transfers"] == 0
        && e["running"] == 0
}

/// Asserts both workers return to baseline.
pub fn assert_baseline(addrs: &[&str]) {
    for a in addrs {
        let s = wait_stats(a, at_baseline);
        assert!(at_baseline(&s), "{a} not at baseline: {s}");
    }
}

/// A prompt of `n` tokens (ids of ordinary words, repeated).
pub fn tokens(n: usize) -> Vec<u32> {
    (0..n).map(|i| 1000 + (i as u32 * 37) % 5000).collect()
}

/// What the proxy does with each prefill-to-decode frame.
pub type Tamper = Box<dyn FnMut(Message) -> Vec<Message> + Send>;

/// A frame-level proxy between a decode worker and a real prefill worker.
pub struct Proxy {
    /// Where decode workers connect.
    pub addr: String,
    injected: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    recorded: std::sync::Arc<std::sync::Mutex<Vec<Message>>>,
}

impl Proxy {
    /// Frames the tamper function changed, dropped or added: a fault test
    /// asserts this is above zero, so a harness that injects nothing fails.
    pub fn injected(&self) -> usize {
        self.injected.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Every frame prefill sent, as prefill sent it, in order.
    pub fn recorded(&self) -> Vec<Message> {
        self.recorded.lock().expect("recording").clone()
    }
}

/// A frame-level proxy between a decode worker and a real prefill worker,
/// recording and rewriting what prefill sends.
pub fn proxy(prefill_addr: String, tamper: Tamper) -> Proxy {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let injected = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let recorded = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (inj, rec) = (injected.clone(), recorded.clone());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            listener.set_nonblocking(true).expect("nonblocking");
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            let mut tamper = Some(tamper);
            loop {
                let Ok((down, _)) = listener.accept().await else {
                    return;
                };
                let Ok(up) = tokio::net::TcpStream::connect(&prefill_addr).await else {
                    return;
                };
                let (mut dr, mut dw) = down.into_split();
                let (mut ur, mut uw) = up.into_split();
                tokio::spawn(async move {
                    use tokio::io::AsyncWriteExt;
                    while let Ok(m) = Message::read(&mut dr).await {
                        if uw.write_all(&m.encode()).await.is_err() {
                            return;
                        }
                    }
                });
                let mut t = tamper.take().unwrap_or_else(|| Box::new(|m| vec![m]));
                let (inj, rec) = (inj.clone(), rec.clone());
                tokio::spawn(async move {
                    use tokio::io::AsyncWriteExt;
                    while let Ok(m) = Message::read(&mut ur).await {
                        let original = m.encode();
                        rec.lock().expect("recording").push(m.clone());
                        let out = t(m);
                        let sent: Vec<u8> = out.iter().flat_map(Message::encode).collect();
                        if sent != original {
                            inj.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                        if dw.write_all(&sent).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
    });
    Proxy {
        addr,
        injected,
        recorded,
    }
}
