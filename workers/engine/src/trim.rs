//! A model file cut to its first layers: every tensor of the blocks past
//! `layers` dropped and `llama.block_count` set to it, the rest (embedding,
//! output head, tokenizer, chat template) as it was. Such a file is a
//! smaller LLaMA model that both engines load; the GPU check carries one to
//! a machine that has no network and room for tens of megabytes only.

use crate::error::LoadError;
use candle_core::Device;
use candle_core::quantized::gguf_file::{self, Content, Value};
use std::io::{BufWriter, Cursor};
use std::path::Path;

/// Writes `src` cut to its first `layers` blocks to `dst`; returns the
/// blocks `src` had.
pub fn trim_layers(src: &Path, dst: &Path, layers: usize) -> Result<usize, LoadError> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| LoadError::Io { path, source }
    };
    let bytes = std::fs::read(src).map_err(io(src))?;
    let gguf = |e: candle_core::Error| LoadError::Gguf(e.to_string());
    let mut reader = Cursor::new(&bytes[..]);
    let content = Content::read(&mut reader).map_err(gguf)?;
    let key = "llama.block_count";
    let had = content
        .metadata
        .get(key)
        .and_then(|v| v.to_u32().ok())
        .ok_or_else(|| LoadError::Missing(key.to_owned()))? as usize;
    if layers == 0 || layers > had {
        return Err(LoadError::Missing(format!(
            "{layers} layers to keep (the file has {had})"
        )));
    }
    let kept = |name: &str| match name.strip_prefix("blk.").and_then(|r| r.split('.').next()) {
        Some(n) => n.parse::<usize>().is_ok_and(|n| n < layers),
        None => true,
    };
    let mut names: Vec<&String> = content.tensor_infos.keys().filter(|n| kept(n)).collect();
    names.sort();
    let mut tensors = Vec::with_capacity(names.len());
    for name in &names {
        tensors.push(
            content
                .tensor(&mut reader, name, &Device::Cpu)
                .map_err(gguf)?,
        );
    }
    let count = Value::U32(u32::try_from(layers).unwrap_or(u32::MAX));
    let mut keys: Vec<&String> = content.metadata.keys().collect();
    keys.sort();
    let metadata: Vec<(&str, &Value)> = keys
        .iter()
        .map(|k| {
            let v = if k.as_str() == key {
                &count
            } else {
                &content.metadata[*k]
            };
            (k.as_str(), v)
        })
        .collect();
    let named: Vec<(&str, &candle_core::quantized::QTensor)> = names
        .iter()
        .map(|n| n.as_str())
        .zip(tensors.iter())
        .collect();
    let file = std::fs::File::create(dst).map_err(io(dst))?;
    let mut w = BufWriter::new(file);
    gguf_file::write(&mut w, &metadata, &named).map_err(gguf)?;
    w.into_inner()
        .map_err(|e| io(dst)(e.into_error()))?
        .sync_all()
        .map_err(io(dst))?;
    Ok(had)
}
