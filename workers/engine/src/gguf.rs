//! Loading a LLaMA-architecture GGUF file: hyperparameters, weights,
//! tokenizer and chat template.
//!
//! `Q4_0`, `Q4_1` and `Q8_0` tensors stay at their own quantization and run on
//! `bulkhead-kernels`; `F32` and `F16` become f32 matrices; any other type
//! candle can read is dequantized to f32 at load time.

use crate::chat::ChatTemplate;
use crate::error::LoadError;
use crate::tokenizer::Tokenizer;
use bulkhead_kernels::{Matrix, WeightFormat, WeightsQ};
use candle_core::quantized::GgmlDType;
use candle_core::quantized::gguf_file::{Content, Value};
use std::io::Cursor;
use std::path::Path;

/// Hyperparameters of a loaded model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// `general.name`, if present.
    pub name: String,
    /// Transformer blocks.
    pub layers: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Feed-forward size.
    pub ffn: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Dimension of one head.
    pub head_dim: usize,
    /// RMS norm epsilon.
    pub rms_eps: f32,
    /// RoPE frequency base.
    pub rope_base: f32,
    /// Context window in tokens.
    pub context_window: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// The weight type of most matrices, for display.
    pub quantization: String,
}

/// One transformer block's weights.
#[derive(Debug)]
pub(crate) struct LayerWeights {
    pub(crate) attn_norm: Vec<f32>,
    pub(crate) wq: Matrix,
    pub(crate) wk: Matrix,
    pub(crate) wv: Matrix,
    pub(crate) wo: Matrix,
    pub(crate) ffn_norm: Vec<f32>,
    pub(crate) gate: Matrix,
    pub(crate) up: Matrix,
    pub(crate) down: Matrix,
}

/// All weights of a model.
#[derive(Debug)]
pub(crate) struct Weights {
    pub(crate) embed: Matrix,
    pub(crate) layers: Vec<LayerWeights>,
    pub(crate) norm: Vec<f32>,
    /// `None` when the output head is tied to the embedding.
    pub(crate) output: Option<Matrix>,
}

/// A loaded model file.
pub struct ModelFile {
    pub(crate) config: ModelConfig,
    pub(crate) weights: Weights,
    tokenizer: Tokenizer,
    chat_template: Option<ChatTemplate>,
    fingerprint: u64,
}

impl std::fmt::Debug for ModelFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Weights are hundreds of megabytes: show what identifies the model.
        f.debug_struct("ModelFile")
            .field("config", &self.config)
            .field("fingerprint", &format_args!("{:016x}", self.fingerprint))
            .finish_non_exhaustive()
    }
}

impl ModelFile {
    /// Loads a GGUF file.
    pub fn load(path: &Path) -> Result<Self, LoadError> {
        let bytes = std::fs::read(path).map_err(|source| LoadError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_bytes(&bytes)
    }

    /// Loads a GGUF file already in memory.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, LoadError> {
        let content =
            Content::read(&mut Cursor::new(bytes)).map_err(|e| LoadError::Gguf(e.to_string()))?;
        let file = GgufFile {
            content: &content,
            bytes,
        };
        let arch = file.string("general.architecture")?;
        if arch != "llama" {
            return Err(LoadError::Architecture(arch.to_owned()));
        }
        let config = file.config()?;
        let weights = file.weights(&config)?;
        let tokenizer = Tokenizer::from_gguf(&content.metadata)?;
        let chat_template = match content.metadata.get("tokenizer.chat_template") {
            Some(v) => Some(ChatTemplate::new(
                v.to_string()
                    .map_err(|_| LoadError::Missing("a string chat template".into()))?,
                tokenizer.bos_text(),
                tokenizer.eos_text(),
            )?),
            None => None,
        };
        Ok(ModelFile {
            config,
            weights,
            tokenizer,
            chat_template,
            fingerprint: xxhash_rust::xxh3::xxh3_64(bytes),
        })
    }

    /// xxh3-64 of the file's bytes: workers that hand KV pages to each other
    /// must serve the same file.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// The same weights converted to `Q8_0` at load (as Workers AI serves
    /// `-fp8` or `-awq` variants of one model): every quantized matrix is
    /// dequantized and quantized again per 32-element block; f32 matrices
    /// and norms stay. A different model for KV purposes, so its
    /// fingerprint differs from the file's.
    #[must_use]
    pub fn requantized_q8_0(mut self) -> Self {
        fn convert(m: &mut Matrix) {
            if let Matrix::Quant(q) = m
                && q.format() != WeightFormat::Q8_0
            {
                *m = Matrix::Quant(q.to_q8_0());
            }
        }
        let w = &mut self.weights;
        convert(&mut w.embed);
        if let Some(o) = &mut w.output {
            convert(o);
        }
        for l in &mut w.layers {
            for m in [
                &mut l.wq,
                &mut l.wk,
                &mut l.wv,
                &mut l.wo,
                &mut l.gate,
                &mut l.up,
                &mut l.down,
            ] {
                convert(m);
            }
        }
        self.config.quantization = "Q8_0".to_owned();
        self.fingerprint = xxhash_rust::xxh3::xxh3_64_with_seed(
            &self.fingerprint.to_le_bytes(),
            u64::from_le_bytes(*b"to-q8_0\0"),
        );
        self
    }

    /// Hyperparameters.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The tokenizer built from the file's metadata.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The file's chat template, if it has one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// The weights, read-only, as a device engine uploads them.
    pub fn tensors(&self) -> Tensors<'_> {
        let w = &self.weights;
        Tensors {
            embed: &w.embed,
            layers: w
                .layers
                .iter()
                .map(|l| LayerTensors {
                    attn_norm: &l.attn_norm,
                    wq: &l.wq,
                    wk: &l.wk,
                    wv: &l.wv,
                    wo: &l.wo,
                    ffn_norm: &l.ffn_norm,
                    gate: &l.gate,
                    up: &l.up,
                    down: &l.down,
                })
                .collect(),
            norm: &w.norm,
            output: w.output.as_ref().unwrap_or(&w.embed),
        }
    }
}

/// A model's weights, borrowed ([`ModelFile::tensors`]).
#[derive(Debug)]
pub struct Tensors<'a> {
    /// The token embedding (`vocab × hidden`).
    pub embed: &'a Matrix,
    /// The transformer blocks.
    pub layers: Vec<LayerTensors<'a>>,
    /// The final RMSNorm's weights.
    pub norm: &'a [f32],
    /// The output head (the embedding where the file ties them).
    pub output: &'a Matrix,
}

/// One transformer block's weights, borrowed.
#[derive(Debug)]
pub struct LayerTensors<'a> {
    /// The attention RMSNorm's weights.
    pub attn_norm: &'a [f32],
    /// Query projection.
    pub wq: &'a Matrix,
    /// Key projection.
    pub wk: &'a Matrix,
    /// Value projection.
    pub wv: &'a Matrix,
    /// Attention output projection.
    pub wo: &'a Matrix,
    /// The feed-forward RMSNorm's weights.
    pub ffn_norm: &'a [f32],
    /// SwiGLU gate.
    pub gate: &'a Matrix,
    /// SwiGLU up.
    pub up: &'a Matrix,
    /// SwiGLU down.
    pub down: &'a Matrix,
}

struct GgufFile<'a> {
    content: &'a Content,
    bytes: &'a [u8],
}

impl GgufFile<'_> {
    fn value(&self, key: &str) -> Result<&Value, LoadError> {
        self.content
            .metadata
            .get(key)
            .ok_or_else(|| LoadError::Missing(format!("metadata key {key}")))
    }

    fn string(&self, key: &str) -> Result<&str, LoadError> {
        self.value(key)?
            .to_string()
            .map(String::as_str)
            .map_err(|_| LoadError::Missing(format!("string metadata {key}")))
    }

    fn usize(&self, key: &str) -> Result<usize, LoadError> {
        let v = self.value(key)?;
        let n = v
            .to_u64()
            .or_else(|_| v.to_u32().map(u64::from))
            .or_else(|_| v.to_i32().map(|x| u64::try_from(x).unwrap_or(0)))
            .map_err(|_| LoadError::Missing(format!("integer metadata {key}")))?;
        usize::try_from(n).map_err(|_| LoadError::Missing(format!("a sane {key}")))
    }

    fn f32_or(&self, key: &str, default: f32) -> Result<f32, LoadError> {
        match self.content.metadata.get(key) {
            None => Ok(default),
            Some(v) => v
                .to_f32()
                .map_err(|_| LoadError::Missing(format!("float metadata {key}"))),
        }
    }

    fn config(&self) -> Result<ModelConfig, LoadError> {
        let hidden = self.usize("llama.embedding_length")?;
        let heads = self.usize("llama.attention.head_count")?;
        let kv_heads = self.usize("llama.attention.head_count_kv").unwrap_or(heads);
        if heads == 0 || kv_heads == 0 || hidden % heads != 0 || heads % kv_heads != 0 {
            return Err(LoadError::Missing("consistent head counts".into()));
        }
        let embed = self.info("token_embd.weight")?;
        let vocab = embed.shape.dims().first().copied().unwrap_or(0);
        let quantization = self
            .content
            .tensor_infos
            .get("blk.0.attn_q.weight")
            .map(|i| format!("{:?}", i.ggml_dtype))
            .unwrap_or_default();
        Ok(ModelConfig {
            name: self.string("general.name").unwrap_or("unnamed").to_owned(),
            layers: self.usize("llama.block_count")?,
            hidden,
            ffn: self.usize("llama.feed_forward_length")?,
            heads,
            kv_heads,
            head_dim: hidden / heads,
            rms_eps: self.f32_or("llama.attention.layer_norm_rms_epsilon", 1e-5)?,
            rope_base: self.f32_or("llama.rope.freq_base", 10_000.0)?,
            context_window: self.usize("llama.context_length")?,
            vocab,
            quantization,
        })
    }

    fn info(
        &self,
        name: &str,
    ) -> Result<&candle_core::quantized::gguf_file::TensorInfo, LoadError> {
        self.content
            .tensor_infos
            .get(name)
            .ok_or_else(|| LoadError::Missing(format!("tensor {name}")))
    }

    fn raw(&self, name: &str) -> Result<(&[u8], GgmlDType, Vec<usize>), LoadError> {
        let info = self.info(name)?;
        let elems = info.shape.elem_count();
        let dtype = info.ggml_dtype;
        let len = elems / dtype.block_size() * dtype.type_size();
        let start = usize::try_from(self.content.tensor_data_offset + info.offset)
            .map_err(|_| LoadError::Gguf(format!("offset of {name}")))?;
        let data = self.bytes.get(start..start + len).ok_or_else(|| {
            LoadError::Gguf(format!("tensor {name} runs past the end of the file"))
        })?;
        Ok((data, dtype, info.shape.dims().to_vec()))
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, LoadError> {
        let m = self.matrix(name, 1, len)?;
        let mut out = vec![0f32; len];
        match m {
            Matrix::F32 { data, .. } => out.copy_from_slice(&data),
            Matrix::Quant(_) => m.row_f32(0, &mut out),
        }
        Ok(out)
    }

    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix, LoadError> {
        let (data, dtype, dims) = self.raw(name)?;
        let expected = if rows == 1 {
            vec![cols]
        } else {
            vec![rows, cols]
        };
        if dims != expected {
            return Err(LoadError::Shape {
                name: name.to_owned(),
                found: dims,
                expected,
            });
        }
        let quant = |format| {
            WeightsQ::from_gguf_bytes(format, rows, cols, data)
                .map(Matrix::Quant)
                .map_err(|e| LoadError::Gguf(format!("{name}: {e}")))
        };
        let f32s = |data: Vec<f32>| Matrix::F32 { rows, cols, data };
        match dtype {
            GgmlDType::Q4_0 => quant(WeightFormat::Q4_0),
            GgmlDType::Q4_1 => quant(WeightFormat::Q4_1),
            GgmlDType::Q8_0 => quant(WeightFormat::Q8_0),
            GgmlDType::F32 => Ok(f32s(
                data.chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            )),
            GgmlDType::F16 => Ok(f32s(
                data.chunks_exact(2)
                    .map(|b| half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
                    .collect(),
            )),
            _ => {
                let dev = candle_core::Device::Cpu;
                let qt = self
                    .info(name)?
                    .read(
                        &mut Cursor::new(self.bytes),
                        self.content.tensor_data_offset,
                        &dev,
                    )
                    .and_then(|q| q.dequantize(&dev))
                    .and_then(|t| t.flatten_all())
                    .and_then(|t| t.to_vec1::<f32>())
                    .map_err(|e| LoadError::Gguf(format!("{name}: {e}")))?;
                Ok(f32s(qt))
            }
        }
    }

    fn weights(&self, c: &ModelConfig) -> Result<Weights, LoadError> {
        let kv = c.kv_heads * c.head_dim;
        let layers = (0..c.layers)
            .map(|i| {
                let n = |t: &str| format!("blk.{i}.{t}.weight");
                Ok(LayerWeights {
                    attn_norm: self.vector(&n("attn_norm"), c.hidden)?,
                    wq: self.matrix(&n("attn_q"), c.hidden, c.hidden)?,
                    wk: self.matrix(&n("attn_k"), kv, c.hidden)?,
                    wv: self.matrix(&n("attn_v"), kv, c.hidden)?,
                    wo: self.matrix(&n("attn_output"), c.hidden, c.hidden)?,
                    ffn_norm: self.vector(&n("ffn_norm"), c.hidden)?,
                    gate: self.matrix(&n("ffn_gate"), c.ffn, c.hidden)?,
                    up: self.matrix(&n("ffn_up"), c.ffn, c.hidden)?,
                    down: self.matrix(&n("ffn_down"), c.hidden, c.ffn)?,
                })
            })
            .collect::<Result<Vec<_>, LoadError>>()?;
        let output = if self.content.tensor_infos.contains_key("output.weight") {
            Some(self.matrix("output.weight", c.vocab, c.hidden)?)
        } else {
            None
        };
        Ok(Weights {
            embed: self.matrix("token_embd.weight", c.vocab, c.hidden)?,
            layers,
            norm: self.vector("output_norm.weight", c.hidden)?,
            output,
        })
    }
}
