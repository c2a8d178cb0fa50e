//! The encoder: BERT's embeddings, `layers` transformer layers (fused
//! query/key/value projection, attention per input, output projection,
//! exact-GELU feed-forward, post-layer norms), then mean pooling over each
//! input's tokens and L2 normalisation, as sentence-transformers' modules
//! (`Transformer`, `Pooling`, `Normalize`) compute them.
//!
//! A batch is packed: its inputs' tokens are rows of one matrix, so the
//! projections and the feed-forward layer (most of the work) are one
//! matrix product each over real tokens, with no padding; attention, which
//! mixes tokens, runs per input over its own rows only. No input's rows are
//! ever read by another input's attention or pooling.

use crate::{EmbedConfig, EmbedError, Tokens};
use candle_core::{DType, Device, Tensor};
use std::path::Path;

/// One transformer layer's weights (projections transposed to
/// `[in, out]`, so each is a plain matrix product).
struct Layer {
    qkv_w: Tensor,
    qkv_b: Tensor,
    out_w: Tensor,
    out_b: Tensor,
    attn_norm: (Tensor, Tensor),
    up_w: Tensor,
    up_b: Tensor,
    down_w: Tensor,
    down_b: Tensor,
    out_norm: (Tensor, Tensor),
}

/// The encoder's weights, on the CPU.
pub(crate) struct Encoder {
    word: Tensor,
    position: Tensor,
    token_type: Tensor,
    embed_norm: (Tensor, Tensor),
    layers: Vec<Layer>,
    heads: usize,
    head_dim: usize,
    eps: f32,
}

impl Encoder {
    /// Reads `model.safetensors` under `dir` and checks every weight's shape
    /// against `config`.
    pub(crate) fn read(dir: &Path, config: &EmbedConfig) -> Result<Self, EmbedError> {
        let path = dir.join("model.safetensors");
        let bytes = std::fs::read(&path).map_err(|source| EmbedError::Io {
            path: path.clone(),
            source,
        })?;
        let mut w = Weights {
            map: candle_core::safetensors::load_buffer(&bytes, &Device::Cpu)?,
            path,
        };
        let (h, i) = (config.hidden_size, config.intermediate_size);
        let embed_norm = w.norm("embeddings.LayerNorm", h)?;
        let word = w.take("embeddings.word_embeddings.weight", &[config.vocab_size, h])?;
        let position = w.take(
            "embeddings.position_embeddings.weight",
            &[config.max_position_embeddings, h],
        )?;
        // Every input is a single segment: token type 0.
        let token_type = w
            .take("embeddings.token_type_embeddings.weight", &[2, h])?
            .get(0)?;
        let mut layers = Vec::with_capacity(config.layers);
        for l in 0..config.layers {
            let p = format!("encoder.layer.{l}");
            let q = w.linear(&format!("{p}.attention.self.query"), h, h)?;
            let k = w.linear(&format!("{p}.attention.self.key"), h, h)?;
            let v = w.linear(&format!("{p}.attention.self.value"), h, h)?;
            let (out_w, out_b) = w.linear(&format!("{p}.attention.output.dense"), h, h)?;
            let (up_w, up_b) = w.linear(&format!("{p}.intermediate.dense"), i, h)?;
            let (down_w, down_b) = w.linear(&format!("{p}.output.dense"), h, i)?;
            layers.push(Layer {
                qkv_w: Tensor::cat(&[q.0, k.0, v.0], 1)?.contiguous()?,
                qkv_b: Tensor::cat(&[q.1, k.1, v.1], 0)?,
                out_w,
                out_b,
                attn_norm: w.norm(&format!("{p}.attention.output.LayerNorm"), h)?,
                up_w,
                up_b,
                down_w,
                down_b,
                out_norm: w.norm(&format!("{p}.output.LayerNorm"), h)?,
            });
        }
        Ok(Encoder {
            word,
            position,
            token_type,
            embed_norm,
            layers,
            heads: config.heads,
            head_dim: h / config.heads,
            eps: config.layer_norm_eps as f32,
        })
    }

    /// One normalised vector per input, in order; `turn()` runs before
    /// each layer and each of its matrix products (pieces of a few
    /// milliseconds), where the caller may wait for its turn to compute.
    pub(crate) fn embed(
        &self,
        inputs: &[Tokens],
        turn: &dyn Fn(),
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        if inputs.is_empty() {
            return Ok(Vec::new());
        }
        let spans: Vec<(usize, usize)> = inputs
            .iter()
            .scan(0, |off, t| {
                let span = (*off, t.len());
                *off += t.len();
                Some(span)
            })
            .collect();
        let ids: Vec<u32> = inputs
            .iter()
            .flat_map(|t| t.ids().iter().copied())
            .collect();
        let positions: Vec<u32> = inputs.iter().flat_map(|t| 0..t.len() as u32).collect();
        let n = ids.len();
        let ids = Tensor::from_vec(ids, n, &Device::Cpu)?;
        let positions = Tensor::from_vec(positions, n, &Device::Cpu)?;
        let x = self
            .word
            .index_select(&ids, 0)?
            .add(&self.position.index_select(&positions, 0)?)?
            .broadcast_add(&self.token_type)?;
        let mut x = layer_norm(&x, &self.embed_norm, self.eps)?;
        for layer in &self.layers {
            turn();
            x = self.layer(layer, &x, &spans, turn)?;
        }
        let mut out = Vec::with_capacity(inputs.len());
        for &(off, len) in &spans {
            let mean = x.narrow(0, off, len)?.mean(0)?;
            let mut v = mean.to_vec1::<f32>()?;
            // torch.nn.functional.normalize: x / max(‖x‖, 1e-12).
            let norm = v.iter().map(|a| a * a).sum::<f32>().sqrt().max(1e-12);
            for a in &mut v {
                *a /= norm;
            }
            out.push(v);
        }
        Ok(out)
    }

    fn layer(
        &self,
        l: &Layer,
        x: &Tensor,
        spans: &[(usize, usize)],
        turn: &dyn Fn(),
    ) -> Result<Tensor, EmbedError> {
        let hidden = self.heads * self.head_dim;
        let qkv = linear(x, &l.qkv_w, &l.qkv_b)?;
        #[allow(clippy::cast_precision_loss)]
        let scale = 1.0 / (self.head_dim as f32).sqrt();
        let mut mixed = Vec::with_capacity(spans.len());
        for &(off, len) in spans {
            let rows = qkv.narrow(0, off, len)?;
            // [len, hidden] → [heads, len, head_dim]
            let split = |i: usize| -> candle_core::Result<Tensor> {
                rows.narrow(1, i * hidden, hidden)?
                    .reshape((len, self.heads, self.head_dim))?
                    .transpose(0, 1)?
                    .contiguous()
            };
            let (q, k, v) = (split(0)?, split(1)?, split(2)?);
            let p = softmax_rows(&q.matmul(&k.t()?)?, scale)?;
            let ctx = p.matmul(&v)?.transpose(0, 1)?.reshape((len, hidden))?;
            mixed.push(ctx);
        }
        let ctx = Tensor::cat(&mixed, 0)?;
        turn();
        let attended = linear(&ctx, &l.out_w, &l.out_b)?;
        let x = layer_norm(&x.add(&attended)?, &l.attn_norm, self.eps)?;
        turn();
        let up = gelu(&linear(&x, &l.up_w, &l.up_b)?)?;
        turn();
        let down = linear(&up, &l.down_w, &l.down_b)?;
        Ok(layer_norm(&x.add(&down)?, &l.out_norm, self.eps)?)
    }
}

/// The file's tensors, taken out by name and shape.
struct Weights {
    map: std::collections::HashMap<String, Tensor>,
    path: std::path::PathBuf,
}

impl Weights {
    fn take(&mut self, name: &str, shape: &[usize]) -> Result<Tensor, EmbedError> {
        let refuse = |message: String| EmbedError::Config {
            path: self.path.clone(),
            message,
        };
        let t = self
            .map
            .remove(name)
            .ok_or_else(|| refuse(format!("no tensor {name}")))?;
        if t.dims() != shape {
            return Err(refuse(format!(
                "{name} is {:?}, expected {shape:?}",
                t.dims()
            )));
        }
        Ok(t.to_dtype(DType::F32)?)
    }

    /// A layer norm's weight and bias.
    fn norm(&mut self, prefix: &str, n: usize) -> Result<(Tensor, Tensor), EmbedError> {
        Ok((
            self.take(&format!("{prefix}.weight"), &[n])?,
            self.take(&format!("{prefix}.bias"), &[n])?,
        ))
    }

    /// A linear layer's weight, transposed to `[inp, out]`, and bias.
    fn linear(
        &mut self,
        prefix: &str,
        out: usize,
        inp: usize,
    ) -> Result<(Tensor, Tensor), EmbedError> {
        let w = self
            .take(&format!("{prefix}.weight"), &[out, inp])?
            .t()?
            .contiguous()?;
        Ok((w, self.take(&format!("{prefix}.bias"), &[out])?))
    }
}

fn linear(x: &Tensor, w: &Tensor, b: &Tensor) -> candle_core::Result<Tensor> {
    x.matmul(w)?.broadcast_add(b)
}

/// BERT's exact GELU, by the project's vectorized kernel (candle's calls
/// `erf` one value at a time).
fn gelu(x: &Tensor) -> candle_core::Result<Tensor> {
    by_rows(x, 16, bulkhead_kernels::ops::gelu_erf)
}

/// `softmax(scale · row)` of every row of `scores` (the last dimension),
/// by the project's vectorized kernel (candle's calls `exp` one value at a
/// time).
fn softmax_rows(scores: &Tensor, scale: f32) -> candle_core::Result<Tensor> {
    by_rows(scores, 1, |r| {
        bulkhead_kernels::ops::attention_softmax(r, scale, false);
    })
}

/// `x` with `f` applied in place to groups of `rows` rows (the last
/// dimension), the groups shared across the pool.
fn by_rows(
    x: &Tensor,
    rows: usize,
    f: impl Fn(&mut [f32]) + Send + Sync,
) -> candle_core::Result<Tensor> {
    use rayon::prelude::*;
    let shape = x.shape().clone();
    let mut v = x.flatten_all()?.to_vec1::<f32>()?;
    let row = shape.dims().last().copied().unwrap_or(1).max(1);
    v.par_chunks_mut(row * rows).for_each(f);
    Tensor::from_vec(v, shape, &Device::Cpu)
}

fn layer_norm(x: &Tensor, (w, b): &(Tensor, Tensor), eps: f32) -> candle_core::Result<Tensor> {
    candle_nn::ops::layer_norm(x, w, b, eps)
}
