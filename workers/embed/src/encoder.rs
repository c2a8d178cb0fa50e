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
//!
//! With several threads and several inputs, the batch splits into one
//! group of whole inputs per thread (about as many tokens each), and each
//! group computes on its own thread, start to end of a stage, with no
//! synchronisation inside it; the groups meet only between stages (the
//! four pieces of a layer), where the caller's `turn` runs. One input
//! alone computes its products on every thread. An input's vector is the
//! same in any group, alone or packed.

use crate::dense::{Parallelism, View, add_norm, linear, norm, product};
use crate::{EmbedConfig, EmbedError, Tokens};
use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;
use std::path::Path;

/// One transformer layer's weights, row-major (projections transposed to
/// `[in, out]`, so each is a plain matrix product).
struct Layer {
    qkv_w: Vec<f32>,
    qkv_b: Vec<f32>,
    out_w: Vec<f32>,
    out_b: Vec<f32>,
    attn_norm: (Vec<f32>, Vec<f32>),
    up_w: Vec<f32>,
    up_b: Vec<f32>,
    down_w: Vec<f32>,
    down_b: Vec<f32>,
    out_norm: (Vec<f32>, Vec<f32>),
}

/// The encoder's weights, on the CPU.
pub(crate) struct Encoder {
    word: Vec<f32>,
    position: Vec<f32>,
    token_type: Vec<f32>,
    embed_norm: (Vec<f32>, Vec<f32>),
    layers: Vec<Layer>,
    hidden: usize,
    heads: usize,
    head_dim: usize,
    eps: f32,
}

/// One group's rows through a pass: its inputs' spans and hidden states.
struct Group {
    /// `(first row, rows)` of each input.
    spans: Vec<(usize, usize)>,
    x: Vec<f32>,
    /// Between the first two stages of a layer: the attention's output.
    ctx: Vec<f32>,
    /// Between the third and fourth: the activated feed-forward rows.
    up: Vec<f32>,
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
                qkv_w: flat(&Tensor::cat(&[q.0, k.0, v.0], 1)?)?,
                qkv_b: flat(&Tensor::cat(&[q.1, k.1, v.1], 0)?)?,
                out_w: flat(&out_w)?,
                out_b: flat(&out_b)?,
                attn_norm: w.norm(&format!("{p}.attention.output.LayerNorm"), h)?,
                up_w: flat(&up_w)?,
                up_b: flat(&up_b)?,
                down_w: flat(&down_w)?,
                down_b: flat(&down_b)?,
                out_norm: w.norm(&format!("{p}.output.LayerNorm"), h)?,
            });
        }
        Ok(Encoder {
            word: flat(&word)?,
            position: flat(&position)?,
            token_type: flat(&token_type)?,
            embed_norm,
            layers,
            hidden: h,
            heads: config.heads,
            head_dim: h / config.heads,
            eps: config.layer_norm_eps as f32,
        })
    }

    /// One normalised vector per input, in order; `turn()` runs before
    /// each of the four stages of every layer (attention, its output
    /// projection, the feed-forward's two products: pieces of a few
    /// milliseconds), where the caller may wait for its turn to compute.
    pub(crate) fn embed(
        &self,
        inputs: &[Tokens],
        turn: &dyn Fn(),
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        if inputs.is_empty() {
            return Ok(Vec::new());
        }
        let threads = rayon::current_num_threads().max(1);
        let mut groups = split(inputs, threads)
            .into_iter()
            .map(|g| self.embedded(g))
            .collect::<Result<Vec<Group>, EmbedError>>()?;
        // Fewer groups than threads (one input): each product on all of them.
        let par = if groups.len() < threads {
            Parallelism::Rayon(threads)
        } else {
            Parallelism::None
        };
        for layer in &self.layers {
            turn();
            each(&mut groups, |g| self.attend(layer, g, par));
            turn();
            each(&mut groups, |g| {
                let attended = linear(&g.ctx, &layer.out_w, &layer.out_b, par);
                add_norm(&mut g.x, &attended, pair(&layer.attn_norm), self.eps);
            });
            turn();
            each(&mut groups, |g| {
                g.up = linear(&g.x, &layer.up_w, &layer.up_b, par);
                bulkhead_kernels::ops::gelu_erf(&mut g.up);
            });
            turn();
            each(&mut groups, |g| {
                let down = linear(&g.up, &layer.down_w, &layer.down_b, par);
                add_norm(&mut g.x, &down, pair(&layer.out_norm), self.eps);
            });
        }
        Ok(groups.iter().flat_map(|g| self.pooled(g)).collect())
    }

    /// A group's rows after the embedding layer.
    fn embedded(&self, inputs: &[Tokens]) -> Result<Group, EmbedError> {
        let h = self.hidden;
        let rows: usize = inputs.iter().map(Tokens::len).sum();
        let mut x = Vec::with_capacity(rows * h);
        let mut spans = Vec::with_capacity(inputs.len());
        for t in inputs {
            spans.push((x.len() / h, t.len()));
            for (pos, &id) in t.ids().iter().enumerate() {
                let id = id as usize;
                let (Some(word), Some(position)) = (
                    self.word.get(id * h..(id + 1) * h),
                    self.position.get(pos * h..(pos + 1) * h),
                ) else {
                    // Unreachable for `Tokens` (ids checked against the
                    // vocabulary, lengths against the positions at load):
                    // an error rather than a panic all the same.
                    return Err(EmbedError::Failed(format!(
                        "token {id} at position {pos} is outside the model's tables"
                    )));
                };
                x.extend(
                    word.iter()
                        .zip(position)
                        .zip(&self.token_type)
                        .map(|((w, p), t)| w + p + t),
                );
            }
        }
        norm(&mut x, pair(&self.embed_norm), self.eps);
        Ok(Group {
            spans,
            x,
            ctx: Vec::new(),
            up: Vec::new(),
        })
    }

    /// Self-attention of each input of `g` over its own rows, into `g.ctx`.
    fn attend(&self, l: &Layer, g: &mut Group, par: Parallelism) {
        let (h, hd) = (self.hidden, self.head_dim);
        let qkv = linear(&g.x, &l.qkv_w, &l.qkv_b, par);
        #[allow(clippy::cast_precision_loss)]
        let scale = 1.0 / (hd as f32).sqrt();
        g.ctx = vec![0.0; g.x.len()];
        let mut scores = Vec::new();
        for &(off, len) in &g.spans {
            scores.resize(len * len, 0.0);
            let rows = &qkv[off * 3 * h..(off + len) * 3 * h];
            for head in 0..self.heads {
                let part = |i: usize| View {
                    data: &rows[i * h + head * hd..],
                    rows: len,
                    cols: hd,
                    rs: 3 * h,
                    cs: 1,
                };
                product(part(0), part(1).t(), &mut scores, len, false, par);
                for r in scores.chunks_exact_mut(len) {
                    bulkhead_kernels::ops::attention_softmax(r, scale, false);
                }
                let out = &mut g.ctx[off * h + head * hd..(off + len) * h];
                product(View::rows(&scores, len, len), part(2), out, h, false, par);
            }
        }
    }

    /// Each input's mean over its rows, L2-normalised.
    fn pooled(&self, g: &Group) -> Vec<Vec<f32>> {
        let h = self.hidden;
        g.spans
            .iter()
            .map(|&(off, len)| {
                let mut v = vec![0.0f32; h];
                for row in g.x[off * h..(off + len) * h].chunks_exact(h) {
                    for (a, x) in v.iter_mut().zip(row) {
                        *a += x;
                    }
                }
                #[allow(clippy::cast_precision_loss)]
                let n = len.max(1) as f32;
                for a in &mut v {
                    *a /= n;
                }
                // torch.nn.functional.normalize: x / max(‖x‖, 1e-12).
                let norm = v.iter().map(|a| a * a).sum::<f32>().sqrt().max(1e-12);
                for a in &mut v {
                    *a /= norm;
                }
                v
            })
            .collect()
    }
}

/// `f` on every group, each on a thread of the pool.
fn each(groups: &mut [Group], f: impl Fn(&mut Group) + Sync + Send) {
    if let [g] = groups {
        f(g);
    } else {
        groups.par_iter_mut().for_each(f);
    }
}

/// `inputs` in at most `threads` runs of whole inputs with about as many
/// tokens each (one run per input when there are fewer inputs).
fn split(inputs: &[Tokens], threads: usize) -> Vec<&[Tokens]> {
    let parts = threads.min(inputs.len()).max(1);
    let total: usize = inputs.iter().map(Tokens::len).sum();
    let mut runs = Vec::with_capacity(parts);
    let (mut lo, mut sum) = (0, 0);
    for (i, t) in inputs.iter().enumerate() {
        sum += t.len();
        let left = inputs.len() - i - 1;
        let needed = parts - runs.len() - 1;
        // Close the run at its share of the tokens, or when each later run
        // needs one of the inputs left.
        if needed > 0 && (sum * parts >= total * (runs.len() + 1) || left == needed) {
            runs.push(&inputs[lo..=i]);
            lo = i + 1;
        }
    }
    runs.push(&inputs[lo..]);
    runs
}

/// A norm's weight and bias as slices.
fn pair((w, b): &(Vec<f32>, Vec<f32>)) -> (&[f32], &[f32]) {
    (w, b)
}

/// A tensor's elements, row-major.
fn flat(t: &Tensor) -> Result<Vec<f32>, EmbedError> {
    Ok(t.flatten_all()?.to_vec1::<f32>()?)
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
    fn norm(&mut self, prefix: &str, n: usize) -> Result<(Vec<f32>, Vec<f32>), EmbedError> {
        Ok((
            flat(&self.take(&format!("{prefix}.weight"), &[n])?)?,
            flat(&self.take(&format!("{prefix}.bias"), &[n])?)?,
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
