//! The paged forward pass against candle's `quantized_llama`, both on the
//! default model with its weights dequantized to F32: the last-position
//! logits agree within 1e-4 for three prompts, one over 400 tokens.
//!
//! This checks the math of the paged engine (RoPE, paged attention across
//! page boundaries, norms, MLP, tied output head) independently of
//! quantization, where activation rounding makes exact comparison meaningless.

// Tests read their services from the environment (clippy.toml keeps
// library code from it).
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)]

mod common;

use anyhow::Result;
use bulkhead_engine::fetch::{self, Progress};
use bulkhead_engine::{EngineConfig, EngineCore, ModelFile, Numerics};
use bulkhead_kv::TenantId;
use candle_core::quantized::{GgmlDType, QTensor, gguf_file};
use candle_core::{Device, Tensor};
use candle_transformers::models::quantized_llama::ModelWeights;
use std::io::Cursor;
use std::sync::Arc;

/// The default model file rewritten with every tensor dequantized to F32.
fn dequantized_gguf() -> Result<Vec<u8>> {
    let path = fetch::ensure_default_model(&fetch::Source::from_vars(
        |k| std::env::var_os(k),
        Progress::Quiet,
    ))?;
    let mut file = std::fs::File::open(path)?;
    let content = gguf_file::Content::read(&mut file)?;
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let mut tensors = Vec::new();
    for name in names {
        let t = content
            .tensor(&mut file, name, &Device::Cpu)?
            .dequantize(&Device::Cpu)?;
        tensors.push((name.as_str(), QTensor::quantize(&t, GgmlDType::F32)?));
    }
    let metadata: Vec<(&str, &gguf_file::Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (*n, t)).collect();
    let mut out = Cursor::new(Vec::new());
    gguf_file::write(&mut out, &metadata, &refs)?;
    Ok(out.into_inner())
}

fn candle_logits(bytes: &[u8], tokens: &[u32]) -> Result<Vec<f32>> {
    let mut reader = Cursor::new(bytes);
    let content = gguf_file::Content::read(&mut reader)?;
    let mut model = ModelWeights::from_gguf(content, &mut reader, &Device::Cpu)?;
    let input = Tensor::new(tokens, &Device::Cpu)?.unsqueeze(0)?;
    Ok(model.forward(&input, 0)?.flatten_all()?.to_vec1::<f32>()?)
}

#[test]
fn paged_logits_match_candle_with_f32_weights() -> Result<()> {
    let bytes = dequantized_gguf()?;
    let model = Arc::new(ModelFile::from_bytes(&bytes)?);
    assert_eq!(model.config().quantization, "F32");
    let mut config = EngineConfig::with_budget(64 << 20);
    config.numerics = Numerics::F32Reference;
    config.step_tokens = 128; // long prompts span several steps and many pages
    let mut core = EngineCore::new(Arc::clone(&model), &config)?;

    let g = common::golden();
    let long_text = (0..40)
        .map(|i| format!("Paragraph {i}: the tide came in over the grey stones and the gulls argued about it. "))
        .collect::<String>();
    let long = model.tokenizer().encode(&long_text)?;
    assert!(long.len() > 400, "long prompt has {} tokens", long.len());
    let prompts = [
        common::ids(&g["cases"][0]["prompt_ids"]),
        common::ids(&g["cases"][2]["prompt_ids"]),
        long,
    ];

    for (i, tokens) in prompts.iter().enumerate() {
        let ours = core.last_logits(TenantId::new(1), tokens)?;
        let theirs = candle_logits(&bytes, tokens)?;
        assert_eq!(ours.len(), theirs.len());
        let max = ours
            .iter()
            .zip(&theirs)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        eprintln!(
            "prompt {i} ({} tokens): max |logit difference| = {max:e}",
            tokens.len()
        );
        assert!(
            max <= 1e-4,
            "prompt {i}: max |logit difference| {max} exceeds 1e-4"
        );
    }
    // Every page came back.
    let c = core.counters();
    assert_eq!(c.free_pages, c.total_pages);
    Ok(())
}
