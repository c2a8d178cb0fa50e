//! `bulkhead gpu-check`: the device check a GPU machine runs (a build with
//! `--features cuda`). First the kernels: compiled for the device,
//! paged attention and the Q4_1 matvec against CPU references, a wrongly
//! tagged page refused inside the kernel, host-device copy rates. Then the
//! model's forward pass: the golden prompts' greedy tokens on the GPU
//! against the CPU engine's on the same file (and against llama.cpp's
//! golden tokens when the file is the default model), and the GPU's
//! prefill and decode throughput.

use crate::config::model_source;
use anyhow::Context;
use bulkhead_engine::{Engine, EngineConfig, GenerateRequest, ModelFile, SeqEvent, fetch};
use bulkhead_gpu::GpuEngine;
use bulkhead_kv::TenantId;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;

/// llama.cpp's greedy tokens on the default model (the engine's golden
/// tests read the same file).
const GOLDEN: &str = include_str!("../testdata/smollm2-135m-q4_1.json");

/// Leading greedy tokens each golden prompt must give alike on both
/// engines (the GPU sums in other orders than the CPU, so a near tie
/// further on may go the other way; the agreement is printed in full).
const MUST_AGREE: usize = 8;

/// Streams of the decode measurement.
const STREAMS: usize = 16;

/// Tokens of the prefill measurement's prompt.
const LONG: usize = 512;

/// Tokens each stream decodes.
const DECODE: usize = 64;

/// Flags of `bulkhead gpu-check`.
#[derive(Debug, clap::Args)]
pub(crate) struct GpuCheckArgs {
    /// The device's ordinal.
    #[arg(long, default_value_t = 0)]
    device: u32,
    /// The model the forward pass is checked with (`bulkhead model trim`
    /// makes a small one to carry). Default: the default model where it
    /// is already in the model cache; nothing is fetched (a GPU machine
    /// may have no network).
    #[arg(long, env = "BULKHEAD_GPU_CHECK_MODEL")]
    model: Option<PathBuf>,
    /// Check the kernels only, without a model.
    #[arg(long, conflicts_with = "model")]
    kernels_only: bool,
}

/// Runs the device check and prints its figures; fails unless every
/// check holds.
pub(crate) fn run(args: &GpuCheckArgs) -> anyhow::Result<()> {
    // Beside the model cache: PTX per architecture and source digest.
    let source = model_source(false);
    let cache = source.dir.join("ptx");
    kernels(args.device, &cache)?;
    if args.kernels_only {
        println!("gpu-check: every kernel check holds (no model checked: --kernels-only)");
        return Ok(());
    }
    let path = match &args.model {
        Some(p) => p.clone(),
        None => {
            let p = source.dir.join(fetch::DEFAULT_MODEL.files[0].name);
            anyhow::ensure!(
                p.exists(),
                "no model to check the forward pass with: {} is not here; pass --model (`bulkhead model trim --layers 6 --out small.gguf` makes one small enough to carry) or --kernels-only",
                p.display()
            );
            p
        }
    };
    forward(args.device, &cache, &path)?;
    println!("gpu-check: every check holds");
    Ok(())
}

fn kernels(device: u32, cache: &std::path::Path) -> anyhow::Result<()> {
    let r = bulkhead_gpu::check::run(device, cache)?;
    let d = &r.device;
    println!(
        "device {}: {} (compute capability {}.{}, {:.1} GiB), kernels compiled for {}",
        d.ordinal,
        d.name,
        d.major,
        d.minor,
        d.memory_bytes as f64 / f64::from(1u32 << 30),
        r.arch
    );
    println!(
        "paged attention vs CPU: max error {:.2e}",
        r.attention_max_error
    );
    println!(
        "wrongly tagged page: error word {} (2 expected), output untouched: {}",
        r.refused_entry_word, r.refused_output_untouched
    );
    println!(
        "Q4_1 matvec vs CPU: max relative error {:.2e}",
        r.q4_1_max_rel_error
    );
    println!(
        "copies: host to device {:.1} GB/s, device to host {:.1} GB/s",
        r.htod_gb_s, r.dtoh_gb_s
    );
    anyhow::ensure!(
        r.attention_max_error < 1e-3,
        "paged attention differs from the CPU"
    );
    anyhow::ensure!(
        r.refused_entry_word == 2 && r.refused_output_untouched,
        "the kernel did not refuse the wrongly tagged page"
    );
    anyhow::ensure!(
        r.answered_word == 0,
        "the kernel refused a sequence whose pages were its own"
    );
    anyhow::ensure!(
        r.q4_1_max_rel_error < 1e-3,
        "the Q4_1 matvec differs from the CPU"
    );
    Ok(())
}

/// One golden case: its prompt and llama.cpp's greedy tokens.
struct Case {
    name: String,
    prompt: Vec<u32>,
    greedy: Vec<u32>,
}

fn cases() -> anyhow::Result<(String, Vec<Case>)> {
    let g: Value = serde_json::from_str(GOLDEN)?;
    let ids = |v: &Value| -> anyhow::Result<Vec<u32>> {
        v.as_array()
            .context("ids")?
            .iter()
            .map(|x| Ok(u32::try_from(x.as_u64().context("id")?)?))
            .collect()
    };
    let cases = g["cases"]
        .as_array()
        .context("golden cases")?
        .iter()
        .map(|c| {
            Ok(Case {
                name: c["name"].as_str().unwrap_or("?").to_owned(),
                prompt: ids(&c["prompt_ids"])?,
                greedy: ids(&c["greedy_ids"])?,
            })
        })
        .collect::<anyhow::Result<_>>()?;
    Ok((g["sha256"].as_str().unwrap_or("").to_owned(), cases))
}

/// The CPU engine's greedy tokens for `prompt`.
fn cpu_greedy(engine: &Engine, prompt: &[u32], n: usize) -> anyhow::Result<Vec<u32>> {
    let mut h = engine.submit(
        TenantId::new(1),
        GenerateRequest::fixed_length(prompt.to_vec(), n),
    )?;
    let mut ids = Vec::new();
    while let Some(ev) = h.blocking_next() {
        match ev {
            SeqEvent::Token { id, .. } => ids.push(id),
            SeqEvent::Finished { .. } => return Ok(ids),
            SeqEvent::Failed(e) => anyhow::bail!("the CPU engine failed: {e}"),
        }
    }
    anyhow::bail!("the CPU engine stopped early")
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The golden prompts on both engines, then the GPU's throughput.
fn forward(device: u32, cache: &std::path::Path, path: &std::path::Path) -> anyhow::Result<()> {
    let (golden_sha, cases) = cases()?;
    let is_default = fetch::sha256_file(path)? == golden_sha;
    let model =
        Arc::new(ModelFile::load(path).with_context(|| format!("loading {}", path.display()))?);
    let c = model.config();
    println!(
        "model {} ({} layers, {}){}",
        path.display(),
        c.layers,
        c.quantization,
        if is_default {
            ": the default model, llama.cpp's golden tokens apply"
        } else {
            ""
        }
    );
    let mut config = EngineConfig::with_budget(512 << 20);
    config.threads = std::thread::available_parallelism().map_or(2, |n| n.get().min(8));
    let cpu = Engine::start(Arc::clone(&model), &config)?;
    let mut gpu = GpuEngine::start(
        Arc::clone(&model),
        device,
        cache,
        STREAMS * (LONG + DECODE + 16),
    )?;
    let mut failed = Vec::new();
    for case in &cases {
        let n = case.greedy.len();
        let want = cpu_greedy(&cpu, &case.prompt, n)?;
        let got = gpu.generate(std::slice::from_ref(&case.prompt), n)?.tokens[0].clone();
        let agree = common_prefix(&want, &got);
        let golden = if is_default {
            format!(
                ", CPU vs llama.cpp {}/{n}",
                common_prefix(&want, &case.greedy)
            )
        } else {
            String::new()
        };
        println!(
            "golden {}: GPU vs CPU engine {agree}/{n} greedy tokens alike{golden}",
            case.name
        );
        if agree < MUST_AGREE.min(n) || (is_default && want != case.greedy) {
            failed.push(case.name.clone());
        }
    }

    // Throughput: a long prompt, then 1 and STREAMS streams decoding.
    let pool: Vec<u32> = cases.iter().flat_map(|c| c.prompt.clone()).collect();
    anyhow::ensure!(!pool.is_empty(), "no golden prompt");
    let prompt = |i: usize, len: usize| -> Vec<u32> {
        (0..len).map(|t| pool[(t + 7 * i) % pool.len()]).collect()
    };
    let long = LONG.min(c.context_window - DECODE - 1);
    gpu.generate(&[prompt(0, 32)], 2)?;
    let g = gpu.generate(&[prompt(0, long)], 1)?;
    println!(
        "GPU prefill: {long} tokens in {:.1} ms, {:.0} tok/s",
        g.prefill_secs * 1e3,
        g.prompt_tokens as f64 / g.prefill_secs
    );
    for streams in [1, STREAMS] {
        let prompts: Vec<Vec<u32>> = (0..streams).map(|i| prompt(i, 128)).collect();
        let g = gpu.generate(&prompts, DECODE + 1)?;
        println!(
            "GPU decode: {streams} streams after 128-token prompts, {:.0} tok/s",
            g.decoded_tokens as f64 / g.decode_secs
        );
    }
    anyhow::ensure!(
        failed.is_empty(),
        "the GPU's greedy tokens differ from the CPU engine's within the first {MUST_AGREE} (or the CPU's from llama.cpp's) for {}",
        failed.join(", ")
    );
    Ok(())
}
