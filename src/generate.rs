//! `bulkhead generate`: one request through the same engine and KV pool the
//! workers use, streamed to stdout.

use crate::config::ModelArgs;
use anyhow::{Context, bail};
use bulkhead_engine::{ChatMessage, Engine, GenerateRequest, SamplingParams, SeqEvent};
use bulkhead_kv::TenantId;
use clap::Args;
use std::io::Write;
use std::sync::Arc;

#[derive(Debug, Args)]
pub(crate) struct GenerateArgs {
    /// A user message, rendered with the model's chat template.
    #[arg(long, conflicts_with = "raw", required_unless_present = "raw")]
    prompt: Option<String>,
    /// Raw text, tokenized as is (special tokens such as <|im_start|> are recognised).
    #[arg(long)]
    raw: Option<String>,
    /// Maximum tokens to generate.
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus sampling mass.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Keep only the k most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Repetition penalty (1: none).
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    /// Sampler seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop strings (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Print one JSON object (text, token_ids, prompt_token_ids, finish_reason) instead of streaming.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    model: ModelArgs,
}

pub(crate) fn run(args: &GenerateArgs) -> anyhow::Result<()> {
    let gpu = match args.model.device {
        bulkhead_gpu::DeviceKind::Cpu => None,
        bulkhead_gpu::DeviceKind::Cuda(n) => {
            // One sentence, before anything loads, where there is no device.
            bulkhead_gpu::open(n)?;
            anyhow::ensure!(
                args.temperature == 0.0
                    && args.top_k == 0
                    && args.top_p >= 1.0
                    && args.repetition_penalty == 1.0
                    && args.stop.is_empty(),
                "the CUDA engine generates greedily only: leave --temperature, --top-p, --top-k, --repetition-penalty and --stop at their defaults"
            );
            Some(n)
        }
    };
    let model = Arc::new(match gpu {
        Some(_) => args.model.load_file()?.0,
        None => args.model.load()?.0,
    });
    let text = match (&args.prompt, &args.raw) {
        (Some(p), _) => {
            let template = model
                .chat_template()
                .context("the model has no chat template: use --raw")?;
            template.render(&[ChatMessage {
                role: "user".into(),
                content: p.clone(),
            }])?
        }
        (None, Some(r)) => r.clone(),
        (None, None) => bail!("give --prompt or --raw"),
    };
    let prompt = model.tokenizer().encode(&text)?;
    if let Some(device) = gpu {
        return on_gpu(args, &model, device, &prompt);
    }
    let engine = Engine::start(Arc::clone(&model), &args.model.engine_config())?;
    let request = GenerateRequest {
        prompt: prompt.clone(),
        sampling: SamplingParams {
            max_tokens: args.max_tokens,
            temperature: args.temperature,
            top_p: args.top_p,
            top_k: args.top_k,
            repetition_penalty: args.repetition_penalty,
            seed: args.seed,
            constraint: None,
            logprobs: None,
        },
        stop: args.stop.clone(),
        ignore_eos: false,
        cache: None,
        class: bulkhead_engine::WorkClass::Interactive,
    };
    let mut handle = engine.submit(TenantId::new(0), request)?;
    let mut out = std::io::stdout().lock();
    let (mut text, mut ids) = (String::new(), Vec::new());
    while let Some(ev) = handle.blocking_next() {
        match ev {
            SeqEvent::Token {
                id, text: piece, ..
            } => {
                ids.push(id);
                if !args.json {
                    out.write_all(piece.as_bytes())?;
                    out.flush()?;
                }
                text.push_str(&piece);
            }
            SeqEvent::Finished {
                reason, text: tail, ..
            } => {
                text.push_str(&tail);
                if args.json {
                    writeln!(out, "{}", answer(&text, &ids, &prompt, reason.as_str()))?;
                } else {
                    writeln!(out, "{tail}")?;
                }
                return Ok(());
            }
            SeqEvent::Failed(e) => bail!("generation failed: {e}"),
        }
    }
    bail!("the engine stopped before the request finished")
}

/// The request on CUDA device `device`: greedy, up to the first end of
/// sequence.
fn on_gpu(
    args: &GenerateArgs,
    model: &Arc<bulkhead_engine::ModelFile>,
    device: u32,
    prompt: &[u32],
) -> anyhow::Result<()> {
    let cache = crate::config::model_source(false).dir.join("ptx");
    let max = args.max_tokens.max(1);
    let mut engine =
        bulkhead_gpu::GpuEngine::start(Arc::clone(model), device, &cache, prompt.len() + max)?;
    let mut ids = engine.generate(&[prompt.to_vec()], max)?.tokens.remove(0);
    let eos = model.tokenizer().eos();
    let reason = match ids.iter().position(|t| *t == eos) {
        Some(at) => {
            ids.truncate(at);
            "stop"
        }
        None => "length",
    };
    let text = model.tokenizer().decode(&ids, true);
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", answer(&text, &ids, prompt, reason))?;
    } else {
        writeln!(out, "{text}")?;
    }
    Ok(())
}

/// `--json`'s one object, from either engine.
fn answer(text: &str, ids: &[u32], prompt: &[u32], reason: &str) -> serde_json::Value {
    serde_json::json!({
        "text": text,
        "token_ids": ids,
        "prompt_token_ids": prompt,
        "finish_reason": reason,
    })
}
