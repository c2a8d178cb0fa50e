//! `bulkhead prober`: the platform watching its own answers for another
//! tenant's data, from outside, as tenants see them. `up` starts it.
//!
//! Every round, for every model the first sentinel account can call (the
//! public ones), through the gateway:
//! - **golden answers**: greedy completions of fixed prompts, recorded the
//!   first time the prober sees a config version (asked twice, alone; they
//!   must agree) and compared on every later round. The CPU kernels are
//!   deterministic and batch-invariant, so any difference is a finding;
//! - **canaries**: sentinel A plants a fresh random marker in its prompt
//!   while sentinel B sends, at the same time, a normal request, a
//!   streamed one, one just under the model's limits, one just over, one
//!   it aborts mid-stream and one it abandons unread. Any byte of A's
//!   marker in B's answers, or an HTTP 200 for the over-long prompt, is a
//!   finding.
//!
//! On a finding the prober flips the model private (its streams in flight
//! end), with the evidence (check, request ids) as the reason; opens a
//! major incident on the status page; counts it
//! (`bulkhead.prober.findings`); and posts it to `--webhook`. It does that
//! once per model until a responder acts (makes the model public again).
//! Its own network errors and timeouts never flip anything: they are
//! counted (`bulkhead.prober.errors`) and logged.
//!
//! An embedding model gets the same two checks in its own terms
//! (`embeddings.rs`): a golden vector, and sentinel B's vectors, asked
//! while sentinel A embeds marker texts, equal to B's vectors asked alone.

use anyhow::Context;
use bulkhead_control_api::{
    Client, ComponentChange, ComponentStatus, Credentials, Impact, IncidentStatus, ModelSlug,
    ModelView, OpenIncident, SetVisibility, Visibility,
};
use bulkhead_telemetry::KeyValue;
use clap::Args;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

mod embeddings;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Flags of `bulkhead prober`. Tokens come from the environment only.
#[derive(Debug, Args)]
pub(crate) struct ProberArgs {
    /// The gateway tenants call (plain HTTP, as `up` serves it).
    #[arg(long, env = "BULKHEAD_GATEWAY_URL")]
    gateway: String,
    /// The control plane's admin API, for flips and incidents.
    #[arg(long = "control-plane", env = "BULKHEAD_CONTROL_PLANE_URL")]
    control_plane: String,
    /// Seconds between rounds.
    #[arg(long, default_value_t = 30)]
    interval_secs: u64,
    /// Where golden answers are kept between runs.
    #[arg(long, default_value = ".bulkhead/prober.json")]
    state: PathBuf,
    /// An HTTP URL each finding is POSTed to, as JSON.
    #[arg(long)]
    webhook: Option<String>,
    /// Stop after this many rounds (0: never).
    #[arg(long, default_value_t = 0)]
    rounds: u64,
    #[command(flatten)]
    metrics: crate::process::MetricsArgs,
}

/// A sentinel account: `BULKHEAD_SENTINELS` holds a JSON list of them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Sentinel {
    pub(crate) id: String,
    pub(crate) token: String,
}

/// The responder token the prober flips with (environment only).
const RESPONDER_ENV: &str = "BULKHEAD_PROBER_TOKEN";
/// The sentinel accounts (environment only).
const SENTINELS_ENV: &str = "BULKHEAD_SENTINELS";

/// Prompts whose greedy answers are recorded and compared.
const GOLDEN: [&str; 2] = ["The capital of France is", "1, 2, 3, 4, 5,"];
const GOLDEN_TOKENS: u64 = 12;

pub(crate) fn run(args: &ProberArgs) -> anyhow::Result<()> {
    let responder = crate::config::secret(RESPONDER_ENV)
        .with_context(|| format!("{RESPONDER_ENV} must hold a responder's token"))?;
    let sentinels: Vec<Sentinel> = serde_json::from_str(
        &crate::config::secret(SENTINELS_ENV)
            .with_context(|| format!("{SENTINELS_ENV} must list the sentinel accounts"))?,
    )
    .with_context(|| format!("{SENTINELS_ENV} is not a JSON list of {{id, token}}"))?;
    anyhow::ensure!(
        sentinels.len() >= 2,
        "the prober needs two sentinel accounts"
    );
    anyhow::ensure!(
        args.gateway.starts_with("http://"),
        "--gateway must be an http:// URL"
    );
    if let Some(w) = &args.webhook {
        anyhow::ensure!(w.starts_with("http://"), "--webhook must be an http:// URL");
    }
    let admin = Client::new(&Credentials {
        control_plane_url: args.control_plane.clone(),
        operator_token: responder,
    })?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let metrics_line = args.metrics.start().await?;
        println!(
            "bulkhead prober: listening gateway={}{metrics_line}",
            args.gateway
        );
        let mut p = Prober {
            gateway: args.gateway.trim_start_matches("http://").to_owned(),
            admin,
            a: sentinels[0].clone(),
            b: sentinels[1].clone(),
            webhook: args.webhook.clone(),
            state_path: args.state.clone(),
            state: load_state(&args.state),
        };
        let mut round = 0u64;
        loop {
            round += 1;
            p.round().await;
            if args.rounds != 0 && round >= args.rounds {
                return Ok(());
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(args.interval_secs.max(1))) => {}
                () = crate::process::shutdown() => return Ok(()),
            }
        }
    })
}

/// What the prober remembers across runs.
#[derive(Debug, Default, Serialize, Deserialize)]
struct State {
    /// Golden answers by `slug`, config version and prompt.
    golden: BTreeMap<String, String>,
    /// Models it withdrew that no responder has made public since.
    withdrawn: BTreeSet<String>,
}

fn load_state(path: &std::path::Path) -> State {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default()
}

struct Prober {
    gateway: String,
    admin: Client,
    a: Sentinel,
    b: Sentinel,
    webhook: Option<String>,
    state_path: PathBuf,
    state: State,
}

/// Something the prober saw that only a leak or a broken worker explains.
#[derive(Debug)]
struct Finding {
    check: &'static str,
    evidence: String,
}

/// Why a probe produced no verdict: never a reason to flip.
#[derive(Debug)]
enum ProbeError {
    /// Connecting, sending or reading failed or timed out.
    Network(&'static str),
    /// The platform answered 5xx, or 4xx to a request that should pass:
    /// busy, or the model changed under the probe.
    Refused(u16),
}

/// One HTTP answer.
#[derive(Debug)]
struct Answer {
    status: u16,
    request_id: String,
    body: String,
}

impl Answer {
    /// The body as JSON, when the call succeeded.
    fn json(&self) -> Result<Value, ProbeError> {
        if self.status != 200 {
            return Err(ProbeError::Refused(self.status));
        }
        serde_json::from_str(&self.body).map_err(|_| ProbeError::Network("bad answer"))
    }
}

impl Prober {
    async fn round(&mut self) {
        metrics().rounds.add(1, &[]);
        let models = match self.models().await {
            Ok(m) => m,
            Err(e) => return self.error("list models", &e),
        };
        // A model made public again after the prober withdrew it: a
        // responder acted, so it may act again.
        let public: BTreeSet<String> = models.iter().map(|m| m.slug.to_string()).collect();
        self.state.withdrawn.retain(|s| !public.contains(s));
        for m in models {
            let slug = m.slug.to_string();
            let found = if embeddings::embeds(&m) {
                self.embedding_checks(&m).await
            } else {
                match self.golden(&m).await {
                    Ok(None) => self.canaries(&m).await,
                    other => other,
                }
            };
            match found {
                Ok(None) => {}
                Ok(Some(f)) => self.act(&m.slug, f).await,
                Err(e) => self.error(&slug, &e),
            }
        }
        self.save();
    }

    fn error(&self, what: &str, e: &ProbeError) {
        let kind = match e {
            ProbeError::Network(k) => *k,
            ProbeError::Refused(s) if *s >= 500 => "refused_5xx",
            ProbeError::Refused(_) => "refused_4xx",
        };
        metrics()
            .errors
            .add(1, &[KeyValue::new("error.type", kind)]);
        tracing::warn!(target: "bulkhead::prober", what, error = ?e, "probe gave no verdict");
    }

    fn save(&self) {
        if let Ok(text) = serde_json::to_string_pretty(&self.state) {
            let _ = std::fs::write(&self.state_path, text);
        }
    }

    /// The public models, with their limits and active config.
    async fn models(&self) -> Result<Vec<ModelView>, ProbeError> {
        let a = self
            .call("GET", "/v1/models", &self.a, None)
            .await?
            .json()?;
        let mut out = Vec::new();
        for m in a["data"].as_array().into_iter().flatten() {
            let Some(slug) = m["id"].as_str().and_then(|s| s.parse::<ModelSlug>().ok()) else {
                continue;
            };
            let path = format!("/admin/v1/models/{}", slug.path_segment());
            match self.admin.get::<ModelView>(&path).await {
                Ok(view) if view.visibility == Visibility::Public => out.push(view),
                Ok(_) => {}
                Err(_) => return Err(ProbeError::Network("control plane")),
            }
        }
        Ok(out)
    }

    /// Golden answers: recorded once per config version, then compared.
    async fn golden(&mut self, m: &ModelView) -> Result<Option<Finding>, ProbeError> {
        let version = m.active_config.unwrap_or(0);
        for prompt in GOLDEN {
            let key = format!("{} v{version} {prompt}", m.slug);
            let (text, id) = self.complete(m, &self.a, prompt).await?;
            match self.state.golden.get(&key) {
                Some(expected) if *expected == text => {}
                Some(expected) => {
                    return Ok(Some(Finding {
                        check: "golden_answer",
                        evidence: format!(
                            "request {id}: the greedy answer to a golden prompt changed ({} bytes, expected {} bytes recorded for config v{version})",
                            text.len(),
                            expected.len()
                        ),
                    }));
                }
                None => {
                    let (again, id2) = self.complete(m, &self.a, prompt).await?;
                    if again != text {
                        return Ok(Some(Finding {
                            check: "golden_answer",
                            evidence: format!(
                                "requests {id} and {id2}: the same greedy prompt got two answers while recording config v{version}"
                            ),
                        }));
                    }
                    self.state.golden.insert(key, text);
                }
            }
        }
        metrics()
            .checks
            .add(1, &[KeyValue::new("check", "golden_answer")]);
        Ok(None)
    }

    /// A greedy raw completion as a Workers AI call: its text and request id.
    async fn complete(
        &self,
        m: &ModelView,
        who: &Sentinel,
        prompt: &str,
    ) -> Result<(String, String), ProbeError> {
        let body =
            json!({"prompt": prompt, "raw": true, "max_tokens": GOLDEN_TOKENS, "temperature": 0});
        let a = self
            .call("POST", &run_path(who, &m.slug), who, Some(&body))
            .await?;
        if a.status != 200 {
            return Err(ProbeError::Refused(a.status));
        }
        let v: Value =
            serde_json::from_str(&a.body).map_err(|_| ProbeError::Network("bad answer"))?;
        let text = v["result"]["response"]
            .as_str()
            .ok_or(ProbeError::Network("bad answer"))?
            .to_owned();
        Ok((text, a.request_id))
    }

    /// Sentinel A's marker against everything sentinel B does at once.
    async fn canaries(&self, m: &ModelView) -> Result<Option<Finding>, ProbeError> {
        let marker = marker();
        let path_a = run_path(&self.a, &m.slug);
        let path_b = run_path(&self.b, &m.slug);
        let a_body = json!({"prompt": format!("{marker} {marker} {marker} {marker}"), "raw": true,
                            "max_tokens": 24, "temperature": 0});
        let limit = m.properties.map_or(0, |p| p.context_window);
        let max = 4u64;
        let normal =
            json!({"prompt": "Tell me about the sea.", "max_tokens": 12, "temperature": 0});
        let streamed = json!({"prompt": "Name three colours.", "max_tokens": 12, "stream": true});
        // "hello hello ..." is one token per word; the chat template is off.
        let under = json!({"prompt": words(limit.saturating_sub(max).clamp(1, 512)), "raw": true, "max_tokens": max});
        // The over-long prompt as token ids (OpenAI's completions take
        // them), so it reaches a worker for any window: as text it would
        // pass the gateway's character cap only below about 21,800 tokens.
        let over_tokens = limit.saturating_sub(max) + 1;
        let over = json!({"model": m.slug, "prompt": vec![OVER_LONG_TOKEN; usize::try_from(over_tokens).unwrap_or(usize::MAX)],
                          "max_tokens": max, "temperature": 0});
        let aborted = json!({"prompt": "Count to fifty.", "max_tokens": 48, "stream": true});
        let abandoned = json!({"prompt": "Write a long poem.", "max_tokens": 48});
        let (a, b) = tokio::join!(self.call("POST", &path_a, &self.a, Some(&a_body)), async {
            let (n, s, u) = tokio::join!(
                self.call("POST", &path_b, &self.b, Some(&normal)),
                self.call("POST", &path_b, &self.b, Some(&streamed)),
                self.call("POST", &path_b, &self.b, Some(&under)),
            );
            let o = self
                .call("POST", "/v1/completions", &self.b, Some(&over))
                .await;
            let cut = tokio::join!(
                self.hang_up(&path_b, &self.b, &aborted, 200),
                self.hang_up(&path_b, &self.b, &abandoned, 0),
            );
            (n, s, u, o, cut)
        });
        let a = a?;
        if a.status != 200 {
            return Err(ProbeError::Refused(a.status));
        }
        let (normal, streamed, under, over, (aborted, abandoned)) = b;
        let over = over?;
        if over.status == 200 {
            return Ok(Some(Finding {
                check: "over_long_answered",
                evidence: format!(
                    "request {}: a prompt of {over_tokens} tokens over a {limit}-token window got HTTP 200",
                    over.request_id,
                ),
            }));
        }
        // Refused for its length at a worker's door, or the check tested
        // nothing (a refusal for any other reason is the probe's failure).
        if !over.body.contains("context_length_exceeded") {
            return Err(ProbeError::Refused(over.status));
        }
        let mut seen = vec![normal?, streamed?, under?, over];
        seen.extend([aborted?, abandoned?]);
        for b in &seen {
            if visible(&b.body).contains(&marker) || b.body.contains(&marker) {
                return Ok(Some(Finding {
                    check: "canary_crossed",
                    evidence: format!(
                        "sentinel A's marker (request {}) appeared in sentinel B's answer (request {})",
                        a.request_id, b.request_id
                    ),
                }));
            }
        }
        metrics().checks.add(1, &[KeyValue::new("check", "canary")]);
        Ok(None)
    }

    /// Withdraws the model, opens an incident, counts and reports, once per
    /// model until a responder acts.
    async fn act(&mut self, slug: &ModelSlug, f: Finding) {
        metrics().findings.add(
            1,
            &[
                KeyValue::new("gen_ai.request.model", slug.to_string()),
                KeyValue::new("check", f.check),
            ],
        );
        tracing::error!(target: "bulkhead::prober", model = %slug, check = f.check, evidence = %f.evidence, "leak prober finding");
        if !self.state.withdrawn.insert(slug.to_string()) {
            return; // already withdrawn; waiting for a responder
        }
        self.save();
        let reason = format!("leak prober: {}: {}", f.check, f.evidence);
        let flip = SetVisibility {
            visibility: Visibility::Private,
            reason: reason.clone(),
            end_streams: true,
        };
        let path = format!("/admin/v1/models/{}/visibility", slug.path_segment());
        if let Err(e) = self.admin.post::<_, Value>(&path, &flip).await {
            // Not withdrawn after all: try again next round.
            self.state.withdrawn.remove(&slug.to_string());
            tracing::error!(target: "bulkhead::prober", model = %slug, error = %e, "could not withdraw the model");
            return;
        }
        metrics().flips.add(1, &[]);
        let incident = OpenIncident {
            name: format!("{slug} withdrawn: the leak prober found {}", f.check),
            status: IncidentStatus::Investigating,
            impact: Impact::Major,
            body: format!(
                "Bulkhead's leak prober withdrew {slug} automatically. {reason}. Responders are investigating."
            ),
            components: vec![ComponentChange {
                model: slug.clone(),
                status: ComponentStatus::MajorOutage,
            }],
        };
        if let Err(e) = self
            .admin
            .post::<_, Value>("/admin/v1/incidents", &incident)
            .await
        {
            tracing::error!(target: "bulkhead::prober", model = %slug, error = %e, "could not open the incident");
        }
        if let Some(url) = &self.webhook {
            let body = json!({"model": slug.as_str(), "check": f.check, "evidence": f.evidence,
                              "action": "withdrawn", "at": bulkhead_control_api::Timestamp::now()});
            if let Err(e) = post_webhook(url, &body).await {
                tracing::warn!(target: "bulkhead::prober", error = ?e, "webhook failed");
            }
        }
    }

    /// One HTTP/1.0 request to the gateway, read to its end.
    async fn call(
        &self,
        method: &str,
        path: &str,
        who: &Sentinel,
        body: Option<&Value>,
    ) -> Result<Answer, ProbeError> {
        let fut = async {
            let mut s = self.send(method, path, who, body).await?;
            let mut raw = Vec::new();
            s.read_to_end(&mut raw)
                .await
                .map_err(|_| ProbeError::Network("read"))?;
            parse(&raw)
        };
        within(Duration::from_secs(120), fut).await
    }

    /// Sends a request, reads `bytes` of the answer, and hangs up.
    async fn hang_up(
        &self,
        path: &str,
        who: &Sentinel,
        body: &Value,
        bytes: usize,
    ) -> Result<Answer, ProbeError> {
        let fut = async {
            let mut s = self.send("POST", path, who, Some(body)).await?;
            let mut raw = vec![0u8; bytes];
            let mut got = 0;
            while got < bytes {
                match s.read(&mut raw[got..]).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got += n,
                }
            }
            raw.truncate(got);
            Ok::<_, ProbeError>(Answer {
                status: 0,
                request_id: header(&raw, "x-request-id").unwrap_or_default(),
                body: String::from_utf8_lossy(&raw).into_owned(),
            })
        };
        within(Duration::from_secs(60), fut).await
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        who: &Sentinel,
        body: Option<&Value>,
    ) -> Result<tokio::net::TcpStream, ProbeError> {
        let mut s = tokio::net::TcpStream::connect(&self.gateway)
            .await
            .map_err(|_| ProbeError::Network("connect"))?;
        let body = body.map(Value::to_string).unwrap_or_default();
        let req = format!(
            "{method} {path} HTTP/1.0\r\nHost: {}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.gateway,
            who.token,
            body.len()
        );
        s.write_all(req.as_bytes())
            .await
            .map_err(|_| ProbeError::Network("send"))?;
        Ok(s)
    }
}

fn run_path(who: &Sentinel, slug: &ModelSlug) -> String {
    format!(
        "/client/v4/accounts/{}/ai/run/{}",
        who.id,
        slug.path_segment()
    )
}

/// A fresh random marker no model would write by chance.
fn marker() -> String {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    format!("ZQX{:016X}", u64::from_le_bytes(b))
}

/// The token id the over-long canary repeats (an ordinary word piece in
/// any vocabulary of more than a thousand tokens).
const OVER_LONG_TOKEN: u32 = 1000;

pub(crate) fn words(n: u64) -> String {
    let mut s = String::from("hello");
    for _ in 1..n {
        s.push_str(" hello");
    }
    s
}

/// An SSE body's text joined up, so a marker split across events is found.
pub(crate) fn visible(body: &str) -> String {
    let mut out = String::new();
    for event in body.split("\n\n") {
        if let Some(data) = event.strip_prefix("data: ")
            && let Ok(v) = serde_json::from_str::<Value>(data)
        {
            for t in [&v["response"], &v["choices"][0]["delta"]["content"]] {
                if let Some(t) = t.as_str() {
                    out.push_str(t);
                }
            }
        }
    }
    out
}

fn header(raw: &[u8], name: &str) -> Option<String> {
    let text = String::from_utf8_lossy(raw);
    let head = text.split("\r\n\r\n").next()?;
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_owned())
    })
}

fn parse(raw: &[u8]) -> Result<Answer, ProbeError> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or(ProbeError::Network("bad answer"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or(ProbeError::Network("bad answer"))?;
    Ok(Answer {
        status,
        request_id: header(raw, "x-request-id").unwrap_or_default(),
        body: body.to_owned(),
    })
}

async fn post_webhook(url: &str, body: &Value) -> Result<(), ProbeError> {
    let rest = url.trim_start_matches("http://");
    let (host, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_owned()), |(h, p)| (h, format!("/{p}")));
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(host)
            .await
            .map_err(|_| ProbeError::Network("connect"))?;
        let body = body.to_string();
        let req = format!(
            "POST {path} HTTP/1.0\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes())
            .await
            .map_err(|_| ProbeError::Network("send"))?;
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw).await;
        Ok(())
    };
    tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .map_err(|_| ProbeError::Network("timeout"))?
}

struct Instruments {
    rounds: bulkhead_telemetry::metrics::Counter<u64>,
    checks: bulkhead_telemetry::metrics::Counter<u64>,
    findings: bulkhead_telemetry::metrics::Counter<u64>,
    flips: bulkhead_telemetry::metrics::Counter<u64>,
    errors: bulkhead_telemetry::metrics::Counter<u64>,
}

fn metrics() -> &'static Instruments {
    static I: std::sync::OnceLock<Instruments> = std::sync::OnceLock::new();
    I.get_or_init(|| {
        let m = bulkhead_telemetry::meter();
        Instruments {
            rounds: m
                .u64_counter("bulkhead.prober.rounds")
                .with_description("Rounds of the leak prober")
                .build(),
            checks: m
                .u64_counter("bulkhead.prober.checks")
                .with_description("Checks the leak prober passed, by check")
                .build(),
            findings: m
                .u64_counter("bulkhead.prober.findings")
                .with_description("Findings of the leak prober, by model and check")
                .build(),
            flips: m
                .u64_counter("bulkhead.prober.withdrawals")
                .with_description("Models the leak prober made private")
                .build(),
            errors: m
                .u64_counter("bulkhead.prober.errors")
                .with_description(
                    "Probes that gave no verdict (network, timeout, refused): never a flip",
                )
                .build(),
        }
    })
}

/// `fut`'s result, or a network error when it takes longer than `limit`.
async fn within<T>(
    limit: Duration,
    fut: impl Future<Output = Result<T, ProbeError>>,
) -> Result<T, ProbeError> {
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| ProbeError::Network("timeout"))?
}
