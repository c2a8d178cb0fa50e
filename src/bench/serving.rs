//! `bulkhead bench serving`: an OpenAI-compatible endpoint driven the way
//! `vllm bench serve` drives one: `--concurrency` closed-loop clients send
//! streamed `/v1/completions` from a fixed, seeded mix of 40–400-word
//! prompts, greedy, `--max-tokens` each. It prints requests/s, output
//! tokens/s, time to first token (p50, p99), time per output token (p50),
//! end-to-end latency (p50, p99) and errors; `--json` prints one object.
//!
//! By default it starts a platform (`bulkhead up` in a temporary data
//! directory, one model) with `--pairs` prefill/decode pairs, or that many
//! colocated workers with `--colocated`; `--url` and `--api-key` point it at
//! any other OpenAI-compatible server instead, for comparison.
//!
//! `--against URL` measures the platform and another OpenAI-compatible
//! server (llama.cpp's `llama-server`, say) in one run, alternating: each
//! round sends a fresh prompt mix cold to both, then the same mix again
//! warm (their prefix caches hold it), the order of the two swapped every
//! round, and prints each side's medians over rounds with the ratios.
//!
//! A platform it starts exports its traces to this process, and each pass
//! prints where the platform's time to first token went, phase by phase
//! (`breakdown.rs`); `--no-breakdown` exports nothing.

mod breakdown;

use anyhow::Context;
use clap::Args;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use std::time::{Duration, Instant};

/// Flags of `bulkhead bench serving`.
#[derive(Debug, Args)]
pub(crate) struct ServingBenchArgs {
    /// Base URL of an OpenAI-compatible server (`…/v1/completions` is
    /// appended); default: a platform this command starts.
    #[arg(long)]
    url: Option<String>,
    /// Bearer token for `--url` (a started platform uses its demo account).
    #[arg(long, env = "BULKHEAD_BENCH_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Base URL of another OpenAI-compatible server measured in the same
    /// run, alternating with the platform, cold and warm; ratios printed.
    #[arg(long, conflicts_with = "url")]
    against: Option<String>,
    /// Bearer token for `--against`.
    #[arg(long, env = "BULKHEAD_BENCH_AGAINST_API_KEY", hide_env_values = true)]
    against_api_key: Option<String>,
    /// Model name sent to `--against` (default: `--model`).
    #[arg(long)]
    against_model: Option<String>,
    /// Rounds of `--against` (each a cold and a warm pass on both sides).
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Model name sent in each request.
    #[arg(long, default_value = crate::platform::register::DEFAULT_SLUG)]
    model: String,
    /// Clients, each sending its next request when the last one ends.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// Requests in all.
    #[arg(long, default_value_t = 32)]
    requests: usize,
    /// Output tokens per request (greedy).
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,
    /// Seed of the prompt mix (default: drawn from the clock and printed,
    /// so a server kept running since an earlier run, whose prefix cache
    /// may still hold that run's prompts, gets prompts it has not seen in
    /// a cold pass).
    #[arg(long)]
    seed: Option<u64>,
    /// Prefill/decode pairs of the platform started (or colocated workers).
    #[arg(long, default_value_t = 1)]
    pairs: u8,
    /// Start colocated workers instead of prefill/decode pairs.
    #[arg(long)]
    colocated: bool,
    /// Compute threads of each worker started.
    #[arg(long)]
    threads: Option<usize>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Export no traces from the platform started, and so print no
    /// breakdown of its time to first token.
    #[arg(long)]
    no_breakdown: bool,
}

/// What one run measured.
#[derive(Debug, Serialize)]
struct Figures {
    requests: usize,
    concurrency: usize,
    req_s: f64,
    out_tok_s: f64,
    ttft_p50_ms: f64,
    ttft_p99_ms: f64,
    tpot_p50_ms: f64,
    e2e_p50_ms: f64,
    e2e_p99_ms: f64,
    errors: usize,
    /// What served it.
    target: String,
    /// Where a started platform's time to first token went.
    #[serde(skip_serializing_if = "Option::is_none")]
    breakdown: Option<breakdown::Breakdown>,
}

/// One request's timings.
#[derive(Debug)]
struct Sample {
    /// The request as its client saw it, for the breakdown (when the
    /// server returned an `x-request-id`).
    seen: Option<breakdown::Seen>,
    ttft: Duration,
    e2e: Duration,
    tokens: usize,
}

/// A server the benchmark drives.
#[derive(Debug, Clone)]
struct Endpoint {
    url: String,
    key: String,
    model: String,
    /// What serves it, in words.
    target: String,
}

impl Endpoint {
    /// The server at base URL `url`, called with bearer `key` (none: no
    /// header) and model name `model`; named by its URL.
    fn at(url: &str, key: Option<&str>, model: &str) -> Endpoint {
        Endpoint {
            url: url.trim_end_matches('/').to_owned(),
            key: key.unwrap_or_default().to_owned(),
            model: model.to_owned(),
            target: url.to_owned(),
        }
    }
}

pub(crate) fn run(args: &ServingBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.concurrency >= 1 && args.requests >= 1 && args.max_tokens >= 1 && args.rounds >= 1,
        "--concurrency, --requests, --max-tokens and --rounds must be at least 1"
    );
    let mut started = match &args.url {
        Some(_) => None,
        None => Some(Platform::start(args)?),
    };
    let mut collector = started.as_mut().and_then(|p| p.collector.take());
    let ours = match (&args.url, &started) {
        (Some(u), _) => Endpoint::at(u, args.api_key.as_deref(), &args.model),
        (None, Some(p)) => Endpoint {
            url: p.gateway.clone(),
            key: p.token.clone(),
            model: args.model.clone(),
            target: p.describe.clone(),
        },
        (None, None) => anyhow::bail!("no endpoint"),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if let Some(c) = &mut collector {
        let _runtime = rt.enter();
        c.serve()?;
    }
    let seed = args.seed.unwrap_or_else(fresh_seed);
    eprintln!("bench serving: prompt mix seed {seed} (--seed repeats it)");
    let Some(other) = &args.against else {
        let figures = rt.block_on(drive(args, &ours, seed, collector.as_mut()))?;
        drop(started);
        if args.json {
            println!("{}", serde_json::to_string(&figures)?);
        } else {
            print_figures(&figures);
        }
        return Ok(());
    };
    let theirs = Endpoint::at(
        other,
        args.against_api_key.as_deref(),
        args.against_model.as_deref().unwrap_or(&args.model),
    );
    let report = rt.block_on(alternate(args, &ours, &theirs, seed, collector.as_mut()))?;
    drop(started);
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_comparison(&report);
    }
    Ok(())
}

fn print_figures(figures: &Figures) {
    println!("bench serving: {}", figures.target);
    println!(
        "  {} requests, concurrency {}, {} errors",
        figures.requests, figures.concurrency, figures.errors
    );
    println!("  requests/s          {:>9.2}", figures.req_s);
    println!("  output tokens/s     {:>9.1}", figures.out_tok_s);
    println!(
        "  TTFT p50 / p99      {:>9.1} / {:.1} ms",
        figures.ttft_p50_ms, figures.ttft_p99_ms
    );
    println!("  TPOT p50            {:>9.1} ms", figures.tpot_p50_ms);
    println!(
        "  end-to-end p50 / p99 {:>8.1} / {:.1} ms",
        figures.e2e_p50_ms, figures.e2e_p99_ms
    );
    if let Some(b) = &figures.breakdown {
        println!("  TTFT went           {b}");
    }
}

/// Both sides' medians over rounds, per pass (cold, warm).
#[derive(Debug, Serialize)]
struct Comparison {
    ours: String,
    theirs: String,
    rounds: usize,
    cold: Side,
    warm: Side,
    /// Every pass as measured, in the order run.
    passes: Vec<Pass>,
}

/// One pass (cold or warm) of both sides: medians over rounds.
#[derive(Debug, Serialize)]
struct Side {
    ours: Medians,
    theirs: Medians,
    /// ours / theirs (above 1: the platform has more).
    out_tok_s_ratio: f64,
    /// ours / theirs (below 1: the platform's first token comes sooner).
    ttft_p50_ratio: f64,
    tpot_p50_ratio: f64,
}

#[derive(Debug, Serialize)]
struct Medians {
    out_tok_s: f64,
    ttft_p50_ms: f64,
    ttft_p99_ms: f64,
    tpot_p50_ms: f64,
    errors: usize,
}

#[derive(Debug, Serialize)]
struct Pass {
    round: usize,
    warm: bool,
    ours: bool,
    figures: Figures,
}

/// Rounds of (cold, warm) on both sides, the side that goes first
/// swapped every round; each round's cold pass is a prompt mix neither
/// side has seen (seed + round), its warm pass the same mix again.
async fn alternate(
    args: &ServingBenchArgs,
    ours: &Endpoint,
    theirs: &Endpoint,
    first_seed: u64,
    mut collector: Option<&mut breakdown::Collector>,
) -> anyhow::Result<Comparison> {
    let mut passes = Vec::new();
    for round in 0..args.rounds {
        let seed = first_seed.wrapping_add(round as u64);
        for warm in [false, true] {
            let order = if round % 2 == 0 {
                [true, false]
            } else {
                [false, true]
            };
            for is_ours in order {
                let endpoint = if is_ours { ours } else { theirs };
                let traced = if is_ours {
                    collector.as_deref_mut()
                } else {
                    None
                };
                let figures = drive(args, endpoint, seed, traced).await?;
                eprintln!(
                    "round {round} {} {}: {:.1} out tok/s, TTFT p50 {:.0} ms, TPOT p50 {:.1} ms, {} errors",
                    if warm { "warm" } else { "cold" },
                    endpoint.target,
                    figures.out_tok_s,
                    figures.ttft_p50_ms,
                    figures.tpot_p50_ms,
                    figures.errors
                );
                if let Some(b) = &figures.breakdown {
                    eprintln!("  TTFT p50 went: {b}");
                }
                passes.push(Pass {
                    round,
                    warm,
                    ours: is_ours,
                    figures,
                });
            }
        }
    }
    let side = |warm: bool| {
        let of = |is_ours: bool| {
            let runs: Vec<&Figures> = passes
                .iter()
                .filter(|p| p.warm == warm && p.ours == is_ours)
                .map(|p| &p.figures)
                .collect();
            let med = |f: fn(&Figures) -> f64| median(runs.iter().map(|r| f(r)).collect());
            Medians {
                out_tok_s: med(|f| f.out_tok_s),
                ttft_p50_ms: med(|f| f.ttft_p50_ms),
                ttft_p99_ms: med(|f| f.ttft_p99_ms),
                tpot_p50_ms: med(|f| f.tpot_p50_ms),
                errors: runs.iter().map(|r| r.errors).sum(),
            }
        };
        let (o, t) = (of(true), of(false));
        Side {
            out_tok_s_ratio: o.out_tok_s / t.out_tok_s,
            ttft_p50_ratio: o.ttft_p50_ms / t.ttft_p50_ms,
            tpot_p50_ratio: o.tpot_p50_ms / t.tpot_p50_ms,
            ours: o,
            theirs: t,
        }
    };
    Ok(Comparison {
        ours: ours.target.clone(),
        theirs: theirs.target.clone(),
        rounds: args.rounds,
        cold: side(false),
        warm: side(true),
        passes,
    })
}

/// The middle value, or the mean of the middle two.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn print_comparison(c: &Comparison) {
    println!("bench serving: {} against {}", c.ours, c.theirs);
    println!(
        "  medians over {} round(s); ratio = bulkhead / other",
        c.rounds
    );
    println!(
        "  {:<22} {:>10} {:>10} {:>7}",
        "", "bulkhead", "other", "ratio"
    );
    for (name, s) in [("cold", &c.cold), ("warm", &c.warm)] {
        let rows = [
            (
                "output tok/s",
                s.ours.out_tok_s,
                s.theirs.out_tok_s,
                s.out_tok_s_ratio,
            ),
            (
                "TTFT p50 ms",
                s.ours.ttft_p50_ms,
                s.theirs.ttft_p50_ms,
                s.ttft_p50_ratio,
            ),
            (
                "TTFT p99 ms",
                s.ours.ttft_p99_ms,
                s.theirs.ttft_p99_ms,
                s.ours.ttft_p99_ms / s.theirs.ttft_p99_ms,
            ),
            (
                "TPOT p50 ms",
                s.ours.tpot_p50_ms,
                s.theirs.tpot_p50_ms,
                s.tpot_p50_ratio,
            ),
        ];
        for (metric, o, t, r) in rows {
            println!(
                "  {:<22} {o:>10.1} {t:>10.1} {r:>6.2}x",
                format!("{name} {metric}")
            );
        }
        println!(
            "  {:<22} {:>10} {:>10}",
            format!("{name} errors"),
            s.ours.errors,
            s.theirs.errors
        );
    }
}

/// A seed no earlier run is likely to have used: the clock's nanoseconds.
fn fresh_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
}

/// The seeded prompt mix: 40 to 400 words each.
fn prompts(seed: u64, n: usize) -> Vec<String> {
    const WORDS: &[&str] = &[
        "the",
        "river",
        "city",
        "bright",
        "morning",
        "quietly",
        "engineer",
        "builds",
        "a",
        "bridge",
        "over",
        "old",
        "stone",
        "market",
        "where",
        "people",
        "trade",
        "bread",
        "and",
        "stories",
        "about",
        "distant",
        "mountains",
        "winter",
        "light",
        "falls",
        "on",
        "every",
        "roof",
        "while",
        "children",
        "learn",
        "numbers",
        "from",
        "their",
        "teacher",
    ];
    let mut state = seed;
    let mut next = move || {
        // SplitMix64.
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    (0..n)
        .map(|_| {
            let len = 40 + (next() % 361) as usize;
            let words: Vec<&str> = (0..len)
                .map(|_| WORDS[(next() % WORDS.len() as u64) as usize])
                .collect();
            words.join(" ")
        })
        .collect()
}

pub(crate) type Http = HttpClient<HttpConnector, Full<Bytes>>;

/// Posts `body` as JSON to `url` (with `key` as a bearer token unless
/// empty); when it was sent and the streamed answer's body, or the
/// answer's status and text when it is not 200.
pub(crate) async fn post_stream(
    http: &Http,
    url: &str,
    key: &str,
    body: &serde_json::Value,
) -> anyhow::Result<(Instant, Option<String>, hyper::body::Incoming)> {
    let mut req = hyper::Request::post(url).header("content-type", "application/json");
    if !key.is_empty() {
        req = req.header("authorization", format!("Bearer {key}"));
    }
    let req = req.body(Full::new(Bytes::from(body.to_string())))?;
    let sent = Instant::now();
    let resp = http.request(req).await.context("connecting")?;
    let status = resp.status();
    let request_id = resp
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = resp.into_body();
    if status != hyper::StatusCode::OK {
        let bytes = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        anyhow::bail!("HTTP {status}: {}", String::from_utf8_lossy(&bytes));
    }
    Ok((sent, request_id, body))
}

async fn drive(
    args: &ServingBenchArgs,
    to: &Endpoint,
    seed: u64,
    collector: Option<&mut breakdown::Collector>,
) -> anyhow::Result<Figures> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    // A fresh connection per request: a pooled one that the server closed
    // after its last stream (llama-server does) fails the next request
    // before it is sent.
    let http: Http = HttpClient::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build(connector);
    let queue = std::sync::Arc::new(std::sync::Mutex::new(prompts(seed, args.requests)));
    let start = Instant::now();
    let mut clients = Vec::new();
    for _ in 0..args.concurrency {
        let (http, queue) = (http.clone(), std::sync::Arc::clone(&queue));
        let (url, key, model) = (to.url.clone(), to.key.clone(), to.model.clone());
        let max_tokens = args.max_tokens;
        clients.push(tokio::spawn(async move {
            let mut out = Vec::new();
            loop {
                let next = queue.lock().map(|mut q| q.pop()).unwrap_or(None);
                let Some(prompt) = next else { break };
                out.push(one(&http, &url, &key, &model, &prompt, max_tokens).await);
            }
            out
        }));
    }
    let mut samples = Vec::new();
    let mut errors = 0;
    for c in clients {
        for r in c.await? {
            match r {
                Ok(s) => samples.push(s),
                Err(e) => {
                    errors += 1;
                    eprintln!("bench serving: request failed: {e:#}");
                }
            }
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let sorted = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v
    };
    let ttft = sorted(samples.iter().map(|s| ms(s.ttft)).collect());
    let e2e = sorted(samples.iter().map(|s| ms(s.e2e)).collect());
    let tpot = sorted(
        samples
            .iter()
            .filter(|s| s.tokens > 1)
            .map(|s| ms(s.e2e - s.ttft) / (s.tokens - 1) as f64)
            .collect(),
    );
    let tokens: usize = samples.iter().map(|s| s.tokens).sum();
    let breakdown = match collector {
        Some(c) => {
            let seen: Vec<breakdown::Seen> =
                samples.iter().filter_map(|s| s.seen.clone()).collect();
            c.breakdown(&seen, Duration::from_secs(5)).await
        }
        None => None,
    };
    Ok(Figures {
        requests: args.requests,
        concurrency: args.concurrency,
        req_s: samples.len() as f64 / wall,
        out_tok_s: tokens as f64 / wall,
        ttft_p50_ms: percentile(&ttft, 0.50),
        ttft_p99_ms: percentile(&ttft, 0.99),
        tpot_p50_ms: percentile(&tpot, 0.50),
        e2e_p50_ms: percentile(&e2e, 0.50),
        e2e_p99_ms: percentile(&e2e, 0.99),
        errors,
        target: to.target.clone(),
        breakdown,
    })
}

/// The `data:` payloads of the server-sent events complete in `buf`,
/// taken out of it (a partial event stays for the next read).
pub(crate) fn sse_payloads(buf: &mut Vec<u8>) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(at) = buf.windows(2).position(|w| w == b"\n\n") {
        let event: Vec<u8> = buf.drain(..at + 2).collect();
        let text = String::from_utf8_lossy(&event);
        if let Some(payload) = text.trim().strip_prefix("data: ") {
            out.push(payload.to_owned());
        }
    }
    out
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// One streamed completion: time to the first text, to `[DONE]`, and the
/// events that carried text (one per token).
async fn one(
    http: &Http,
    url: &str,
    key: &str,
    model: &str,
    prompt: &str,
    max_tokens: usize,
) -> anyhow::Result<Sample> {
    let body = serde_json::json!({
        "model": model, "prompt": prompt, "max_tokens": max_tokens,
        "temperature": 0, "stream": true,
    });
    let sent_at = std::time::SystemTime::now();
    let (sent, request_id, mut body) =
        post_stream(http, &format!("{url}/v1/completions"), key, &body).await?;
    let (mut buf, mut first, mut tokens, mut done) = (Vec::new(), None, 0, false);
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.context("reading the stream")?.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        for payload in sse_payloads(&mut buf) {
            let payload = payload.as_str();
            if payload == "[DONE]" {
                done = true;
                continue;
            }
            let v: serde_json::Value = serde_json::from_str(payload).context("an event")?;
            if v.get("error").is_some() {
                anyhow::bail!("error event: {payload}");
            }
            if v["choices"][0]["text"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
            {
                tokens += 1;
                first.get_or_insert_with(|| sent.elapsed());
            }
        }
    }
    anyhow::ensure!(done, "the stream ended without [DONE]");
    let e2e = sent.elapsed();
    let ttft = first.unwrap_or(e2e);
    Ok(Sample {
        seen: request_id.map(|trace| breakdown::Seen {
            trace,
            sent: breakdown::unix_nanos(sent_at),
            first: breakdown::unix_nanos(sent_at + ttft),
        }),
        ttft,
        e2e,
        tokens,
    })
}

/// A platform started with `bulkhead up`, stopped when dropped.
struct Platform {
    _up: crate::platform::up::child::UpChild,
    gateway: String,
    token: String,
    describe: String,
    /// Where its traces go (taken by `run`).
    collector: Option<breakdown::Collector>,
}

impl Platform {
    fn start(args: &ServingBenchArgs) -> anyhow::Result<Platform> {
        let pairs = args.pairs.max(1).to_string();
        let threads = args.threads.map(|t| t.to_string());
        let mut a = vec![
            "--port",
            "0",
            "--models",
            "q4_1",
            "--decode-workers",
            &pairs,
        ];
        if args.colocated {
            a.push("--colocated");
        } else {
            a.extend_from_slice(&["--prefill-workers", &pairs]);
        }
        if let Some(t) = &threads {
            a.extend_from_slice(&["--threads", t]);
        }
        let collector = if args.no_breakdown {
            None
        } else {
            Some(breakdown::Collector::bind()?)
        };
        // Traces only, exported often, so a pass's are in when it ends.
        let env: Vec<(&str, &str)> = match &collector {
            Some(c) => vec![
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", c.endpoint.as_str()),
                ("OTEL_BSP_SCHEDULE_DELAY", "200"),
            ],
            None => Vec::new(),
        };
        let up =
            crate::platform::up::child::UpChild::start_with_env("bench-serving", &a, &env, false)?;
        let creds = up.read("credentials.json")?;
        let kind = if args.colocated {
            "colocated worker(s)"
        } else {
            "prefill/decode pair(s)"
        };
        Ok(Platform {
            gateway: creds["gateway_url"].as_str().unwrap_or_default().to_owned(),
            token: creds["accounts"][0]["token"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            describe: format!("bulkhead up, {} {kind}", args.pairs.max(1)),
            collector,
            _up: up,
        })
    }
}
