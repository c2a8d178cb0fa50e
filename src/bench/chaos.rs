//! `bulkhead bench chaos`: a soak of the whole platform under failure. It
//! starts `bulkhead up` (a prefill worker and two decode workers, a
//! 256-token window, the
//! prefill worker breaking a share of its page frames), drives several
//! accounts that plant canaries in their prompts with normal, streamed,
//! just-under, just-over, aborted and abandoned requests, and meanwhile
//! SIGKILLs the decode worker (`up` restarts it) and SIGSTOPs and SIGCONTs
//! both workers. It then shows what must hold whatever broke: no byte of
//! one account's canaries in another's answers, no HTTP 200 for an
//! over-long prompt, no request past its deadline, every pool back at its
//! baseline, no owner violation. Only test builds have the frame faults.

use crate::platform::prober::{visible, words};
use anyhow::Context;
use clap::Args;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub(crate) struct ChaosBenchArgs {
    /// Requests to send in all.
    #[arg(long, default_value_t = 10_000)]
    requests: u64,
    /// Clients sending at once.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// Percent of page frames the prefill worker breaks.
    #[arg(long, default_value_t = 5)]
    frame_faults_percent: u8,
    /// Seconds between worker faults (a SIGKILL, a SIGSTOP/SIGCONT).
    #[arg(long, default_value_t = 10)]
    signal_every_secs: u64,
    /// A request not answered within this many seconds is hung.
    #[arg(long, default_value_t = 60)]
    deadline_secs: u64,
    /// Print one JSON object instead of a summary.
    #[arg(long)]
    json: bool,
    /// Pass the platform's logs through to stderr.
    #[arg(long)]
    logs: bool,
}

/// The window `up` gets here: short prompts reach it cheaply.
const WINDOW: u64 = 256;
const MAX_TOKENS: u64 = 8;
const ACCOUNTS: usize = 4;

pub(crate) fn run(args: &ChaosBenchArgs) -> anyhow::Result<()> {
    if !bulkhead_engine::hooks::ENABLED {
        return Err(bulkhead_engine::hooks::HooksDisabled("frame faults (bench chaos)").into());
    }
    let p = Platform::start(args.frame_faults_percent, args.logs)?;
    let accounts = p.accounts()?;
    let stats = Arc::new(Stats::default());
    let stop = Arc::new(AtomicBool::new(false));
    let signals = {
        let (stop, stats) = (Arc::clone(&stop), Arc::clone(&stats));
        let (up, every) = (
            p.up.child.id(),
            Duration::from_secs(args.signal_every_secs.max(1)),
        );
        let metrics = p.metrics.clone();
        std::thread::spawn(move || signal_workers(up, every, &stop, &stats, &metrics))
    };
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = Duration::from_secs(args.deadline_secs.max(1));
    std::thread::scope(|s| {
        for c in 0..args.concurrency.max(1) {
            let (next, stats, accounts, gw) = (&next, &stats, &accounts, &p.gateway);
            s.spawn(move || {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (c as u64 + 1));
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= args.requests {
                        return;
                    }
                    let me = (i as usize) % accounts.len();
                    one(gw, accounts, me, &mut rng, deadline, stats);
                }
            });
        }
    });
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Release);
    let _ = signals.join();
    let baseline = p.wait_baseline(Duration::from_secs(120));
    let violations = stats.violations.load(Ordering::Relaxed) + p.owner_violations();
    let mut faults = p.frame_faults();
    for (k, v) in stats.signals.lock().map(|m| m.clone()).unwrap_or_default() {
        faults.insert(k, v);
    }
    let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let outcomes = stats.outcomes.lock().map(|m| m.clone()).unwrap_or_default();
    let v = json!({
        "requests": args.requests,
        "faults_injected": faults,
        "cross_tenant_bytes": g(&stats.cross_bytes),
        "overlong_200": g(&stats.overlong_200),
        "hung": g(&stats.hung),
        "pools_at_baseline": baseline,
        "owner_violations": violations,
        "outcomes": outcomes,
        "req_s": args.requests as f64 / elapsed.as_secs_f64(),
        "seconds": elapsed.as_secs_f64(),
    });
    if args.json {
        println!("{v}");
    } else {
        println!("{}", serde_json::to_string_pretty(&v)?);
    }
    Ok(())
}

#[derive(Debug, Default)]
struct Stats {
    cross_bytes: AtomicU64,
    overlong_200: AtomicU64,
    hung: AtomicU64,
    violations: AtomicU64,
    /// Requests by kind and how they ended.
    outcomes: Mutex<BTreeMap<String, u64>>,
    /// SIGKILL, SIGSTOP sent.
    signals: Mutex<BTreeMap<String, u64>>,
}

impl Stats {
    fn count(&self, map: &Mutex<BTreeMap<String, u64>>, key: String) {
        if let Ok(mut m) = map.lock() {
            *m.entry(key).or_default() += 1;
        }
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// An account: its id, token and canary prefix.
#[derive(Debug, Clone)]
struct Account {
    id: String,
    token: String,
    tag: String,
}

/// One request of a random kind from account `me`.
fn one(
    gw: &str,
    accounts: &[Account],
    me: usize,
    rng: &mut Rng,
    deadline: Duration,
    stats: &Stats,
) {
    let a = &accounts[me];
    let marker = format!("{}{:016X}", a.tag, rng.next());
    let canary = format!("{marker} {marker} {marker} Tell me a story about the sea.");
    let path = format!(
        "/client/v4/accounts/{}/ai/run/@cf/huggingfacetb/smollm2-135m-instruct",
        a.id
    );
    let roll = rng.next() % 100;
    let (kind, body, read) = match roll {
        0..35 => (
            "normal",
            json!({"prompt": canary, "raw": true, "max_tokens": MAX_TOKENS, "temperature": 0}),
            None,
        ),
        35..60 => (
            "streamed",
            json!({"prompt": canary, "raw": true, "max_tokens": MAX_TOKENS, "stream": true}),
            None,
        ),
        60..65 => (
            "just_under",
            json!({"prompt": words(WINDOW - MAX_TOKENS), "raw": true, "max_tokens": MAX_TOKENS}),
            None,
        ),
        65..75 => (
            "just_over",
            json!({"prompt": words(WINDOW - MAX_TOKENS + 1), "raw": true, "max_tokens": MAX_TOKENS}),
            None,
        ),
        75..90 => (
            "aborted",
            json!({"prompt": canary, "raw": true, "max_tokens": 16, "stream": true}),
            Some(120),
        ),
        _ => (
            "abandoned",
            json!({"prompt": canary, "raw": true, "max_tokens": 16}),
            Some(0),
        ),
    };
    let started = Instant::now();
    let (status, text) = match send(gw, &path, &a.token, &body.to_string(), read, deadline) {
        Ok(r) => r,
        Err(e)
            if e.kind() == std::io::ErrorKind::TimedOut
                || e.kind() == std::io::ErrorKind::WouldBlock =>
        {
            stats.hung.fetch_add(1, Ordering::Relaxed);
            stats.count(&stats.outcomes, format!("{kind} hung"));
            return;
        }
        Err(_) => (0, String::new()),
    };
    if started.elapsed() > deadline {
        stats.hung.fetch_add(1, Ordering::Relaxed);
    }
    if kind == "just_over" && status == 200 {
        stats.overlong_200.fetch_add(1, Ordering::Relaxed);
    }
    // Any other account's canary prefix in this answer is a leak.
    let seen = format!("{text}{}", visible(&text));
    for (i, other) in accounts.iter().enumerate() {
        if i != me {
            let n = seen.matches(other.tag.as_str()).count() as u64;
            stats
                .cross_bytes
                .fetch_add(n * (other.tag.len() as u64 + 16), Ordering::Relaxed);
        }
    }
    stats.count(&stats.outcomes, format!("{kind} {status}"));
    if matches!(status, 0 | 502 | 503) && read != Some(0) {
        // A client backs off after a failure, as SDKs do.
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One HTTP/1.0 request: status and body, reading at most `read` bytes
/// (then hanging up) when set; 0 for a request abandoned unread.
fn send(
    gw: &str,
    path: &str,
    token: &str,
    body: &str,
    read: Option<usize>,
    deadline: Duration,
) -> std::io::Result<(u16, String)> {
    let addr = gw.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(deadline))?;
    s.set_write_timeout(Some(deadline))?;
    write!(
        s,
        "POST {path} HTTP/1.0\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut raw = Vec::new();
    match read {
        Some(0) => return Ok((0, String::new())),
        Some(n) => {
            let mut buf = vec![0u8; n];
            let mut got = 0;
            while got < n {
                match s.read(&mut buf[got..])? {
                    0 => break,
                    k => got += k,
                }
            }
            raw.extend_from_slice(&buf[..got]);
        }
        None => {
            s.read_to_end(&mut raw)?;
        }
    }
    let text = String::from_utf8_lossy(&raw);
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    Ok((status, rest.to_owned()))
}

/// The status of a GET with a bearer token.
fn get(gw: &str, path: &str, token: &str) -> std::io::Result<u16> {
    let addr = gw.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\r\n"
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    Ok(text
        .split_whitespace()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or(0))
}

/// Every `every`: a SIGSTOP of a worker for up to 3 s (then SIGCONT), or,
/// one time in four, a SIGKILL of a decode worker (`up` restarts it); until
/// `stop`. A SIGKILL waits until both decode workers run and [`KILL_GAP`]
/// has passed since the last, and goes to the other one than last time, so
/// each lives past the minute after which `up` resets its restart backoff:
/// the platform spends the soak mostly serving, not restarting.
fn signal_workers(
    up: u32,
    every: Duration,
    stop: &AtomicBool,
    stats: &Stats,
    metrics: &BTreeMap<String, String>,
) {
    let mut round = 0u64;
    let mut last = Instant::now();
    let mut last_kill: Option<(Instant, String)> = None;
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(100));
        if last.elapsed() < every {
            continue;
        }
        last = Instant::now();
        round += 1;
        let decodes = children(up, "decode");
        let kill_due = decodes.len() >= 2
            && last_kill
                .as_ref()
                .is_none_or(|(at, _)| at.elapsed() >= KILL_GAP);
        if round.is_multiple_of(4) && kill_due {
            let last_name = last_kill.as_ref().map(|(_, n)| n.as_str());
            let Some((pid, name)) = decodes
                .iter()
                .find(|(_, n)| Some(n.as_str()) != last_name)
                .cloned()
            else {
                continue;
            };
            // Owner violations it counted die with it: read them first.
            if let Some(url) = metrics.get(name.trim_start_matches("up-")) {
                stats.violations.fetch_add(
                    metric(url, "bulkhead_kv_owner_violations_total") as u64,
                    Ordering::Relaxed,
                );
            }
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            stats.count(&stats.signals, "sigkill".to_owned());
            last_kill = Some((Instant::now(), name));
            continue;
        }
        let role = if round % 2 == 1 { "prefill" } else { "decode" };
        let Some((pid, _)) = children(up, role).into_iter().next() else {
            continue;
        };
        let _ = Command::new("kill")
            .args(["-STOP", &pid.to_string()])
            .status();
        std::thread::sleep(Duration::from_millis(500 + (round * 997) % 2500));
        let _ = Command::new("kill")
            .args(["-CONT", &pid.to_string()])
            .status();
        stats.count(&stats.signals, "sigstop".to_owned());
    }
}

/// Least time between two SIGKILLs: with two decode workers killed in
/// turn, each lives past the 60 s after which `up` resets its backoff.
const KILL_GAP: Duration = Duration::from_secs(30);

/// `up`'s children running `bulkhead ROLE ...`: pid and node name.
fn children(up: u32, role: &str) -> Vec<(u32, String)> {
    let Ok(out) = Command::new("pgrep")
        .args([
            "-a",
            "-P",
            &up.to_string(),
            "-f",
            &format!("bulkhead {role} "),
        ])
        .output()
    else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let pid = words.next()?.parse().ok()?;
            let name = words
                .skip_while(|w| *w != "--node-name")
                .nth(1)
                .unwrap_or_default()
                .to_owned();
            Some((pid, name))
        })
        .collect()
}

/// The sum of a Prometheus metric's samples at `url` (0 when unreachable).
fn metric(url: &str, name: &str) -> f64 {
    metric_with(url, name, "")
}

/// `bulkhead up` for the soak, stopped when dropped.
struct Platform {
    up: crate::platform::up::child::UpChild,
    gateway: String,
    control_plane: String,
    /// Component name to its /metrics URL.
    metrics: BTreeMap<String, String>,
    creds: Value,
    internal: Value,
}

impl Platform {
    fn start(frame_faults: u8, logs: bool) -> anyhow::Result<Platform> {
        let (window, faults) = (WINDOW.to_string(), frame_faults.to_string());
        let up = crate::platform::up::child::UpChild::start(
            "bench-chaos",
            &[
                "--port",
                "0",
                "--models",
                "q4_1",
                "--threads",
                "1",
                // Two decode workers: the gateway routes around the one
                // that is stopped or restarting.
                "--decode-workers",
                "2",
                "--kv-budget-mib",
                "64",
                "--context-window",
                &window,
                "--max-output",
                "128",
                "--no-prober",
                "--frame-faults-percent",
                &faults,
            ],
            logs,
        )?;
        let creds = up.read("credentials.json")?;
        let internal = up.read("internal-tokens.json")?;
        let metrics = creds["metrics"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default();
        Ok(Platform {
            gateway: creds["gateway_url"].as_str().unwrap_or_default().to_owned(),
            control_plane: creds["control_plane_url"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            metrics,
            creds,
            internal,
            up,
        })
    }

    /// `up`'s two demo accounts and more made with the admin token, each
    /// with its own canary prefix.
    fn accounts(&self) -> anyhow::Result<Vec<Account>> {
        let mut out: Vec<Account> = self.creds["accounts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| Account {
                id: a["id"].as_str().unwrap_or_default().to_owned(),
                token: a["token"].as_str().unwrap_or_default().to_owned(),
                tag: String::new(),
            })
            .collect();
        let admin = bulkhead_control_api::Client::new(&bulkhead_control_api::Credentials {
            control_plane_url: self.control_plane.clone(),
            operator_token: self.internal["admin"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        })?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        while out.len() < ACCOUNTS {
            let name = format!("chaos-{}", out.len());
            let a: Value = rt.block_on(admin.post("/admin/v1/accounts", &json!({"name": name})))?;
            let id = a["id"].as_str().context("account id")?.to_owned();
            let t: Value = rt.block_on(admin.post(
                &format!("/admin/v1/accounts/{id}/tokens"),
                &json!({"name": "chaos"}),
            ))?;
            let token = t["token"].as_str().context("token")?.to_owned();
            out.push(Account {
                id,
                token,
                tag: String::new(),
            });
        }
        for (i, a) in out.iter_mut().enumerate() {
            a.tag = format!("ZQ{}K", (b'A' + i as u8) as char);
        }
        // New tokens reach the gateway with its next routing table.
        let until = Instant::now() + Duration::from_secs(30);
        for a in &out {
            loop {
                let path = format!("/client/v4/accounts/{}/ai/models/search", a.id);
                match get(&self.gateway, &path, &a.token) {
                    Ok(200) => break,
                    _ if Instant::now() > until => anyhow::bail!("a new account never worked"),
                    _ => std::thread::sleep(Duration::from_millis(200)),
                }
            }
        }
        Ok(out)
    }

    /// Waits until every worker's pool has no page allocated, receiving or
    /// quarantined.
    fn wait_baseline(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        loop {
            let busy: f64 = self
                .metrics
                .iter()
                .filter(|(k, _)| k.contains("prefill") || k.contains("decode"))
                .map(|(_, url)| {
                    metric(url, "bulkhead_kv_pool_pages_allocated")
                        + metric(url, "bulkhead_kv_pool_pages_receiving")
                        + metric(url, "bulkhead_kv_pool_pages_quarantined")
                })
                .sum();
            if busy == 0.0 {
                return true;
            }
            if Instant::now() > until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn owner_violations(&self) -> u64 {
        self.metrics
            .values()
            .map(|url| metric(url, "bulkhead_kv_owner_violations_total") as u64)
            .sum()
    }

    /// Frames the prefill worker broke, by kind.
    fn frame_faults(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        let Some(url) = self.metrics.get("prefill") else {
            return out;
        };
        for kind in ["corrupted", "delayed", "dropped", "duplicated", "reordered"] {
            let n = metric_with(
                url,
                "bulkhead_kv_transfer_chaos_injected_total",
                &format!("kind=\"{kind}\""),
            );
            out.insert(format!("frame_{kind}"), n as u64);
        }
        out
    }
}

/// As [`metric`], only samples whose labels contain `label`.
fn metric_with(url: &str, name: &str, label: &str) -> f64 {
    let Some(rest) = url.strip_prefix("http://") else {
        return 0.0;
    };
    let (addr, path) = rest.split_once('/').unwrap_or((rest, ""));
    let Ok(mut s) = TcpStream::connect(addr) else {
        return 0.0;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(s, "GET /{path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
