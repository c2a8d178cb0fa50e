//! `bulkhead bench neighbours`: does one tenant's load stall another? A
//! disaggregated pair (prefill and decode engines in this process, KV over
//! loopback TCP) serves tenant A's short requests alone, then while tenant
//! B floods it with (a) long in-window prompts and (b) streams that may
//! each generate up to the context window (maximal reservations), in one
//! run. Reports A's time to first token (p50, p99) in each phase, the
//! ratio of A's p99 under each flood to its p99 alone, and how each of B's
//! requests ended: answered, refused at admission, or failed after waiting.
//! With `--costly` it compares, instead, A's time to first token beside B's
//! plain generations and beside the same generations in the costliest
//! shape the API admits ([`costly`]); with `--up`, the floods go through a
//! platform `bulkhead up` starts, its gateway and its workers ([`up`]).

mod costly;
pub(crate) mod up;

use crate::bench::Prompts;
use crate::bench::transfer::{Pair, in_process_pair};
use crate::config::ModelArgs;
use anyhow::bail;
use bulkhead_engine::{Engine, EngineError, GenerateRequest, SeqEvent};
use bulkhead_kv::TenantId;
use clap::Args;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

#[derive(Debug, Args)]
pub(crate) struct NeighboursBenchArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Tenant A's requests per phase.
    #[arg(long, default_value_t = 30)]
    samples: usize,
    /// Tenant A's prompt tokens.
    #[arg(long, default_value_t = 24)]
    short_tokens: usize,
    /// Tenant B's prompt tokens in the long-prompt flood.
    #[arg(long, default_value_t = 1_500)]
    long_tokens: usize,
    /// Tenant B's concurrent requests in the long-prompt flood.
    #[arg(long, default_value_t = 4)]
    long_streams: usize,
    /// Tenant B's concurrent streams in the reservation flood.
    #[arg(long, default_value_t = 13)]
    reserve_streams: usize,
    /// Instead of the floods: A beside B's plain generations, then beside
    /// the same in the costliest shape the API admits (the longest property
    /// name under a schema, the most and longest stop strings).
    #[arg(long)]
    costly: bool,
    /// Through a platform this command starts with `bulkhead up` (its
    /// gateway, a prefill/decode pair), as tenants see it: B's long prompts
    /// at 80% of the served window beside its streams to the window.
    #[arg(long, conflicts_with = "costly")]
    up: bool,
    /// With --costly: B's concurrent generations.
    #[arg(long, default_value_t = 2)]
    costly_streams: usize,
    /// With --costly: tokens each of B's generations asks for.
    #[arg(long, default_value_t = 256)]
    costly_tokens: usize,
    #[command(flatten)]
    model: ModelArgs,
}

/// How one of B's requests ended.
#[derive(Debug, Default, Clone, Copy)]
struct Outcomes {
    answered: usize,
    refused: usize,
    failed: usize,
}

pub(crate) fn run(args: &NeighboursBenchArgs) -> anyhow::Result<()> {
    if args.up {
        return up::run(args);
    }
    let model = Arc::new(args.model.load()?.0);
    let config = args.model.engine_config();
    let prefill_engine = Arc::new(Engine::start(Arc::clone(&model), &config)?);
    let decode_engine = Arc::new(Engine::start(Arc::clone(&model), &config)?);
    let limits = decode_engine.info().limits;
    let window = limits
        .context_window()
        .min(limits.pool_tokens())
        .min(prefill_engine.info().limits.prefill_tokens());
    if args.long_tokens + 1 > window {
        bail!(
            "--long-tokens {} does not fit the {window}-token window here",
            args.long_tokens
        );
    }
    let short = Prompts::new(&model, args.short_tokens, args.samples.max(1))?;
    let long = Prompts::new(&model, args.long_tokens, 8)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let decode =
            in_process_pair(Arc::clone(&prefill_engine), Arc::clone(&decode_engine)).await?;
        // Warm-up, then A alone.
        ttft_of_a(&decode, &short, 1).await?;
        let alone = ttft_of_a(&decode, &short, args.samples).await?;
        if args.costly {
            let shape = (args.costly_streams.max(1), args.costly_tokens.max(1));
            let alone_p99 = percentile(&alone, 99);
            let mut report =
                costly::phases(&decode, &short, args.samples, shape, alone_p99).await?;
            report["alone"] = json!({"a_ttft_p50_ms": percentile(&alone, 50) * 1e3,
                                     "a_ttft_p99_ms": alone_p99 * 1e3});
            if args.json {
                println!("{report}");
            } else {
                costly_table(&report);
            }
            return Ok(());
        }

        // (a) B sends long in-window prompts, `long_streams` at a time.
        // The flood fills the prefill worker first.
        let flood = long_prompt_flood(&decode, &long, args);
        let a = (&decode, &short, args.samples);
        let (long_ttft, long_b) = while_flooded(a, flood, Duration::from_secs(2)).await?;
        // (b) B opens streams that may each generate up to the window.
        let flood = reservation_flood(&decode, &short, window, args);
        let (reserve_ttft, reserve_b) = while_flooded(a, flood, Duration::from_secs(5)).await?;
        let engine = Arc::clone(&decode_engine);
        let preemptions = tokio::task::spawn_blocking(move || engine.stats())
            .await?
            .map_or(0, |s| s.preemptions);

        let (a50, a99) = (percentile(&alone, 50), percentile(&alone, 99));
        let phase = |t: &[f64], b: Outcomes| {
            json!({
                "a_ttft_p50_ms": percentile(t, 50) * 1e3,
                "a_ttft_p99_ms": percentile(t, 99) * 1e3,
                "a_p99_vs_alone": percentile(t, 99) / a99,
                "b_answered": b.answered,
                "b_refused_at_admission": b.refused,
                "b_failed_after_waiting": b.failed,
            })
        };
        let report = json!({
            "window_tokens": window,
            "samples": args.samples,
            "alone": {"a_ttft_p50_ms": a50 * 1e3, "a_ttft_p99_ms": a99 * 1e3},
            "long_prompts": phase(&long_ttft, long_b),
            "reservations": phase(&reserve_ttft, reserve_b),
            "decode_preemptions": preemptions,
            "target": "a_p99_vs_alone <= 3 and b_failed_after_waiting == 0 in each flood",
        });
        if args.json {
            println!("{report}");
        } else {
            let floods = [(&long_ttft, long_b), (&reserve_ttft, reserve_b)];
            print_table(args, window, (a50, a99), floods, preemptions);
        }
        Ok(())
    })
}

/// B's requests until told to stop, and how each ended.
type Flood = (JoinSet<Outcomes>, Arc<AtomicBool>);

/// B sending long in-window prompts, `long_streams` at a time.
fn long_prompt_flood(decode: &Pair, long: &Prompts, args: &NeighboursBenchArgs) -> Flood {
    let stop = Arc::new(AtomicBool::new(false));
    let mut flood = JoinSet::new();
    for s in 0..args.long_streams {
        let (decode, stop) = (decode.clone(), Arc::clone(&stop));
        let prompts: Vec<Vec<u32>> = (0..8).map(|i| long.get(i, args.long_tokens)).collect();
        flood.spawn(async move {
            let mut o = Outcomes::default();
            let mut i = s;
            while !stop.load(Ordering::Relaxed) {
                let req = request(prompts[i % prompts.len()].clone(), 1);
                o = add(o, run_b(&decode, req, None).await);
                i += 1;
            }
            o
        });
    }
    (flood, stop)
}

/// B holding streams that may each generate up to the window.
fn reservation_flood(
    decode: &Pair,
    short: &Prompts,
    window: usize,
    args: &NeighboursBenchArgs,
) -> Flood {
    let stop = Arc::new(AtomicBool::new(false));
    let mut flood = JoinSet::new();
    for s in 0..args.reserve_streams {
        let (decode, stop) = (decode.clone(), Arc::clone(&stop));
        let prompt = short.get(s % args.samples.max(1), args.short_tokens);
        let max = window - prompt.len();
        flood.spawn(async move { run_b(&decode, request(prompt, max), Some(stop)).await });
    }
    (flood, stop)
}

/// Tenant A's times to first token (`samples` of them, of `short` prompts),
/// measured `settle` after B's `flood` began; then the flood is stopped and
/// how its requests ended is summed.
async fn while_flooded(
    (decode, short, samples): (&Pair, &Prompts, usize),
    (mut flood, stop): Flood,
    settle: Duration,
) -> anyhow::Result<(Vec<f64>, Outcomes)> {
    tokio::time::sleep(settle).await;
    let ttft = ttft_of_a(decode, short, samples).await?;
    stop.store(true, Ordering::Relaxed);
    let mut b = Outcomes::default();
    while let Some(o) = flood.join_next().await {
        b = add(b, o?);
    }
    Ok((ttft, b))
}

/// The figures as a table.
fn print_table(
    args: &NeighboursBenchArgs,
    window: usize,
    (a50, a99): (f64, f64),
    [(long_ttft, long_b), (reserve_ttft, reserve_b)]: [(&Vec<f64>, Outcomes); 2],
    preemptions: u64,
) {
    println!(
        "tenant A's time to first token ({} requests per phase, window {window} tokens)",
        args.samples
    );
    println!(
        "{:<34} {:>9} {:>9} {:>8} {:>18}",
        "phase", "p50 ms", "p99 ms", "p99/alone", "B ok/refused/failed"
    );
    println!(
        "{:<34} {:>9.1} {:>9.1} {:>8} {:>18}",
        "alone",
        a50 * 1e3,
        a99 * 1e3,
        "1.00",
        "-"
    );
    for (name, t, b) in [
        (
            format!(
                "B: {} x {}-token prompts",
                args.long_streams, args.long_tokens
            ),
            &long_ttft,
            long_b,
        ),
        (
            format!("B: {} streams to the window", args.reserve_streams),
            &reserve_ttft,
            reserve_b,
        ),
    ] {
        println!(
            "{:<34} {:>9.1} {:>9.1} {:>8.2} {:>18}",
            name,
            percentile(t, 50) * 1e3,
            percentile(t, 99) * 1e3,
            percentile(t, 99) / a99,
            format!("{}/{}/{}", b.answered, b.refused, b.failed)
        );
    }
    println!("decode preemptions: {preemptions}");
}

/// The `--costly` figures as a table.
fn costly_table(r: &serde_json::Value) {
    let ms = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
    println!(
        "tenant A's time to first token beside B's {} generations of {} tokens",
        r["b_streams"], r["b_tokens"]
    );
    println!("{:<44} {:>9} {:>9}", "phase", "p50 ms", "p99 ms");
    for (name, key) in [
        ("alone", "alone"),
        ("B plain", "plain"),
        ("B: 256-byte property name, 4 x 1,024-byte stops", "costly"),
    ] {
        println!(
            "{name:<44} {:>9.1} {:>9.1}",
            ms(&r[key]["a_ttft_p50_ms"]),
            ms(&r[key]["a_ttft_p99_ms"])
        );
    }
    println!(
        "A's p99 beside the costly load / beside the plain one: {:.2}x (target <= 1.2)",
        ms(&r["a_p99_costly_vs_plain"])
    );
}

fn request(prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest::fixed_length(prompt, max_tokens)
}

fn add(a: Outcomes, b: Outcomes) -> Outcomes {
    Outcomes {
        answered: a.answered + b.answered,
        refused: a.refused + b.refused,
        failed: a.failed + b.failed,
    }
}

/// Tenant A's requests one after another: seconds to each first token.
async fn ttft_of_a(decode: &Pair, prompts: &Prompts, n: usize) -> anyhow::Result<Vec<f64>> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let start = Instant::now();
        let req = request(prompts.get(i, short_len(prompts)), 1);
        let mut h = decode
            .submit(TenantId::new(1), req)
            .map_err(|e| anyhow::anyhow!("A refused: {e}"))?;
        match h.next().await {
            Some(SeqEvent::Token { .. } | SeqEvent::Finished { .. }) => {}
            Some(SeqEvent::Failed(e)) => bail!("A's request failed: {e}"),
            None => bail!("the engine stopped"),
        }
        out.push(start.elapsed().as_secs_f64());
        while h.next().await.is_some() {}
    }
    Ok(out)
}

/// One of B's requests to its end (or until `stop`, for a stream: then it
/// is dropped, which cancels it, as a client that hangs up).
async fn run_b(decode: &Pair, req: GenerateRequest, stop: Option<Arc<AtomicBool>>) -> Outcomes {
    let Ok(mut h) = decode.submit(TenantId::new(2), req) else {
        return Outcomes {
            refused: 1,
            ..Outcomes::default()
        };
    };
    let mut answered = false;
    loop {
        let next = tokio::time::timeout(Duration::from_millis(200), h.next()).await;
        match next {
            Ok(Some(SeqEvent::Token { .. })) => answered = true,
            Ok(Some(SeqEvent::Finished { .. })) => {
                return Outcomes {
                    answered: 1,
                    ..Outcomes::default()
                };
            }
            Ok(Some(SeqEvent::Failed(EngineError::Rejected(_)))) if !answered => {
                return Outcomes {
                    refused: 1,
                    ..Outcomes::default()
                };
            }
            Ok(Some(SeqEvent::Failed(_)) | None) => {
                return Outcomes {
                    failed: 1,
                    ..Outcomes::default()
                };
            }
            Err(_) => {}
        }
        if stop.as_ref().is_some_and(|s| s.load(Ordering::Relaxed)) {
            return Outcomes {
                answered: usize::from(answered),
                failed: usize::from(!answered),
                ..Outcomes::default()
            };
        }
    }
}

fn short_len(p: &Prompts) -> usize {
    p.len()
}

pub(crate) fn percentile(xs: &[f64], p: usize) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    let i = (p * v.len())
        .div_ceil(100)
        .saturating_sub(1)
        .min(v.len() - 1);
    v[i]
}
