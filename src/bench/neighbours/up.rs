//! `bulkhead bench neighbours --up`: the same question from outside, as
//! tenants see it. A platform started with `bulkhead up` (one model, a
//! prefill/decode pair); tenant A's short streamed completions through the
//! gateway, alone and then while tenant B floods it with prompts at 80% of
//! the served window, `--long-streams` at a time, beside
//! `--reserve-streams` streams that may each generate to the window. Each
//! of B's requests ends answered, refused fast (429 or 503 with
//! `retry-after` within a second; B then waits as told, up to 2 s), refused
//! slowly, or failed (anything else: a 502 after waiting, an error in the
//! stream). The target: none of B's in-window requests fails or is refused
//! slowly, and A's p99 time to first token stays within 3x its p99 alone.

use super::{NeighboursBenchArgs, percentile};
use crate::bench::Prompts;
use crate::platform::up::child::UpChild;
use anyhow::Context;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

type Http = HttpClient<HttpConnector, Full<Bytes>>;

/// Where and as whom to call.
#[derive(Clone)]
pub(crate) struct Gateway {
    pub(crate) http: Http,
    pub(crate) url: String,
}

/// How B's requests ended: a count by [`End`].
type Ends = std::collections::BTreeMap<End, usize>;

/// How one of B's requests ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum End {
    Answered,
    /// 429 or 503 with `retry-after`, within a second.
    RefusedFast,
    /// 429 or 503 later, or without `retry-after`.
    RefusedSlow,
    Failed,
}

/// One streamed completion's end: its time to first text, or how it ended
/// without one (and the wait a refusal asked for).
enum Call {
    Text(Duration),
    Refused {
        status: u16,
        took: Duration,
        retry: Option<u64>,
    },
    Failed(String),
}

/// A platform `bulkhead up` started for a benchmark (one model, no
/// prober): its credentials, tenant A's and B's API keys, a client of its
/// gateway. Dropping it stops the platform.
pub(crate) struct Platform {
    pub(crate) up: UpChild,
    pub(crate) creds: Value,
    pub(crate) a: String,
    pub(crate) b: String,
    pub(crate) gw: Gateway,
}

impl Platform {
    /// Starts `up` in a data directory named after `bench`.
    pub(crate) fn start(bench: &str) -> anyhow::Result<Platform> {
        let up = UpChild::start(
            bench,
            &["--port", "0", "--models", "q4_1", "--no-prober"],
            false,
        )?;
        let creds = up.read("credentials.json")?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Ok(Platform {
            a: text_of(&creds["accounts"][0]["token"]),
            b: text_of(&creds["accounts"][1]["token"]),
            gw: Gateway {
                http: HttpClient::builder(TokioExecutor::new()).build(connector),
                url: text_of(&creds["gateway_url"]),
            },
            up,
            creds,
        })
    }
}

/// A JSON string's text ("" for anything else).
pub(crate) fn text_of(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_owned()
}

/// Tenant A's prompts of `tokens` tokens as text: `2n + 1` distinct ones,
/// one to warm up (the last) and `n` for each of two phases, none sent
/// twice (a prompt sent before would be found in a worker's prefix cache,
/// which the other phase's would not).
pub(crate) fn a_prompts(
    model: &bulkhead_engine::ModelFile,
    tokens: usize,
    n: usize,
) -> anyhow::Result<Vec<String>> {
    let p = Prompts::new(model, tokens, 2 * n + 1)?;
    Ok((0..2 * n + 1)
        .map(|i| model.tokenizer().decode(&p.get(i, tokens), false))
        .collect())
}

pub(super) fn run(args: &NeighboursBenchArgs) -> anyhow::Result<()> {
    let model = args.model.load()?.0;
    let Platform {
        up,
        creds,
        a,
        b,
        gw,
    } = Platform::start("bench-neighbours")?;
    let internal = up.read("internal-tokens.json")?;
    let s = text_of;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let (window, max_output) = rt.block_on(served_window(
        &s(&creds["control_plane_url"]),
        &s(&internal["admin"]),
    ))?;
    let long_tokens = window * 4 / 5;
    let n = args.samples.max(1);
    let short = a_prompts(&model, args.short_tokens, n)?;
    let (alone_prompts, flooded_prompts, warm_up) =
        (&short[..n], &short[n..2 * n], &short[2 * n..]);
    let long = Prompts::new(&model, long_tokens, 8)?;
    let long: Vec<String> = (0..8)
        .map(|i| model.tokenizer().decode(&long.get(i, long_tokens), false))
        .collect();
    let report = rt.block_on(async {
        // Warm-up, then A alone.
        ttft_of_a(&gw, &a, warm_up).await?;
        let alone = ttft_of_a(&gw, &a, alone_prompts).await?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut flood = JoinSet::new();
        for i in 0..args.long_streams {
            let (gw, b, long, stop) = (gw.clone(), b.clone(), long.clone(), Arc::clone(&stop));
            flood.spawn(async move {
                let mut ends = Ends::new();
                let mut k = i;
                while !stop.load(Ordering::Relaxed) {
                    let call = complete(&gw, &b, &long[k % long.len()], 1, None).await;
                    *ends.entry(classify(&call).await).or_default() += 1;
                    k += 1;
                }
                ends
            });
        }
        // The streams ask for all the window their prompt leaves (a margin
        // for how the text re-tokenizes), up to the model's longest output.
        let reserve = window
            .saturating_sub(args.short_tokens + 16)
            .clamp(1, max_output);
        for i in 0..args.reserve_streams {
            let (gw, b, stop) = (gw.clone(), b.clone(), Arc::clone(&stop));
            let prompt = alone_prompts[i % alone_prompts.len()].clone();
            flood.spawn(async move {
                let mut ends = Ends::new();
                while !stop.load(Ordering::Relaxed) {
                    let call = complete(&gw, &b, &prompt, reserve, Some(&stop)).await;
                    *ends.entry(classify(&call).await).or_default() += 1;
                }
                ends
            });
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        let flooded = ttft_of_a(&gw, &a, flooded_prompts).await?;
        stop.store(true, Ordering::Relaxed);
        let mut ends = Ends::new();
        while let Some(e) = flood.join_next().await {
            for (end, n) in e? {
                *ends.entry(end).or_default() += n;
            }
        }
        let count = |end| ends.get(&end).copied().unwrap_or(0);
        let (a99, f99) = (percentile(&alone, 99), percentile(&flooded, 99));
        anyhow::Ok(json!({
            "mode": "up",
            "window_tokens": window,
            "b_prompt_tokens": long_tokens,
            "b_long_streams": args.long_streams,
            "b_reserve_streams": args.reserve_streams,
            "samples": args.samples,
            "alone": {"a_ttft_p50_ms": percentile(&alone, 50) * 1e3, "a_ttft_p99_ms": a99 * 1e3},
            "flooded": {"a_ttft_p50_ms": percentile(&flooded, 50) * 1e3, "a_ttft_p99_ms": f99 * 1e3},
            "a_p99_vs_alone": f99 / a99,
            "b_answered": count(End::Answered),
            "b_refused_fast": count(End::RefusedFast),
            "b_refused_slow": count(End::RefusedSlow),
            "b_failed": count(End::Failed),
            "target": "a_p99_vs_alone <= 3, b_failed == 0 and b_refused_slow == 0",
        }))
    })?;
    drop(up);
    if args.json {
        println!("{report}");
    } else {
        print_table(&report);
    }
    Ok(())
}

/// The served context window and longest output: the active config's.
async fn served_window(control_plane: &str, admin: &str) -> anyhow::Result<(usize, usize)> {
    let client = bulkhead_control_api::Client::new(&bulkhead_control_api::Credentials {
        control_plane_url: control_plane.to_owned(),
        operator_token: admin.to_owned(),
    })?;
    let slug = crate::platform::register::DEFAULT_SLUG
        .replace('@', "%40")
        .replace('/', "%2F");
    let configs: Vec<bulkhead_control_api::ConfigView> = client
        .get(&format!("/admin/v1/models/{slug}/configs"))
        .await?;
    let active = configs
        .iter()
        .find(|c| c.active)
        .context("no active config")?;
    let p = &active.spec.properties;
    Ok((
        usize::try_from(p.context_window)?,
        usize::try_from(p.max_output)?,
    ))
}

/// Least time from one of tenant A's requests to its next: 250 a minute,
/// within the gateway's default 300 per account, as a client keeping to its
/// limit sends them (back to back, a phase of 150 was refused part-way).
const A_INTERVAL: Duration = Duration::from_millis(240);

/// Tenant A's prompts one after another: seconds to each first text.
pub(crate) async fn ttft_of_a(
    gw: &Gateway,
    key: &str,
    prompts: &[String],
) -> anyhow::Result<Vec<f64>> {
    let mut out = Vec::with_capacity(prompts.len());
    for p in prompts {
        let next = tokio::time::Instant::now() + A_INTERVAL;
        match complete(gw, key, p, 1, None).await {
            Call::Text(t) => out.push(t.as_secs_f64()),
            Call::Refused { status, .. } => anyhow::bail!("tenant A was refused (HTTP {status})"),
            Call::Failed(why) => anyhow::bail!("tenant A's request failed: {why}"),
        }
        tokio::time::sleep_until(next).await;
    }
    Ok(out)
}

/// How one of B's calls ended; after a refusal, waits as asked (up to 2 s)
/// before B's next, as a client honouring `retry-after` does.
async fn classify(call: &Call) -> End {
    match call {
        Call::Text(_) => End::Answered,
        Call::Refused { took, retry, .. } => {
            let secs = retry.unwrap_or(1).clamp(1, 2);
            tokio::time::sleep(Duration::from_secs(secs)).await;
            if *took <= Duration::from_secs(1) && retry.is_some() {
                End::RefusedFast
            } else {
                End::RefusedSlow
            }
        }
        Call::Failed(why) => {
            eprintln!("bench neighbours: one of B's requests failed: {why}");
            tokio::time::sleep(Duration::from_millis(100)).await;
            End::Failed
        }
    }
}

/// One streamed `/v1/completions` of `prompt`, `max_tokens` greedy; read
/// to its end, or (with `stop`) until told to stop once it has text.
async fn complete(
    gw: &Gateway,
    key: &str,
    prompt: &str,
    max_tokens: usize,
    stop: Option<&AtomicBool>,
) -> Call {
    let body = json!({
        "model": crate::platform::register::DEFAULT_SLUG, "prompt": prompt,
        "max_tokens": max_tokens, "temperature": 0, "stream": true,
    });
    let req = hyper::Request::post(format!("{}/v1/completions", gw.url))
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {key}"))
        .body(Full::new(Bytes::from(body.to_string())));
    let Ok(req) = req else {
        return Call::Failed("building the request".to_owned());
    };
    let sent = Instant::now();
    let resp = match gw.http.request(req).await {
        Ok(r) => r,
        Err(e) => return Call::Failed(format!("connecting: {e}")),
    };
    let status = resp.status().as_u16();
    if matches!(status, 429 | 503) {
        let retry = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()?.parse().ok());
        return Call::Refused {
            status,
            took: sent.elapsed(),
            retry,
        };
    }
    let mut body = resp.into_body();
    if status != 200 {
        let bytes = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        return Call::Failed(format!(
            "HTTP {status}: {}",
            String::from_utf8_lossy(&bytes)
        ));
    }
    let (mut buf, mut first) = (Vec::new(), None);
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return Call::Failed("the stream broke".to_owned());
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        for payload in crate::bench::serving::sse_payloads(&mut buf) {
            if payload == "[DONE]" {
                return first.map_or_else(|| Call::Failed("no text".to_owned()), Call::Text);
            }
            if payload.contains("\"error\"") {
                return Call::Failed(format!("error event: {payload}"));
            }
            first.get_or_insert_with(|| sent.elapsed());
        }
        // A stream holding its reservation is let go once it has text.
        if let (Some(t), Some(s)) = (first, stop)
            && s.load(Ordering::Relaxed)
        {
            return Call::Text(t);
        }
    }
    Call::Failed("the stream ended without [DONE]".to_owned())
}

fn print_table(r: &Value) {
    let ms = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    println!(
        "through bulkhead up: tenant A's time to first token ({} requests per phase, served window {} tokens)",
        r["samples"], r["window_tokens"]
    );
    println!("{:<48} {:>9} {:>9}", "phase", "p50 ms", "p99 ms");
    println!(
        "{:<48} {:>9.1} {:>9.1}",
        "alone",
        ms(&r["alone"]["a_ttft_p50_ms"]),
        ms(&r["alone"]["a_ttft_p99_ms"])
    );
    let flood = format!(
        "B: {} x {}-token prompts + {} streams",
        r["b_long_streams"], r["b_prompt_tokens"], r["b_reserve_streams"]
    );
    println!(
        "{flood:<48} {:>9.1} {:>9.1}",
        ms(&r["flooded"]["a_ttft_p50_ms"]),
        ms(&r["flooded"]["a_ttft_p99_ms"])
    );
    println!(
        "A's p99 flooded / alone: {:.2}x (target <= 3)",
        ms(&r["a_p99_vs_alone"])
    );
    println!(
        "B: {} answered, {} refused fast (<= 1 s, retry-after), {} refused slowly, {} failed (target: 0 and 0)",
        r["b_answered"], r["b_refused_fast"], r["b_refused_slow"], r["b_failed"]
    );
}
