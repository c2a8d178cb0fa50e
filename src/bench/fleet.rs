//! `bulkhead bench prefix --fleet`: what prefix-aware routing saves a
//! multi-turn chat when a model has several workers. A platform
//! (`bulkhead up`, two colocated workers by default) serves `--chats`
//! ten-turn chats through its gateway, turn by turn and chat by chat in
//! turn (so other conversations' requests fall between a chat's turns, as
//! in a fleet), each turn the whole conversation so far with the model's
//! own streamed replies. It runs twice, with the gateway's prefix affinity
//! on and off (`BULKHEAD_PREFIX_AFFINITY=false`: workers picked by load
//! alone), each on a platform of its own started fresh, and prints each
//! turn's median time to first token with the ratio off/on.

use crate::bench::serving::{Http, post_stream, sse_payloads};
use crate::platform::up::child::UpChild;
use anyhow::Context;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use std::time::Duration;

/// What the fleet benchmark runs.
#[derive(Debug, Clone)]
pub(crate) struct FleetArgs {
    pub(crate) turns: usize,
    pub(crate) chats: usize,
    pub(crate) reply_tokens: usize,
    pub(crate) workers: u8,
    pub(crate) json: bool,
}

/// A platform's gateway and the demo account's token.
struct Gateway {
    _up: UpChild,
    url: String,
    token: String,
    model: String,
}

pub(crate) fn run(args: &FleetArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.turns >= 1 && args.chats >= 1 && args.workers >= 2,
        "--turns and --chats must be at least 1 and --fleet-workers at least 2"
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut runs = Vec::new();
    for affinity in [true, false] {
        let gw = start(args.workers, affinity)?;
        eprintln!(
            "prefix affinity {}: {} colocated workers",
            if affinity { "on" } else { "off" },
            args.workers
        );
        let ttft = rt.block_on(chats(&gw, args))?;
        drop(gw);
        runs.push(ttft);
    }
    let (on, off) = (&runs[0], &runs[1]);
    let rows: Vec<(usize, f64, f64)> = (0..args.turns)
        .map(|t| (t + 1, median_ms(&on[t]), median_ms(&off[t])))
        .collect();
    let last = rows.last().map_or(f64::NAN, |r| r.2 / r.1);
    if args.json {
        let turns: Vec<Value> = rows
            .iter()
            .map(|(turn, a, b)| {
                json!({"turn": turn, "ttft_affinity_ms": a, "ttft_load_only_ms": b, "speedup": b / a})
            })
            .collect();
        println!(
            "{}",
            json!({"workers": args.workers, "chats": args.chats, "turns": turns, "last_turn_speedup": last})
        );
    } else {
        println!(
            "bench prefix --fleet: {} colocated workers, {} chats of {} turns through the gateway (medians over chats)",
            args.workers, args.chats, args.turns
        );
        println!("turn  TTFT affinity  TTFT load only  off/on");
        for (turn, a, b) in &rows {
            println!("{turn:>4}  {a:>10.1} ms  {b:>11.1} ms  {:>5.2}x", b / a);
        }
        println!(
            "turn {}: {last:.2}x faster with prefix affinity (target: at least 3x)",
            args.turns
        );
    }
    Ok(())
}

/// `bulkhead up` with `workers` colocated workers, affinity on or off.
fn start(workers: u8, affinity: bool) -> anyhow::Result<Gateway> {
    let n = workers.to_string();
    let up = UpChild::start_with_env(
        "bench-fleet",
        &[
            "--port",
            "0",
            "--models",
            "q4_1",
            "--decode-workers",
            &n,
            "--colocated",
        ],
        &[(
            "BULKHEAD_PREFIX_AFFINITY",
            if affinity { "true" } else { "false" },
        )],
        false,
    )?;
    let creds = up.read("credentials.json")?;
    Ok(Gateway {
        url: creds["gateway_url"]
            .as_str()
            .context("gateway_url")?
            .to_owned(),
        token: creds["accounts"][0]["token"]
            .as_str()
            .context("a demo account")?
            .to_owned(),
        model: crate::platform::register::DEFAULT_SLUG.to_owned(),
        _up: up,
    })
}

/// Every chat's every turn, turns outermost; each turn's TTFT by turn.
async fn chats(gw: &Gateway, args: &FleetArgs) -> anyhow::Result<Vec<Vec<Duration>>> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let http: Http = HttpClient::builder(TokioExecutor::new()).build(connector);
    let mut histories: Vec<Vec<Value>> = (0..args.chats)
        .map(|c| {
            vec![json!({"role": "system", "content": format!(
                "You are a helpful assistant for conversation {c}. Answer in plain sentences."
            )})]
        })
        .collect();
    let mut ttft = vec![Vec::new(); args.turns];
    for (turn, samples) in ttft.iter_mut().enumerate() {
        for (c, history) in histories.iter_mut().enumerate() {
            history.push(json!({"role": "user", "content": question(c, turn)}));
            let (t, reply) = turn_of(&http, gw, history, args.reply_tokens).await?;
            samples.push(t);
            history.push(json!({"role": "assistant", "content": reply}));
        }
    }
    Ok(ttft)
}

/// A user turn of about 60 words, different for every chat and turn.
fn question(chat: usize, turn: usize) -> String {
    const WORDS: &[&str] = &[
        "river", "bridge", "market", "winter", "engine", "garden", "letter", "harbor", "signal",
        "forest", "ladder", "candle", "mirror", "pocket", "valley", "anchor",
    ];
    let mut words = vec![format!("Question {turn} of chat {chat}: tell me about")];
    let mut x = (chat * 131 + turn * 17 + 7) as u64;
    for _ in 0..60 {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        words.push(WORDS[(x >> 33) as usize % WORDS.len()].to_owned());
    }
    words.join(" ")
}

/// One streamed chat completion: time to its first text and its text.
async fn turn_of(
    http: &Http,
    gw: &Gateway,
    messages: &[Value],
    max_tokens: usize,
) -> anyhow::Result<(Duration, String)> {
    let body = json!({
        "model": gw.model, "messages": messages, "max_tokens": max_tokens,
        "temperature": 0, "stream": true,
    });
    let url = format!("{}/v1/chat/completions", gw.url);
    let (sent, _, mut body) = post_stream(http, &url, &gw.token, &body).await?;
    let (mut buf, mut first, mut text) = (Vec::new(), None, String::new());
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.context("reading the stream")?.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        for payload in sse_payloads(&mut buf) {
            if payload == "[DONE]" {
                continue;
            }
            let v: Value = serde_json::from_str(&payload).context("an event")?;
            anyhow::ensure!(v.get("error").is_none(), "error event: {payload}");
            if let Some(t) = v["choices"][0]["delta"]["content"].as_str()
                && !t.is_empty()
            {
                first.get_or_insert_with(|| sent.elapsed());
                text.push_str(t);
            }
        }
    }
    Ok((first.unwrap_or_else(|| sent.elapsed()), text))
}

fn median_ms(v: &[Duration]) -> f64 {
    let mut ms: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    ms.get(ms.len() / 2).copied().unwrap_or(f64::NAN)
}
