//! `bulkhead bench batch`: what a batch costs interactive users. A platform
//! started with `bulkhead up` (one model, a prefill/decode pair, the batch
//! runner); tenant A's short streamed completions through the gateway,
//! alone, then while tenant B's batch of `--lines` chat lines runs (the
//! batch class: its prompt work after every interactive request's). The
//! target: A's p99 time to first token beside the batch at most 1.2x its
//! p99 alone. The batch's throughput (lines and output tokens a second,
//! until it completes) is reported beside it.

use crate::bench::neighbours::percentile;
use crate::bench::neighbours::up::{Gateway, Platform, a_prompts, text_of, ttft_of_a};
use anyhow::Context;
use clap::Args;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// Flags of `bulkhead bench batch`.
#[derive(Debug, Args)]
pub(crate) struct BatchBenchArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Lines in B's batch.
    #[arg(long, default_value_t = 1000)]
    lines: usize,
    /// Output tokens each batch line asks for.
    #[arg(long, default_value_t = 16)]
    line_tokens: usize,
    /// A's requests per phase. The p99 is a nearest rank: of 200 it is the
    /// third largest, so no single stray request (a shared machine's
    /// hiccup) decides it, as it would of 40, where it is the largest.
    #[arg(long, default_value_t = 200)]
    samples: usize,
    /// Prompt tokens of A's requests.
    #[arg(long, default_value_t = 64)]
    short_tokens: usize,
    #[command(flatten)]
    model: crate::config::ModelArgs,
}

pub(crate) fn run(args: &BatchBenchArgs) -> anyhow::Result<()> {
    let model = args.model.load()?.0;
    let Platform {
        up,
        creds,
        a,
        b,
        gw,
    } = Platform::start("bench-batch")?;
    let slug = text_of(&creds["model"]);
    let n = args.samples.max(1);
    let short = a_prompts(&model, args.short_tokens, n)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let report = rt.block_on(async {
        ttft_of_a(&gw, &a, &short[2 * n..]).await?;
        let alone = ttft_of_a(&gw, &a, &short[..n]).await?;
        let text: Vec<String> = (0..args.lines)
            .map(|i| {
                json!({"custom_id": format!("line-{i}"), "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": slug, "max_tokens": args.line_tokens, "temperature": 0,
                                "messages": [{"role": "user", "content": format!("Write about the number {i}.")}]}})
                .to_string()
            })
            .collect();
        let started = Instant::now();
        let id = submit(&gw, &b, &text.join("\n")).await?;
        // Wait until the runner runs it, then A beside it.
        let mut batch = wait_running(&gw, &b, &id).await?;
        let beside = ttft_of_a(&gw, &a, &short[n..2 * n]).await?;
        let answered_during = batch["request_counts"]["completed"].as_u64().unwrap_or(0);
        while !matches!(batch["status"].as_str(), Some("completed" | "failed" | "cancelled" | "expired")) {
            tokio::time::sleep(Duration::from_millis(500)).await;
            batch = get(&gw, &b, &format!("/v1/batches/{id}")).await?;
        }
        let secs = started.elapsed().as_secs_f64();
        let done = batch["request_counts"]["completed"].as_u64().unwrap_or(0);
        let (a99, b99) = (percentile(&alone, 99), percentile(&beside, 99));
        anyhow::Ok(json!({
            "samples": n,
            "alone": {"a_ttft_p50_ms": percentile(&alone, 50) * 1e3, "a_ttft_p99_ms": a99 * 1e3},
            "beside_batch": {"a_ttft_p50_ms": percentile(&beside, 50) * 1e3, "a_ttft_p99_ms": b99 * 1e3},
            "a_p99_vs_alone": b99 / a99,
            "batch": {"lines": args.lines, "status": batch["status"], "completed": done,
                      "failed": batch["request_counts"]["failed"], "seconds": secs,
                      "lines_per_s": done as f64 / secs,
                      "output_tokens_per_s": (done as f64 * args.line_tokens as f64) / secs,
                      "answered_before_a_finished": answered_during},
            "target": "a_p99_vs_alone <= 1.2",
        }))
    })?;
    drop(up);
    if args.json {
        println!("{report}");
    } else {
        let f = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
        println!("through bulkhead up: tenant A's time to first token ({n} requests per phase)");
        println!("                     p50 ms      p99 ms");
        for (name, key) in [("alone", "alone"), ("beside the batch", "beside_batch")] {
            println!(
                "{name:<18} {:>9.1} {:>11.1}",
                f(&report[key]["a_ttft_p50_ms"]),
                f(&report[key]["a_ttft_p99_ms"])
            );
        }
        println!(
            "A's p99 beside / alone: {:.2}x (target <= 1.2x)",
            f(&report["a_p99_vs_alone"])
        );
        let b = &report["batch"];
        println!(
            "batch: {} of {} lines {} in {:.1} s: {:.2} lines/s, about {:.1} output tokens/s",
            b["completed"],
            b["lines"],
            b["status"].as_str().unwrap_or("?"),
            f(&b["seconds"]),
            f(&b["lines_per_s"]),
            f(&b["output_tokens_per_s"])
        );
    }
    Ok(())
}

/// Uploads `text` for `key`'s account and makes it a batch; its id.
async fn submit(gw: &Gateway, key: &str, text: &str) -> anyhow::Result<String> {
    let form = format!(
        "--X\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
         --X\r\nContent-Disposition: form-data; name=\"file\"; filename=\"bench.jsonl\"\r\n\
         Content-Type: application/jsonl\r\n\r\n{text}\r\n--X--\r\n"
    );
    let file = send(
        gw,
        key,
        "POST",
        "/v1/files",
        "multipart/form-data; boundary=X",
        form,
    )
    .await?;
    let body = json!({"input_file_id": file["id"], "endpoint": "/v1/chat/completions",
                      "completion_window": "24h"});
    let batch = send(
        gw,
        key,
        "POST",
        "/v1/batches",
        "application/json",
        body.to_string(),
    )
    .await?;
    batch["id"]
        .as_str()
        .map(str::to_owned)
        .context("a batch id")
}

/// The batch once the runner has answered some of its lines.
async fn wait_running(gw: &Gateway, key: &str, id: &str) -> anyhow::Result<Value> {
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let b = get(gw, key, &format!("/v1/batches/{id}")).await?;
        if b["request_counts"]["completed"].as_u64() > Some(0) {
            return Ok(b);
        }
        anyhow::ensure!(Instant::now() < until, "the batch did not start: {b}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `GET path`; a 429 (the batch's own lines spend B's request limit, as
/// any of B's calls do) is waited out.
async fn get(gw: &Gateway, key: &str, path: &str) -> anyhow::Result<Value> {
    loop {
        match send(gw, key, "GET", path, "application/json", String::new()).await {
            Err(e) if e.to_string().contains(": 429 ") => {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            other => return other,
        }
    }
}

/// One call's JSON answer; an error status is an error.
async fn send(
    gw: &Gateway,
    key: &str,
    method: &str,
    path: &str,
    content_type: &str,
    body: String,
) -> anyhow::Result<Value> {
    let req = hyper::Request::builder()
        .method(method)
        .uri(format!("{}{path}", gw.url))
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)))?;
    let resp = gw.http.request(req).await?;
    let status = resp.status();
    let bytes = resp.into_body().collect().await?.to_bytes();
    anyhow::ensure!(
        status.is_success(),
        "{method} {path}: {status} {}",
        String::from_utf8_lossy(&bytes)
    );
    Ok(serde_json::from_slice(&bytes)?)
}
