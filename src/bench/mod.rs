//! `bulkhead bench`: one file per benchmark, and what they share here:
//! prompts of exact token lengths, timing a batch through the engine, and
//! running llama.cpp (through llama-cpp-python) beside Bulkhead.

pub(crate) mod chaos;
pub(crate) mod engine;
pub(crate) mod gateway;
mod long;
pub(crate) mod neighbours;
pub(crate) mod prefix;
pub(crate) mod serving;
pub(crate) mod telemetry;
pub(crate) mod transfer;

use anyhow::{Context, bail};
use bulkhead_engine::{Engine, GenerateRequest, ModelFile, SeqEvent};
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
    let start = Instant::now();
    let mut handles = prompts
        .iter()
        .map(|p| {
            let req = GenerateRequest::fixed_length(p.clone(), max_tokens);
            engine
                .submit(TenantId::new(1), req)
                .map_err(anyhow::Error::from)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    // Every token's arrival, per sequence.
    let mut arrivals: Vec<Vec<Instant>> = vec![Vec::new(); handles.len()];
    let mut live = handles.len();
    // Sequences progress together; poll each in turn until all finish.
    while live > 0 {
        live = 0;
        for (i, h) in handles.iter_mut().enumerate() {
            let Some(ev) = h.blocking_next() else {
                continue;
            };
            live += 1;
            match ev {
                SeqEvent::Token { .. } => arrivals[i].push(Instant::now()),
                SeqEvent::Finished { .. } => {}
                SeqEvent::Failed(e) => bail!("benchmark request failed: {e}"),
            }
        }
    }
    let first_all = arrivals
        .iter()
        .filter_map(|a| a.first())
        .max()
        .copied()
        .unwrap_or(start);
    let first_done = arrivals
        .iter()
        .filter_map(|a| a.last())
        .min()
        .copied()
        .unwrap_or(first_all);
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

fn python() -> std::ffi::OsString {
    std::env::var_os("BULKHEAD_PYTHON").unwrap_or_else(|| "python3".into())
}

/// Whether llama-cpp-python imports in the benchmark's Python.
pub(crate) fn llama_cpp_importable() -> bool {
    Command::new(python())
        .args(["-c", "import llama_cpp"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs a llama-cpp-python `script` with `cfg` as its argument; the JSON
/// object its last line prints.
pub(crate) fn run_llama_cpp(script: &str, cfg: &Value) -> anyhow::Result<Value> {
    let out = Command::new(python())
        .args(["-c", script])
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
