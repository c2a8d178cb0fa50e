//! `bulkhead bench embeddings --beside-generation`: what embedding traffic
//! costs generation. A platform started with `bulkhead up` (one generating
//! model on a prefill/decode pair, the embedding worker as `up` starts it);
//! tenant A's short streamed completions through the gateway, alone, then
//! while tenant B sends embedding calls (32 texts of about 60 tokens each)
//! without pause, `--streams` at a time. The target: A's p99 time to first
//! token beside them at most 1.2x its p99 alone. B's rate (inputs a second)
//! is reported beside it.

use super::EmbeddingsBenchArgs;
use crate::bench::neighbours::percentile;
use crate::bench::neighbours::up::{Gateway, Platform, a_prompts, text_of, ttft_of_a};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

/// Prompt tokens of A's requests.
const A_TOKENS: usize = 64;
/// Texts in one of B's calls.
const B_BATCH: usize = 32;

pub(super) fn run(args: &EmbeddingsBenchArgs) -> anyhow::Result<()> {
    let model = args.model.load()?.0;
    let Platform {
        up,
        creds,
        a,
        b,
        gw,
    } = Platform::start("bench-embed-beside")?;
    let slug = text_of(&creds["embedding_model"]);
    anyhow::ensure!(!slug.is_empty(), "the platform serves no embedding model");
    let n = args.samples.max(1);
    let short = a_prompts(&model, A_TOKENS, n)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let report = rt.block_on(async {
        ttft_of_a(&gw, &a, &short[2 * n..]).await?;
        let alone = ttft_of_a(&gw, &a, &short[..n]).await?;
        let stop = Arc::new(AtomicBool::new(false));
        let embedded = Arc::new(AtomicUsize::new(0));
        let refused = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let mut flood = tokio::task::JoinSet::new();
        for s in 0..args.streams.max(1) {
            let (gw, b, slug) = (gw.clone(), b.clone(), slug.clone());
            let (stop, embedded, refused) = (
                Arc::clone(&stop),
                Arc::clone(&embedded),
                Arc::clone(&refused),
            );
            flood.spawn(async move {
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let texts: Vec<String> = (0..B_BATCH)
                        .map(|k| {
                            format!(
                                "Stream {s} call {i} text {k}: {}",
                                "a quiet harbour at dawn, ".repeat(10)
                            )
                        })
                        .collect();
                    if embed(&gw, &b, &slug, &texts).await? {
                        embedded.fetch_add(B_BATCH, Ordering::Relaxed);
                    } else {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                    i += 1;
                }
                anyhow::Ok(())
            });
        }
        // B's calls under way before A measures.
        while embedded.load(Ordering::Relaxed) == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let beside = ttft_of_a(&gw, &a, &short[n..2 * n]).await?;
        stop.store(true, Ordering::Relaxed);
        while let Some(r) = flood.join_next().await {
            r??;
        }
        let rate = embedded.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
        let (a99, b99) = (percentile(&alone, 99), percentile(&beside, 99));
        anyhow::Ok(json!({
            "samples": n,
            "a_prompt_tokens": A_TOKENS,
            "b_streams": args.streams.max(1),
            "b_batch": B_BATCH,
            "a_ttft_ms": {
                "alone": {"p50": 1e3 * percentile(&alone, 50), "p99": 1e3 * a99},
                "beside": {"p50": 1e3 * percentile(&beside, 50), "p99": 1e3 * b99},
            },
            "p99_ratio": b99 / a99,
            "target_p99_ratio": 1.2,
            "b_inputs_per_sec": rate,
            "b_calls_refused_by_rate_limit": refused.load(Ordering::Relaxed),
        }))
    })?;
    drop(up);
    if args.json {
        println!("{report}");
        return Ok(());
    }
    let ms = |phase: &str, p: &str| report["a_ttft_ms"][phase][p].as_f64().unwrap_or(0.0);
    println!(
        "tenant A's time to first token ({n} requests of {A_TOKENS} prompt tokens a phase), alone and while tenant B embeds {} calls of {B_BATCH} texts at a time",
        args.streams.max(1)
    );
    println!("| phase | p50 ms | p99 ms |");
    println!("|---|---|---|");
    for phase in ["alone", "beside"] {
        println!(
            "| {phase} | {:.1} | {:.1} |",
            ms(phase, "p50"),
            ms(phase, "p99")
        );
    }
    println!(
        "p99 beside / alone: {:.2}x (target at most 1.2x); B embedded {:.1} inputs/s meanwhile ({} of its calls refused by its rate limit)",
        report["p99_ratio"].as_f64().unwrap_or(0.0),
        report["b_inputs_per_sec"].as_f64().unwrap_or(0.0),
        report["b_calls_refused_by_rate_limit"]
    );
    Ok(())
}

/// One embedding call of `texts` as `key`: whether it was answered. A
/// call refused by B's rate limit (429) waits as `retry-after` asks (1 to
/// 5 s), as a client honouring it does, and counts as refused.
async fn embed(gw: &Gateway, key: &str, slug: &str, texts: &[String]) -> anyhow::Result<bool> {
    let body = json!({"model": slug, "input": texts, "encoding_format": "base64"}).to_string();
    let req = hyper::Request::post(format!("{}/v1/embeddings", gw.url))
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))?;
    let resp = gw.http.request(req).await?;
    let status = resp.status();
    let retry = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let bytes = resp.into_body().collect().await?.to_bytes();
    if status == hyper::StatusCode::TOO_MANY_REQUESTS {
        let secs = retry.unwrap_or(1).clamp(1, 5);
        tokio::time::sleep(std::time::Duration::from_secs(secs)).await;
        return Ok(false);
    }
    anyhow::ensure!(
        status.is_success(),
        "embedding call: {status} {}",
        String::from_utf8_lossy(&bytes)
    );
    Ok(true)
}
