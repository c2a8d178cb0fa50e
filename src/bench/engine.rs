//! `bulkhead bench engine`: prefill and decode throughput, batched decode,
//! the cost of owner-tag checks and of scrub-on-free, and llama.cpp on the
//! same file and thread count, measured side by side in one run.

use super::{Prompts, decode_rate, llama_cpp_importable, per_sec, run_llama_cpp, timed_batch};
use crate::config::ModelArgs;
use anyhow::{Context, bail};
use bulkhead_engine::{Engine, EngineCore, GenerateRequest, ModelFile, SeqEvent};
use bulkhead_kv::TenantId;
use clap::Args;
use serde_json::{Value, json};
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub(crate) struct EngineBenchArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Prompt length of the prefill measurement.
    #[arg(long, default_value_t = 484)]
    prefill_tokens: usize,
    /// Prompt length of the decode measurements.
    #[arg(long, default_value_t = 128)]
    decode_prompt_tokens: usize,
    /// Tokens generated per sequence in the decode measurements.
    #[arg(long, default_value_t = 128)]
    decode_tokens: usize,
    /// Repetitions; the best of each is reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Skip the llama.cpp comparison even if llama-cpp-python is importable.
    #[arg(long)]
    no_llama_cpp: bool,
    /// Skip measuring what owner checks and scrub-on-free cost (the
    /// longest part of a test-hooks build's run).
    #[arg(long)]
    no_guard_costs: bool,
    /// Run the kernels at most this wide (`avx2`, `scalar`), to measure the
    /// AVX2 path on an AVX-512 machine (test builds: `--features test-hooks`).
    #[arg(long, value_parser = ["avx512", "avx2", "scalar"])]
    simd: Option<String>,
    #[command(flatten)]
    long: crate::bench::long::LongArgs,
    #[command(flatten)]
    model: ModelArgs,
}

pub(crate) fn run_engine(args: &EngineBenchArgs) -> anyhow::Result<()> {
    if let Some(level) = &args.simd {
        crate::config::cap_simd(level)?;
    }
    let (model, path) = args.model.load()?;
    let model = Arc::new(model);
    let config = args.model.engine_config();
    let rounds = args.rounds.max(1);
    let prompts = Prompts::new(
        &model,
        args.prefill_tokens.max(args.decode_prompt_tokens),
        16,
    )?;
    let prefill_prompt = prompts.get(0, args.prefill_tokens);
    let decode_prompt = |i: usize| prompts.get(i, args.decode_prompt_tokens);

    let engine = Engine::start(Arc::clone(&model), &config)?;
    let mut prefill = Vec::new();
    let mut decode = [Vec::new(), Vec::new(), Vec::new()];
    for round in 0..rounds {
        let t = timed_batch(&engine, std::slice::from_ref(&prefill_prompt), 1)?;
        prefill.push(per_sec(args.prefill_tokens, t.first_token));
        for (slot, b) in [1usize, 4, 16].into_iter().enumerate() {
            let ps: Vec<Vec<u32>> = (0..b).map(decode_prompt).collect();
            decode[slot].push(decode_rate(&engine, &ps, args.decode_tokens)?);
        }
        eprintln!(
            "round {round}: prefill {:.1} tok/s, decode {:.1} / {:.1} / {:.1} tok/s at 1 / 4 / 16 sequences",
            prefill[round], decode[0][round], decode[1][round], decode[2][round]
        );
    }
    drop(engine);

    let llama = !args.no_llama_cpp && llama_cpp_importable();
    let long = crate::bench::long::run(&args.long, &model, &path, &config, llama)?;
    // (owner checks on, scrub on free); switching them at run time is a
    // test hook, absent from the serving build: there these are null.
    let (owner_check_overhead, scrub_overhead) = if args.no_guard_costs {
        (None, None)
    } else if bulkhead_engine::hooks::ENABLED {
        let (checks, scrub) = guard_overheads(&model, &config, rounds, &decode_prompt)?;
        (Some(checks), Some(scrub))
    } else {
        eprintln!(
            "note: owner-check and scrub costs need the test hooks: cargo run --release --features test-hooks -- bench engine"
        );
        (None, None)
    };

    let mut out = json!({
        "kernels": format!("{:?}", bulkhead_engine::simd_level()).to_lowercase(),
        "long_context": long,
        "model": model.config().name,
        "quantization": model.config().quantization,
        "threads": config.threads,
        "prefill_tokens": args.prefill_tokens,
        "decode_prompt_tokens": args.decode_prompt_tokens,
        "decode_tokens": args.decode_tokens,
        "prefill_tok_s": max(&prefill),
        "decode_tok_s_1": max(&decode[0]),
        "decode_tok_s_4": max(&decode[1]),
        "decode_tok_s_16": max(&decode[2]),
        "decode_16_over_1": max(&decode[2]) / max(&decode[0]),
        "owner_check_overhead": owner_check_overhead,
        "scrub_on_free_overhead": scrub_overhead,
    });
    if llama {
        let ll = llama_cpp(
            &path,
            config.threads,
            &prefill_prompt,
            &decode_prompt(0),
            args.decode_tokens,
            rounds,
        )?;
        let (lp, ld) = (num(&ll, "prefill_tok_s")?, num(&ll, "decode_tok_s")?);
        out["llama_cpp_prefill_tok_s"] = json!(lp);
        out["llama_cpp_decode_tok_s"] = json!(ld);
        out["llama_cpp_prefill_ratio"] = json!(max(&prefill) / lp);
        out["llama_cpp_decode_ratio"] = json!(max(&decode[0]) / ld);
    }
    let mut stdout = std::io::stdout().lock();
    if args.json {
        writeln!(stdout, "{out}")?;
    } else {
        print_table(&mut stdout, &out)?;
    }
    Ok(())
}

/// What owner checks and scrub-on-free cost: the same batched workload
/// with a setting on and off, on two engine cores driven on one compute
/// pool. The cores swap roles every round and the order alternates (ABBA),
/// so neither memory placement nor drift favours a setting. Returns
/// (owner-check overhead, scrub overhead).
fn guard_overheads(
    model: &Arc<ModelFile>,
    config: &bulkhead_engine::EngineConfig,
    rounds: usize,
    decode_prompt: &dyn Fn(usize) -> Vec<u32>,
) -> anyhow::Result<(f64, f64)> {
    let workload: Vec<Vec<u32>> = (0..8).map(decode_prompt).collect();
    let compute = rayon::ThreadPoolBuilder::new()
        .num_threads(config.threads)
        .build()?;
    let mut cores = [
        EngineCore::new(Arc::clone(model), config)?,
        EngineCore::new(Arc::clone(model), config)?,
    ];
    // Each round runs the two settings three times each, interleaved
    // (A B B A A B), and keeps the best of each; the figure is the median
    // over rounds of (best with) / (best without) - 1.
    let mut overhead = |with: (bool, bool), without: (bool, bool)| -> anyhow::Result<f64> {
        let mut ratios = Vec::new();
        for i in 0..2 * rounds + 5 {
            let (a, b) = if i % 2 == 0 { (0, 1) } else { (1, 0) };
            cores[a].set_pool_options(with.0, with.1)?;
            cores[b].set_pool_options(without.0, without.1)?;
            let mut best = [f64::MAX; 2]; // [with, without]
            for setting in [0, 1, 1, 0, 0, 1] {
                let core = if setting == 0 { a } else { b };
                let t = run_core(&mut cores[core], &compute, &workload, 48)?.as_secs_f64();
                best[setting] = best[setting].min(t);
            }
            ratios.push(best[0] / best[1]);
        }
        ratios.sort_by(f64::total_cmp);
        Ok(ratios[ratios.len() / 2] - 1.0)
    };
    // (owner checks on, scrub on free)
    Ok((
        overhead((true, false), (false, false))?,
        overhead((true, true), (true, false))?,
    ))
}

/// Runs `prompts` to completion on `core` (greedy, `max_tokens` each),
/// stepping it on `compute`; returns the wall time.
fn run_core(
    core: &mut EngineCore,
    compute: &rayon::ThreadPool,
    prompts: &[Vec<u32>],
    max_tokens: usize,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let mut sinks = Vec::new();
    for p in prompts {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let req = GenerateRequest::fixed_length(p.clone(), max_tokens);
        core.submit(EngineCore::admit(
            &core.limits(),
            TenantId::new(1),
            req,
            tx,
        )?);
        sinks.push(rx);
    }
    while compute.install(|| core.step()) {}
    let elapsed = start.elapsed();
    for mut rx in sinks {
        while let Ok(ev) = rx.try_recv() {
            if let SeqEvent::Failed(e) = ev {
                bail!("benchmark request failed: {e}");
            }
        }
    }
    Ok(elapsed)
}

fn max(xs: &[f64]) -> f64 {
    xs.iter().copied().fold(f64::MIN, f64::max)
}

fn num(v: &Value, key: &str) -> anyhow::Result<f64> {
    v[key]
        .as_f64()
        .with_context(|| format!("llama.cpp result lacks {key}"))
}

/// The short table's llama.cpp side (after [`super::LLAMA_CPP_PRELUDE`]).
const LLAMA_CPP_SCRIPT: &str = r#"
prefill, decode = [], []
for _ in range(cfg["rounds"]):
    llm.reset()
    t0 = time.perf_counter(); llm.eval(cfg["prefill"]); t1 = time.perf_counter()
    prefill.append(len(cfg["prefill"]) / (t1 - t0))
    decode.append(decode_rate(cfg["decode_prompt"], cfg["decode_tokens"]))
print(json.dumps({"prefill_tok_s": max(prefill), "decode_tok_s": max(decode)}))
"#;

fn llama_cpp(
    model: &std::path::Path,
    threads: usize,
    prefill: &[u32],
    decode_prompt: &[u32],
    decode_tokens: usize,
    rounds: usize,
) -> anyhow::Result<Value> {
    let cfg = json!({
        "model": model, "threads": threads, "n_ctx": 2048, "prefill": prefill, "decode_prompt": decode_prompt,
        "decode_tokens": decode_tokens, "rounds": rounds,
    });
    run_llama_cpp(LLAMA_CPP_SCRIPT, &cfg)
}

fn print_table(w: &mut impl Write, v: &Value) -> std::io::Result<()> {
    let f = |k: &str| {
        v[k].as_f64()
            .map_or_else(|| "-".to_owned(), |x| format!("{x:.2}"))
    };
    let pct = |k: &str| {
        v[k].as_f64()
            .map_or_else(|| "-".to_owned(), |x| format!("{:+.2}%", x * 100.0))
    };
    writeln!(
        w,
        "bulkhead bench engine: {} ({}), {} threads, {} kernels",
        v["model"].as_str().unwrap_or(""),
        v["quantization"].as_str().unwrap_or(""),
        v["threads"],
        v["kernels"].as_str().unwrap_or("")
    )?;
    writeln!(
        w,
        "{:<34} {:>12} {:>12} {:>8}  target",
        "metric", "bulkhead", "llama.cpp", "ratio"
    )?;
    writeln!(
        w,
        "{:<34} {:>12} {:>12} {:>8}  >= 0.8x",
        format!("prefill tok/s ({} tok prompt)", v["prefill_tokens"]),
        f("prefill_tok_s"),
        f("llama_cpp_prefill_tok_s"),
        f("llama_cpp_prefill_ratio")
    )?;
    writeln!(
        w,
        "{:<34} {:>12} {:>12} {:>8}  >= 0.8x",
        "decode tok/s, 1 sequence",
        f("decode_tok_s_1"),
        f("llama_cpp_decode_tok_s"),
        f("llama_cpp_decode_ratio")
    )?;
    writeln!(
        w,
        "{:<34} {:>12}",
        "decode tok/s, 4 sequences",
        f("decode_tok_s_4")
    )?;
    writeln!(
        w,
        "{:<34} {:>12} {:>12} {:>8}  >= 3x",
        "decode tok/s, 16 sequences",
        f("decode_tok_s_16"),
        "",
        f("decode_16_over_1")
    )?;
    writeln!(
        w,
        "{:<34} {:>12} {:>12} {:>8}  < 1%",
        "owner-check overhead",
        pct("owner_check_overhead"),
        "",
        ""
    )?;
    writeln!(
        w,
        "{:<34} {:>12}",
        "scrub-on-free overhead",
        pct("scrub_on_free_overhead")
    )?;
    crate::bench::long::print(w, &v["long_context"])
}
