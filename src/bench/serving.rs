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
    /// Seed of the prompt mix.
    #[arg(long, default_value_t = 1)]
    seed: u64,
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
}

/// One request's timings.
#[derive(Debug)]
struct Sample {
    ttft: Duration,
    e2e: Duration,
    tokens: usize,
}

pub(crate) fn run(args: &ServingBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.concurrency >= 1 && args.requests >= 1 && args.max_tokens >= 1,
        "--concurrency, --requests and --max-tokens must be at least 1"
    );
    let started = match &args.url {
        Some(_) => None,
        None => Some(Platform::start(args)?),
    };
    let (url, key, target) = match (&args.url, &started) {
        (Some(u), _) => (
            u.trim_end_matches('/').to_owned(),
            args.api_key.clone().unwrap_or_default(),
            u.clone(),
        ),
        (None, Some(p)) => (p.gateway.clone(), p.token.clone(), p.describe.clone()),
        (None, None) => anyhow::bail!("no endpoint"),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let figures = rt.block_on(drive(args, &url, &key, target))?;
    drop(started);
    if args.json {
        println!("{}", serde_json::to_string(&figures)?);
    } else {
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
    }
    Ok(())
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

type Http = HttpClient<HttpConnector, Full<Bytes>>;

async fn drive(
    args: &ServingBenchArgs,
    url: &str,
    key: &str,
    target: String,
) -> anyhow::Result<Figures> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    // A fresh connection per request: a pooled one that the server closed
    // after its last stream (llama-server does) fails the next request
    // before it is sent.
    let http: Http = HttpClient::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build(connector);
    let queue = std::sync::Arc::new(std::sync::Mutex::new(prompts(args.seed, args.requests)));
    let start = Instant::now();
    let mut clients = Vec::new();
    for _ in 0..args.concurrency {
        let (http, queue) = (http.clone(), std::sync::Arc::clone(&queue));
        let (url, key, model) = (url.to_owned(), key.to_owned(), args.model.clone());
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
        target,
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
    let mut req = hyper::Request::post(format!("{url}/v1/completions"))
        .header("content-type", "application/json");
    if !key.is_empty() {
        req = req.header("authorization", format!("Bearer {key}"));
    }
    let req = req.body(Full::new(Bytes::from(body.to_string())))?;
    let sent = Instant::now();
    let resp = http.request(req).await.context("connecting")?;
    let status = resp.status();
    let mut body = resp.into_body();
    if status != hyper::StatusCode::OK {
        let bytes = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        anyhow::bail!("HTTP {status}: {}", String::from_utf8_lossy(&bytes));
    }
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
    Ok(Sample {
        ttft: first.unwrap_or(e2e),
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
        let up = crate::platform::up::child::UpChild::start("bench-serving", &a, false)?;
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
            _up: up,
        })
    }
}
