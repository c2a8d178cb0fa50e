//! The long-context part of `bulkhead bench engine`: prefill seconds at
//! about 1k, 2k, 4k and 8k tokens, and decode throughput at 1, 4 and 16
//! streams over 2k-token contexts, with llama.cpp's figures (same file,
//! same threads, flash attention off) measured beside them in the same run
//! where llama-cpp-python is importable.

use crate::bench::{Prompts, decode_rate, run_llama_cpp, timed_batch};
use bulkhead_engine::{Engine, EngineConfig, ModelFile};
use clap::Args;
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Args)]
pub(crate) struct LongArgs {
    /// Prompt lengths of the long-context prefill table, comma-separated
    /// (`--long-prefill 0` skips it).
    #[arg(long, value_delimiter = ',', default_value = "1000,2000,4000,8000")]
    long_prefill: Vec<usize>,
    /// Context of the long-context decode measurements (0 skips them).
    #[arg(long, default_value_t = 2000)]
    long_decode_context: usize,
    /// Tokens generated per stream in them (the prompts are prefilled
    /// beforehand, so every stream decodes from the start; the stretch
    /// until the first stream ends is counted).
    #[arg(long, default_value_t = 256)]
    long_decode_tokens: usize,
    /// Rounds of the prefill table: in each, every length is timed on
    /// Bulkhead and then at once on llama.cpp, and the best of each side
    /// is kept, so a shared machine's slow spells fall on both alike.
    #[arg(long, default_value_t = 1)]
    long_rounds: usize,
}

/// Streams of the long-context decode measurements.
const STREAMS: [usize; 3] = [1, 4, 16];

/// Measures the long-context table; `llama` says whether to run llama.cpp
/// beside it. Returns `{"prefill": [...], "decode": {...}}`.
pub(crate) fn run(
    args: &LongArgs,
    model: &Arc<ModelFile>,
    path: &Path,
    config: &EngineConfig,
    llama: bool,
) -> anyhow::Result<Value> {
    let lengths: Vec<usize> = args
        .long_prefill
        .iter()
        .copied()
        .filter(|n| *n > 1)
        .collect();
    let ctx = args.long_decode_context;
    let mut config = config.clone();
    // Room for the longest prompt or for every stream at once, and no
    // prompt refused for its length: this measures, it does not serve.
    let per_token =
        model.config().layers * 2 * model.config().kv_heads * model.config().head_dim * 2;
    let tokens = lengths
        .iter()
        .map(|n| n + config.first_slice_tokens)
        .chain([16 * (ctx + args.long_decode_tokens + config.first_slice_tokens)])
        .max()
        .unwrap_or(0);
    config.kv_budget_bytes = config.kv_budget_bytes.max(tokens * per_token * 5 / 4);
    config.prefill_deadline = Duration::from_secs(3_600);
    let engine = Engine::start(Arc::clone(model), &config)?;
    let speed = engine.info().speed;
    eprintln!(
        "long context: measured {:.3} ms per token, {:.1} ns per token pair; {:.1} s estimated for {} tokens",
        speed.secs_per_token() * 1e3,
        speed.secs_per_pair() * 1e9,
        speed.prompt_secs(8_000),
        8_000
    );

    let longest = lengths.iter().copied().max().unwrap_or(0);
    let prompt = Prompts::new(model, longest.max(1), 1)?.get(0, longest.max(1));
    // Each length on both sides in turn, the best of each kept.
    let mut prefill = Vec::new();
    for &n in &lengths {
        let (mut ours, mut theirs) = (f64::INFINITY, None::<f64>);
        for _ in 0..args.long_rounds.max(1) {
            let t = timed_batch(&engine, std::slice::from_ref(&prompt[..n].to_vec()), 1)?;
            ours = ours.min(t.first_token.as_secs_f64());
            if llama {
                let l = llama_cpp(path, config.threads, &prompt[..n], &[n], &[], 0)?["prefill_s"]
                    [n.to_string()]
                .as_f64();
                theirs = match (theirs, l) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
        }
        eprintln!(
            "long context: prefill of {n} tokens in {ours:.2} s (llama.cpp {})",
            theirs.map_or_else(|| "-".to_owned(), |l| format!("{l:.2} s"))
        );
        prefill.push((n, ours, theirs));
    }
    let mut decode = json!({});
    let streams = if ctx > 0 {
        Prompts::new(model, ctx, 16)?
    } else {
        Prompts(Vec::new())
    };
    if ctx > 0 {
        decode["context"] = json!(ctx);
        for b in STREAMS {
            let ps: Vec<Vec<u32>> = (0..b).map(|i| streams.get(i, ctx)).collect();
            let rate = decode_rate(&engine, &ps, args.long_decode_tokens)?;
            eprintln!("long context: decode {rate:.1} tok/s with {b} streams of {ctx} tokens");
            decode[format!("tok_s_{b}")] = json!(rate);
        }
        decode["16_over_1"] = json!(ratio(&decode["tok_s_16"], &decode["tok_s_1"]));
        // What 16 streams over one reach if both move their bytes at one
        // rate: a step of 16 reads the weights once and 16 contexts'
        // keys and values, a step of one the weights and one context.
        #[allow(clippy::cast_precision_loss)]
        let (weights, kv) = (
            std::fs::metadata(path)?.len() as f64,
            (ctx * per_token) as f64,
        );
        decode["weights_bytes"] = json!(weights);
        decode["kv_bytes_per_stream"] = json!(kv);
        decode["16_over_1_at_one_rate"] = json!(16.0 * (weights + kv) / (weights + 16.0 * kv));
    }
    drop(engine);

    let theirs = if llama && ctx > 0 {
        let t = llama_cpp(
            path,
            config.threads,
            &[],
            &[],
            &streams.get(0, ctx),
            args.long_decode_tokens,
        )?;
        eprintln!("long context: llama.cpp {t}");
        Some(t)
    } else {
        None
    };
    let rows: Vec<Value> = prefill
        .iter()
        .map(|&(n, secs, l)| {
            json!({
                "tokens": n,
                "bulkhead_s": secs,
                "llama_cpp_s": l,
                // Speed against llama.cpp's: its time over ours.
                "speed_ratio": l.map(|l| l / secs),
            })
        })
        .collect();
    if let Some(t) = &theirs {
        decode["llama_cpp_tok_s_1"] = t["decode_tok_s"].clone();
        decode["llama_cpp_ratio_1"] = json!(ratio(&decode["tok_s_1"], &t["decode_tok_s"]));
    }
    Ok(json!({
        "prefill": rows,
        "decode": decode,
        "secs_per_token": speed.secs_per_token(),
        "secs_per_pair": speed.secs_per_pair(),
    }))
}

fn ratio(a: &Value, b: &Value) -> Option<f64> {
    Some(a.as_f64()? / b.as_f64()?)
}

/// The long-context table's llama.cpp side (after
/// [`super::LLAMA_CPP_PRELUDE`]).
const LLAMA_CPP_SCRIPT: &str = r#"
prefill = {}
if cfg["lengths"]:
    # Warm, as Bulkhead's engine is: the weights paged in, the threads up.
    llm.eval(cfg["prompt"][:32]); llm.reset()
for n in cfg["lengths"]:
    llm.reset()
    t0 = time.perf_counter(); llm.eval(cfg["prompt"][:n]); prefill[str(n)] = time.perf_counter() - t0
decode = None
if cfg["decode_prompt"]:
    decode = decode_rate(cfg["decode_prompt"], cfg["decode_tokens"])
print(json.dumps({"prefill_s": prefill, "decode_tok_s": decode}))
"#;

/// llama.cpp's prefill seconds for each prefix of `prompt` in `lengths`
/// and its single-stream decode rate after `decode_prompt`.
fn llama_cpp(
    model: &Path,
    threads: usize,
    prompt: &[u32],
    lengths: &[usize],
    decode_prompt: &[u32],
    decode_tokens: usize,
) -> anyhow::Result<Value> {
    let n_ctx = lengths
        .iter()
        .copied()
        .chain([decode_prompt.len() + decode_tokens])
        .max()
        .unwrap_or(0)
        + 16;
    let cfg = json!({
        "model": model, "threads": threads, "n_ctx": n_ctx, "prompt": prompt, "lengths": lengths,
        "decode_prompt": decode_prompt, "decode_tokens": decode_tokens,
    });
    run_llama_cpp(LLAMA_CPP_SCRIPT, &cfg)
}

/// The long-context table under `bench engine`'s own.
pub(crate) fn print(w: &mut impl std::io::Write, v: &Value) -> std::io::Result<()> {
    let f = |x: &Value, digits: usize| {
        x.as_f64()
            .map_or_else(|| "-".to_owned(), |x| format!("{x:.digits$}"))
    };
    if let Some(rows) = v["prefill"].as_array().filter(|r| !r.is_empty()) {
        writeln!(w)?;
        writeln!(
            w,
            "{:<34} {:>12} {:>12} {:>8}  target",
            "long-context prefill (s)", "bulkhead", "llama.cpp", "speed"
        )?;
        for r in rows {
            writeln!(
                w,
                "{:<34} {:>12} {:>12} {:>8}  >= 1.5x",
                format!("{} tokens", r["tokens"]),
                f(&r["bulkhead_s"], 2),
                f(&r["llama_cpp_s"], 2),
                f(&r["speed_ratio"], 2)
            )?;
        }
    }
    let d = &v["decode"];
    if d["context"].is_number() {
        writeln!(w)?;
        writeln!(
            w,
            "{:<34} {:>12} {:>12} {:>8}",
            format!("decode tok/s, {}-token contexts", d["context"]),
            "bulkhead",
            "llama.cpp",
            "ratio"
        )?;
        writeln!(
            w,
            "{:<34} {:>12} {:>12} {:>8}",
            "1 stream",
            f(&d["tok_s_1"], 1),
            f(&d["llama_cpp_tok_s_1"], 1),
            f(&d["llama_cpp_ratio_1"], 2)
        )?;
        writeln!(w, "{:<34} {:>12}", "4 streams", f(&d["tok_s_4"], 1))?;
        writeln!(
            w,
            "{:<34} {:>12} {:>12} {:>8}  >= 3x",
            "16 streams",
            f(&d["tok_s_16"], 1),
            "",
            f(&d["16_over_1"], 2)
        )?;
        writeln!(
            w,
            "{:<34} {:>12} {:>12} {:>8}",
            "16 / 1 if both read at one rate",
            "",
            "",
            f(&d["16_over_1_at_one_rate"], 2)
        )?;
    }
    Ok(())
}
