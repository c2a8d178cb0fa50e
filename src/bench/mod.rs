//! `bulkhead bench`: one file per benchmark, and what they share here:
//! prompts of exact token lengths, timing a batch through the engine, and
//! running llama.cpp (through llama-cpp-python) beside Bulkhead.

pub(crate) mod batch;
pub(crate) mod chaos;
pub(crate) mod embeddings;
pub(crate) mod engine;
mod fleet;
pub(crate) mod gateway;
pub(crate) mod grammar;
mod long;
pub(crate) mod neighbours;
pub(crate) mod prefix;
pub(crate) mod serving;
pub(crate) mod telemetry;
pub(crate) mod transfer;

use anyhow::{Context, bail};
use bulkhead_engine::{CacheScope, Engine, GenerateRequest, ModelFile, Namespace, SeqEvent};
use bulkhead_kv::TenantId;
use serde_json::Value;
use std::process::Command;
use std::time::{Duration, Instant};

/// Timings of one batch of requests submitted together.
pub(crate) struct BatchTiming {
    /// Submission to the last sequence's first token.
    pub(crate) first_token: Duration,
    /// Tokens that arrived while every sequence was decoding: after the
    /// last first token, up to the first sequence's last token.
    together: usize,
    /// How long that lasted.
    together_time: Duration,
}

impl BatchTiming {
    /// Decode throughput with every sequence of the batch decoding (a
    /// sequence prefilled early decodes alone while the others prefill;
    /// those tokens are not counted).
    pub(crate) fn decode_tok_s(&self) -> f64 {
        if self.together == 0 || self.together_time < Duration::from_millis(1) {
            // Too few tokens to tell (`--decode-tokens` too small).
            return f64::NAN;
        }
        per_sec(self.together, self.together_time)
    }
}

pub(crate) fn timed_batch(
    engine: &Engine,
    prompts: &[Vec<u32>],
    max_tokens: usize,
) -> anyhow::Result<BatchTiming> {
    timed_batch_in(engine, prompts, max_tokens, None)
}

/// [`timed_batch`], its requests reading and leaving prefix-cache pages in
/// `cache` when given.
fn timed_batch_in(
    engine: &Engine,
    prompts: &[Vec<u32>],
    max_tokens: usize,
    cache: Option<CacheScope>,
) -> anyhow::Result<BatchTiming> {
    let start = Instant::now();
    let mut handles = prompts
        .iter()
        .map(|p| {
            let mut req = GenerateRequest::fixed_length(p.clone(), max_tokens);
            req.cache = cache;
            engine
                .submit(TenantId::new(1), req)
                .map_err(anyhow::Error::from)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    // Every token's arrival, per sequence, read by a thread of its own so
    // that each is stamped when the engine sends it: one thread polling
    // the sequences in turn stamps a sequence's buffered tokens when it
    // gets round to them, at the pace of the slowest (a sequence that had
    // finished early then looked as if it decoded beside the others).
    let arrivals = std::thread::scope(|s| {
        let readers: Vec<_> = handles
            .iter_mut()
            .map(|h| {
                s.spawn(move || {
                    let mut times = Vec::new();
                    while let Some(ev) = h.blocking_next() {
                        match ev {
                            SeqEvent::Token { .. } => times.push(Instant::now()),
                            SeqEvent::Finished { .. } => {}
                            SeqEvent::Failed(e) => bail!("benchmark request failed: {e}"),
                        }
                    }
                    Ok(times)
                })
            })
            .collect();
        readers
            .into_iter()
            .map(|r| {
                r.join()
                    .map_err(|_| anyhow::anyhow!("a benchmark reader panicked"))?
            })
            .collect::<anyhow::Result<Vec<Vec<Instant>>>>()
    })?;
    // Every sequence decodes from the last first token (`first_all`) to
    // the first last token (`first_done`).
    let (mut first_all, mut first_done) = (start, None::<Instant>);
    for a in &arrivals {
        if let (Some(&first), Some(&last)) = (a.first(), a.last()) {
            first_all = first_all.max(first);
            first_done = Some(first_done.map_or(last, |d| d.min(last)));
        }
    }
    let first_done = first_done.unwrap_or(first_all);
    let together = arrivals
        .iter()
        .map(|a| {
            a.iter()
                .filter(|t| **t > first_all && **t <= first_done)
                .count()
        })
        .sum();
    Ok(BatchTiming {
        first_token: first_all - start,
        together,
        together_time: first_done.saturating_duration_since(first_all),
    })
}

/// Decode throughput of `prompts` decoding together, `max_tokens` each.
///
/// Each prompt is prefilled once beforehand (one token each), so that the
/// measured batch finds its prompts in the prefix cache and every sequence
/// starts decoding at about the same moment: cold, the engine prefills
/// them one after another while the first ones decode, and with long
/// prompts the first could finish before the last had begun.
pub(crate) fn decode_rate(
    engine: &Engine,
    prompts: &[Vec<u32>],
    max_tokens: usize,
) -> anyhow::Result<f64> {
    let scope = CacheScope::new(Namespace::from_digest([0xbe; 16]), None);
    timed_batch_in(engine, prompts, 1, Some(scope))?;
    Ok(timed_batch_in(engine, prompts, max_tokens, Some(scope))?.decode_tok_s())
}

/// Deterministic benchmark prompts: distinct texts cut to exact token counts.
pub(crate) struct Prompts(pub(crate) Vec<Vec<u32>>);

impl Prompts {
    pub(crate) fn new(model: &ModelFile, tokens: usize, count: usize) -> anyhow::Result<Self> {
        let subjects = [
            "harbor",
            "orchard",
            "library",
            "glacier",
            "market",
            "observatory",
            "canyon",
            "workshop",
        ];
        let verbs = [
            "wakes",
            "changes",
            "shelters",
            "remembers",
            "echoes",
            "drifts",
            "gathers",
            "waits",
        ];
        let mut all = Vec::new();
        for p in 0..count {
            let mut text = format!("Story {p}. ");
            let mut ids = Vec::new();
            let mut i = p;
            while ids.len() < tokens {
                let s = subjects[i % subjects.len()];
                let v = verbs[(i / 3 + p) % verbs.len()];
                text.push_str(&format!(
                    "On day {i} the {s} {v} slowly, and people nearby describe what they notice in careful detail. "
                ));
                i += 1;
                ids = model.tokenizer().encode(&text)?;
            }
            ids.truncate(tokens);
            all.push(ids);
        }
        Ok(Prompts(all))
    }

    /// Tokens of the shortest prompt.
    pub(crate) fn len(&self) -> usize {
        self.0.iter().map(Vec::len).min().unwrap_or(0)
    }

    pub(crate) fn get(&self, i: usize, len: usize) -> Vec<u32> {
        self.0[i % self.0.len()][..len].to_vec()
    }
}

pub(crate) fn per_sec(tokens: usize, d: Duration) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let t = tokens as f64;
    t / d.as_secs_f64().max(1e-9)
}

/// Whether llama-cpp-python imports in the benchmark's Python.
pub(crate) fn llama_cpp_importable() -> bool {
    Command::new(crate::config::python())
        .args(["-c", "import llama_cpp"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// What every llama-cpp-python script starts with: `cfg` (the JSON
/// argument: `model`, `threads`, `n_ctx`), the model loaded with flash
/// attention off, greedy argmax over the last logits, and `decode_rate`:
/// tokens per second of a greedy decode after a prompt, from a fresh
/// context.
pub(crate) const LLAMA_CPP_PRELUDE: &str = r#"
import json, sys, time
import numpy as np
import llama_cpp
cfg = json.loads(sys.argv[1])
llm = llama_cpp.Llama(model_path=cfg["model"], n_threads=cfg["threads"], n_threads_batch=cfg["threads"],
                      n_ctx=cfg["n_ctx"], n_batch=512, n_ubatch=512, flash_attn=False, verbose=False)
n_vocab = llm.n_vocab()
def last_argmax():
    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return int(np.ctypeslib.as_array(ptr, shape=(n_vocab,)).argmax())
def decode_rate(prompt, tokens):
    llm.reset()
    llm.eval(prompt)
    tok = last_argmax()
    t0 = time.perf_counter()
    for _ in range(tokens - 1):
        llm.eval([tok]); tok = last_argmax()
    return (tokens - 1) / (time.perf_counter() - t0)
"#;

/// Runs a llama-cpp-python `script` (after [`LLAMA_CPP_PRELUDE`]) with
/// `cfg` as its argument; the JSON
/// object its last line prints.
pub(crate) fn run_llama_cpp(script: &str, cfg: &Value) -> anyhow::Result<Value> {
    let out = Command::new(crate::config::python())
        .args(["-c", &format!("{LLAMA_CPP_PRELUDE}{script}")])
        .arg(cfg.to_string())
        .output()
        .context("running llama-cpp-python")?;
    if !out.status.success() {
        bail!(
            "llama-cpp-python failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let line = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(line.lines().last().unwrap_or_default())
        .context("parsing llama-cpp-python output")
}
