//! Worker processes, requests to their mutual-TLS ports and a
//! frame-level proxy for the disaggregation tests. Every process a test
//! starts gets the test CA's identities ([`tls_dir`]).

#![allow(dead_code, unreachable_pub)]

pub mod platform;
pub mod python;
pub mod sink;

#[allow(unused_imports)]
pub use bulkhead_test_support::{Request, Streaming};
use bulkhead_transfer::Message;
use bulkhead_trust::Role as CertRole;
use bulkhead_worker_api::context::{CONTEXT_HEADER, SigningKey, TenantContext};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The golden file measured with llama.cpp on the default model (its
/// sha256, chat template, token ids and greedy answers).
pub fn golden() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/testdata/smollm2-135m-q4_1.json"
    );
    let text = std::fs::read_to_string(path).expect("golden file");
    serde_json::from_str(&text).expect("golden JSON")
}

/// The identities of this test binary's platform CA (created once).
pub fn tls_dir() -> &'static std::path::Path {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("bulkhead-test-tls-{}", std::process::id()));
        // What an operator runs: the CA, every role's certificate, the
        // context keys and one bundle per component.
        tls_init(&d, &[]);
        d
    })
}

/// Runs `bulkhead tls init --dir DIR` with `extra` flags; fails the test
/// if it fails.
pub fn tls_init(dir: &std::path::Path, extra: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_bulkhead"))
        .args(["tls", "init"])
        .args(extra)
        .arg("--dir")
        .arg(dir)
        .output()
        .expect("tls init runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
}

/// The test platform's gateway tenant-context signing key.
pub fn key_ring() -> SigningKey {
    SigningKey::load(&tls_dir().join("context.sign")).expect("context keys")
}

/// A context the test CA's gateway would sign for `tenant` on the default
/// model, allowing any request.
pub fn context_for(tenant: u64) -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let id = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    key_ring().sign(&TenantContext::new(
        &"0".repeat(32),
        tenant,
        format!("test-{}-{id}", std::process::id()),
        "@cf/huggingfacetb/smollm2-135m-instruct",
        None,
        u64::from(u32::MAX),
        None,
        std::time::SystemTime::now(),
    ))
}

/// The test CA's identity of `role`.
pub fn identity(role: CertRole) -> bulkhead_trust::Identity {
    bulkhead_trust::Identity::load(&bulkhead_trust::TlsFiles::in_dir(tls_dir(), role), role)
        .expect("test identity")
}

/// The test CA's identity of `role` scoped to `model` (and a pool bound).
pub fn scoped_identity(
    role: CertRole,
    model: &str,
    max_kv_bytes: Option<u64>,
) -> bulkhead_trust::Identity {
    let scope = bulkhead_trust::Scope::model(model, max_kv_bytes);
    let (files, _) =
        bulkhead_trust::authority::init_scoped(tls_dir(), role, &scope).expect("scoped identity");
    bulkhead_trust::Identity::load(&files, role).expect("scoped identity")
}

/// A blocking mutual-TLS connection to a worker at `addr`, presenting the
/// test CA's certificate of `present`.
pub fn tls_connect(
    addr: &str,
    present: CertRole,
) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    try_tls_connect(addr, present, Duration::from_secs(120)).expect("connect")
}

/// As [`tls_connect`], the failure returned, reads timing out after
/// `timeout`.
pub fn try_tls_connect(
    addr: &str,
    present: CertRole,
    timeout: Duration,
) -> std::io::Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    let config = identity(present)
        .client_config(&[CertRole::Decode, CertRole::Colocated, CertRole::Prefill])
        .map_err(std::io::Error::other)?;
    let name = rustls::pki_types::ServerName::try_from(CertRole::Decode.dns_name())
        .map_err(std::io::Error::other)?;
    let conn = rustls::ClientConnection::new(config, name).map_err(std::io::Error::other)?;
    let s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(timeout))?;
    Ok(rustls::StreamOwned::new(conn, s))
}

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
        // Each component gets only its bundle, as `up` gives it; the test
        // is the operator and keeps the directory.
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        // The subcommand: the first argument, or the one after the binary
        // (`ip netns exec NS bulkhead SUBCOMMAND`).
        let bin = env!("CARGO_BIN_EXE_bulkhead");
        let sub = args
            .iter()
            .position(|a| a == bin)
            .map_or(args.first(), |i| args.get(i + 1));
        let role = sub.and_then(|a| match a.as_str() {
            "prefill" | "decode" | "gateway" | "control-plane" => Some(a.clone()),
            "serve" => Some("colocated".to_owned()),
            _ => None,
        });
        let tls = role.map_or_else(
            || tls_dir().to_path_buf(),
            |r| tls_dir().join("bundles").join(r),
        );
        // Short test prompts take the transfer path the tests check; a test
        // of decode computing short prompts itself passes the flag.
        if !cmd.get_envs().any(|(k, _)| k == LOCAL_PREFILL) {
            cmd.env(LOCAL_PREFILL, "0");
        }
        let mut child = cmd
            .env("BULKHEAD_TLS_DIR", tls)
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

/// A control plane on loopback (public and internal ports) keeping its
/// data in `data`, with `extra` flags.
pub fn control_plane(data: &str, extra: &[&str]) -> Worker {
    let mut args = vec!["control-plane", "--listen", "127.0.0.1:0"];
    args.extend(["--internal-listen", "127.0.0.1:0", "--data-dir", data]);
    args.extend_from_slice(extra);
    Worker::start(&args)
}

/// Common model flags: a small pool so each process starts fast.
pub const POOL: &[&str] = &["--kv-budget-mib", "64", "--threads", "1"];

pub fn prefill(extra: &[&str]) -> Worker {
    prefill_with(POOL, extra)
}

/// A prefill worker with `pool` flags instead of [`POOL`].
pub fn prefill_with(pool: &[&str], extra: &[&str]) -> Worker {
    let mut args = vec![
        "prefill",
        "--listen",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(pool);
    args.extend_from_slice(extra);
    Worker::start(&args)
}

/// The variable that sets how many tokens of a prompt a decode worker
/// computes itself rather than landing them; test workers and `up` get 0
/// unless a test says otherwise.
pub const LOCAL_PREFILL: &str = "BULKHEAD_LOCAL_PREFILL_TOKENS";

pub fn decode(prefill_addr: &str, extra: &[&str]) -> Worker {
    decode_with(prefill_addr, POOL, extra)
}

/// A decode worker with `pool` flags instead of [`POOL`].
pub fn decode_with(prefill_addr: &str, pool: &[&str], extra: &[&str]) -> Worker {
    let mut args = vec!["decode", "--http", "127.0.0.1:0", "--prefill", prefill_addr];
    args.extend_from_slice(pool);
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

/// One request to a worker's API over mutual TLS: as the gateway when it
/// carries a tenant, else as an operator.
pub fn http(addr: &str, method: &str, path: &str, tenant: Option<u64>, body: &str) -> Response {
    let present = if tenant.is_some() {
        CertRole::Gateway
    } else {
        CertRole::Operator
    };
    let mut req = worker_request(addr, present, method, path).json(body);
    if let Some(t) = tenant {
        req = req.header(CONTEXT_HEADER, &context_for(t));
    }
    let r = req.send().expect("HTTP response");
    Response {
        status: r.status,
        body: r.body,
    }
}

/// A request to `path` on a worker's mutual-TLS port at `addr`, presenting
/// the test CA's certificate of `present`.
pub fn worker_request(addr: &str, present: CertRole, method: &str, path: &str) -> Request {
    let config = identity(present)
        .client_config(&[CertRole::Decode, CertRole::Colocated, CertRole::Prefill])
        .expect("client config");
    Request::at(method, &format!("https://{addr}"), path).tls(config, &CertRole::Decode.dns_name())
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

/// Named checks over one shared set-up (a platform is expensive to start):
/// each runs whatever an earlier one did, and [`Checks::finish`] fails
/// naming every check that failed, so one failure hides no other.
#[derive(Debug, Default)]
pub struct Checks {
    failed: Vec<String>,
}

impl Checks {
    /// Runs `check`, named `name` (its panic is reported, then recorded).
    pub fn run(&mut self, name: &str, check: impl FnOnce()) {
        eprintln!("check: {name}");
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(check)).is_err() {
            self.failed.push(name.to_owned());
        }
    }

    /// Fails naming every check that failed.
    pub fn finish(self) {
        assert!(self.failed.is_empty(), "failed checks: {:?}", self.failed);
    }
}

/// Runs the future `task` makes on a current-thread runtime of its own, on
/// a thread of its own (servers the tests start beside the platform).
pub fn on_own_runtime<F>(task: impl FnOnce() -> F + Send + 'static)
where
    F: std::future::Future<Output = ()>,
{
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(task());
    });
}

/// A frame-level proxy between a decode worker and a real prefill worker,
/// recording and rewriting what prefill sends.
pub fn proxy(prefill_addr: String, tamper: Tamper) -> Proxy {
    proxy_both(prefill_addr, Box::new(|m| vec![m]), tamper)
}

/// As [`proxy`], rewriting what decode sends with `upward` too (a
/// compromised decode host); its rewrites count as injected as well.
pub fn proxy_both(prefill_addr: String, upward: Tamper, tamper: Tamper) -> Proxy {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let injected = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let recorded = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (inj, rec) = (injected.clone(), recorded.clone());
    on_own_runtime(move || async move {
        // It terminates TLS both ways with the test CA's certificates:
        // a prefill worker's to decode, a decode worker's to prefill (a
        // compromised host holding valid certificates).
        listener.set_nonblocking(true).expect("nonblocking");
        let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
        let acceptor = identity(CertRole::Prefill)
            .acceptor(&[CertRole::Decode])
            .expect("acceptor");
        let mut listener = bulkhead_trust::TlsListener::new(listener, acceptor).expect("listener");
        let connector = identity(CertRole::Decode)
            .connector(&[CertRole::Prefill])
            .expect("connector");
        let mut tamper = Some(tamper);
        let mut upward = Some(upward);
        loop {
            let (down, _) = listener.accept().await;
            let Ok(up) =
                bulkhead_trust::connect::dial(&connector, CertRole::Prefill, &prefill_addr).await
            else {
                return;
            };
            let (mut dr, mut dw) = tokio::io::split(down);
            let (mut ur, mut uw) = tokio::io::split(up);
            let mut u = upward.take().unwrap_or_else(|| Box::new(|m| vec![m]));
            let inj_up = inj.clone();
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                while let Ok(m) = Message::read(&mut dr).await {
                    let original = m.encode();
                    let sent: Vec<u8> = u(m).iter().flat_map(Message::encode).collect();
                    if sent != original {
                        inj_up.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    if uw.write_all(&sent).await.is_err() || uw.flush().await.is_err() {
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
                    if dw.write_all(&sent).await.is_err() || dw.flush().await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Proxy {
        addr,
        injected,
        recorded,
    }
}

/// What a test client presents on a mutual-TLS port.
#[derive(Debug, Clone, Copy)]
pub enum Present {
    /// No certificate at all.
    Nothing,
    /// The test CA's certificate of this role.
    Ours(CertRole),
    /// Another CA's certificate of this role (an attacker's own PKI).
    Foreign(CertRole),
}

/// Another CA's identities (created once).
pub fn foreign_dir() -> &'static std::path::Path {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("bulkhead-test-foreign-{}", std::process::id()));
        bulkhead_trust::authority::init_dir(&d, &CertRole::ALL).expect("foreign CA");
        d
    })
}

/// A client configuration trusting the test CA's `server` role and
/// presenting `present`.
pub fn client_config(present: Present, server: CertRole) -> std::sync::Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    match present {
        Present::Nothing => identity(CertRole::Operator)
            .anonymous_client_config(&[server])
            .expect("config"),
        Present::Ours(r) => identity(r).client_config(&[server]).expect("config"),
        Present::Foreign(r) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in rustls::pki_types::CertificateDer::pem_file_iter(tls_dir().join("ca.pem"))
                .expect("ca")
            {
                roots.add(c.expect("ca")).expect("ca");
            }
            let files = bulkhead_trust::TlsFiles::in_dir(foreign_dir(), r);
            let chain = rustls::pki_types::CertificateDer::pem_file_iter(&files.cert)
                .expect("cert")
                .collect::<Result<Vec<_>, _>>()
                .expect("cert");
            let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&files.key).expect("key");
            let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .expect("client auth");
            std::sync::Arc::new(config)
        }
    }
}

/// Sends `req` (a path, from [`request`]) over TLS with `config` to a
/// server of role `server` at `addr`: status and body, or why the
/// connection failed (a refused certificate ends the handshake with an
/// alert).
pub fn tls_call(
    addr: &str,
    config: std::sync::Arc<rustls::ClientConfig>,
    server: CertRole,
    req: Request,
) -> Result<(u16, String), String> {
    let r = req
        .base(&format!("https://{addr}"))
        .tls(config, &server.dns_name())
        .timeout(Duration::from_secs(30))
        .send()
        .map_err(|e| e.to_string())?;
    match r.cut {
        Some(cut) => Err(cut),
        None => Ok((r.status, r.body)),
    }
}

/// A request for [`tls_call`] with a bearer token and a JSON body.
pub fn request(method: &str, path: &str, token: &str, body: &str) -> Request {
    Request::new(method, path).bearer(token).json(body)
}
