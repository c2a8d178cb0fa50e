//! `bulkhead bench telemetry`: what the telemetry every request carries
//! costs, against the same route without it, in one run.
//!
//! Telemetry is set up as a component sets it up (spans recorded by the
//! OpenTelemetry SDK, metrics into the Prometheus registry; no exporter,
//! so the figure is the in-process cost), then the same small JSON route is
//! called through `oneshot` bare and wrapped by `bulkhead_telemetry::instrument`,
//! in alternating rounds. Log lines go to stderr at `RUST_LOG` (default
//! `warn` here, so the terminal is not flooded; `RUST_LOG=info` adds the
//! per-request line to the cost).
//!
//! Prints ns per request for both, the added µs and the ratio, and the
//! `/metrics` scrape time after the run.

use anyhow::Context;
use axum::Router;
use axum::body::Body;
use axum::http::Request;
use axum::routing::get;
use clap::Args;
use serde_json::json;
use std::time::Instant;
use tower::ServiceExt;

/// Flags of `bulkhead bench telemetry`.
#[derive(Debug, Args)]
pub(crate) struct TelemetryBenchArgs {
    /// Requests per variant.
    #[arg(long, default_value_t = 50_000)]
    requests: usize,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: &TelemetryBenchArgs) -> anyhow::Result<()> {
    let telemetry = bulkhead_telemetry::init_with_logs(
        "bulkhead-bench",
        "bench",
        "warn",
        &crate::config::telemetry_settings(),
    )
    .context("setting up telemetry")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let out = rt.block_on(measure(args.requests.max(1_000)))?;
    drop(rt);
    drop(telemetry);
    if args.json {
        println!("{out}");
    } else {
        println!(
            "bare route        {:>8.0} ns/request\ninstrumented      {:>8.0} ns/request\nadded             {:>8.2} µs/request ({:.2}× the bare route)\n/metrics scrape   {:>8.2} ms ({} bytes)",
            out["bare_ns"].as_f64().unwrap_or(0.0),
            out["instrumented_ns"].as_f64().unwrap_or(0.0),
            out["added_us"].as_f64().unwrap_or(0.0),
            out["ratio"].as_f64().unwrap_or(0.0),
            out["scrape_ms"].as_f64().unwrap_or(0.0),
            out["scrape_bytes"].as_u64().unwrap_or(0),
        );
    }
    Ok(())
}

fn route() -> Router {
    Router::new().route(
        "/v1/models/{id}",
        get(
            |axum::extract::Path(id): axum::extract::Path<String>| async move {
                axum::Json(json!({"id": id, "object": "model", "owned_by": "bulkhead"}))
            },
        ),
    )
}

async fn round(router: &Router, n: usize) -> anyhow::Result<f64> {
    let started = Instant::now();
    for _ in 0..n {
        let req = Request::get("/v1/models/smollm2").body(Body::empty())?;
        let resp = router.clone().oneshot(req).await?;
        anyhow::ensure!(resp.status().is_success(), "status {}", resp.status());
        let _ = axum::body::to_bytes(resp.into_body(), 1 << 16).await?;
    }
    Ok(started.elapsed().as_nanos() as f64 / n as f64)
}

async fn measure(requests: usize) -> anyhow::Result<serde_json::Value> {
    let bare = route();
    let instrumented = bulkhead_telemetry::instrument(route(), bulkhead_telemetry::Hop::Edge, &[]);
    // Warm both, then alternate rounds; the median round of each counts.
    round(&bare, 1_000).await?;
    round(&instrumented, 1_000).await?;
    let rounds = 10;
    let per = requests / rounds;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        a.push(round(&bare, per).await?);
        b.push(round(&instrumented, per).await?);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (bare_ns, inst_ns) = (median(&mut a), median(&mut b));
    let metrics = bulkhead_telemetry::metrics_router();
    let started = Instant::now();
    let resp = metrics
        .oneshot(Request::get("/metrics").body(Body::empty())?)
        .await?;
    let body = axum::body::to_bytes(resp.into_body(), 16 << 20).await?;
    let scrape_ms = started.elapsed().as_secs_f64() * 1e3;
    Ok(json!({
        "requests_per_variant": per * rounds,
        "bare_ns": bare_ns.round(),
        "instrumented_ns": inst_ns.round(),
        "added_us": ((inst_ns - bare_ns) / 1e3 * 100.0).round() / 100.0,
        "ratio": (inst_ns / bare_ns * 100.0).round() / 100.0,
        "scrape_ms": (scrape_ms * 100.0).round() / 100.0,
        "scrape_bytes": body.len(),
    }))
}
