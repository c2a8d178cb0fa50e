//! One forward pass of a LLaMA model over a ragged batch: prefill chunks and
//! decode tokens of many sequences stacked as rows, keys and values written
//! to and read from tenant-tagged pages.
//!
//! Attention reaches page memory only through `PageReader::page`, which
//! checks the page's owner tag against the reading sequence; a refused page
//! contributes nothing and the sequence is reported as violated.

use crate::gguf::{ModelConfig, Weights};
use bulkhead_kernels::ops::{
    LANES, SumOrder, add_assign, axpy, dot_columns_ordered, rms_norm, silu_mul, softmax_ggml,
};
use bulkhead_kernels::{Matrix, Workspace};
use bulkhead_kv::{KvPool, Owner, OwnerViolation, PageTable};
use rayon::prelude::*;
use std::cell::RefCell;

/// One sequence's part of a step.
#[derive(Debug)]
pub(crate) struct BatchSeq<'a> {
    pub(crate) owner: Owner,
    pub(crate) table: &'a PageTable,
    /// Position of `tokens[0]` in the sequence.
    pub(crate) start: usize,
    pub(crate) tokens: &'a [u32],
    /// Whether logits of the last row are wanted.
    pub(crate) want_logits: bool,
}

/// What a forward pass produced.
#[derive(Debug)]
pub(crate) struct ForwardOutput {
    /// `vocab` logits for each sequence that wanted them and was not
    /// violated, in batch order: `(batch index, logits)`.
    pub(crate) logits: Vec<(usize, Vec<f32>)>,
    /// Ownership violations, one per violated sequence: `(batch index, violation)`.
    pub(crate) violations: Vec<(usize, OwnerViolation)>,
}

/// Precomputed rotary embedding tables (interleaved pairs, as llama.cpp's
/// `NORM` RoPE and candle's `rope_i`).
#[derive(Debug)]
pub(crate) struct Rope {
    cos: Vec<f32>,
    sin: Vec<f32>,
    half: usize,
}

impl Rope {
    pub(crate) fn new(c: &ModelConfig) -> Self {
        let half = c.head_dim / 2;
        // ggml_rope_cache_init: theta starts at the position and is
        // multiplied by base^(-2/d) once per pair, in f32.
        #[allow(clippy::cast_precision_loss)]
        let theta_scale = c.rope_base.powf(-2.0 / c.head_dim as f32);
        let mut cos = Vec::with_capacity(c.context_window * half);
        let mut sin = Vec::with_capacity(c.context_window * half);
        for p in 0..c.context_window {
            #[allow(clippy::cast_precision_loss)]
            let mut theta = p as f32;
            for _ in 0..half {
                cos.push(theta.cos());
                sin.push(theta.sin());
                theta *= theta_scale;
            }
        }
        Rope { cos, sin, half }
    }

    fn apply(&self, x: &mut [f32], pos: usize) {
        let (c, s) = (
            &self.cos[pos * self.half..(pos + 1) * self.half],
            &self.sin[pos * self.half..(pos + 1) * self.half],
        );
        for (i, pair) in x.chunks_exact_mut(2).enumerate() {
            let (x0, x1) = (pair[0], pair[1]);
            // As ggml's rotate_pairs compiled with FMA contraction.
            pair[0] = x0.mul_add(c[i], -(x1 * s[i]));
            pair[1] = x0.mul_add(s[i], x1 * c[i]);
        }
    }
}

/// Largest head dimension the attention kernel supports.
pub(crate) const MAX_HEAD_DIM: usize = 128;

fn round_f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

thread_local! {
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs the model over `batch`. Must run inside the engine's rayon pool.
pub(crate) fn forward(
    c: &ModelConfig,
    w: &Weights,
    rope: &Rope,
    pool: &mut KvPool,
    batch: &[BatchSeq<'_>],
) -> ForwardOutput {
    let (h, hd, kvd) = (c.hidden, c.head_dim, c.kv_heads * c.head_dim);
    let rows: Vec<(usize, usize)> = batch
        .iter()
        .enumerate()
        .flat_map(|(s, b)| (0..b.tokens.len()).map(move |i| (s, b.start + i)))
        .collect();
    let n = rows.len();
    let mut x = vec![0f32; n * h];
    for (r, tok) in batch.iter().flat_map(|b| b.tokens).enumerate() {
        w.embed.row_f32(*tok as usize, &mut x[r * h..(r + 1) * h]);
    }
    let mut violated: Vec<Option<OwnerViolation>> = vec![None; batch.len()];
    let (mut xn, mut q, mut attn, mut o) = (vec![0f32; n * h], vec![0f32; n * h], vec![0f32; n * h], vec![0f32; n * h]);
    let (mut k, mut v) = (vec![0f32; n * kvd], vec![0f32; n * kvd]);
    let (mut gate, mut up) = (vec![0f32; n * c.ffn], vec![0f32; n * c.ffn]);

    let dump = std::env::var_os("BULKHEAD_DEBUG_DUMP").is_some();
    let mut dumped: Vec<(String, Vec<f32>)> = Vec::new();
    for (l, lw) in w.layers.iter().enumerate() {
        norm_rows(&x, &lw.attn_norm, c.rms_eps, &mut xn, h);
        if dump { dumped.push((format!("attn_norm-{l}"), xn.clone())); }
        let mut ws = Workspace::new(&xn, n, h);
        lw.wq.matmul(&mut ws, &mut q);
        lw.wk.matmul(&mut ws, &mut k);
        lw.wv.matmul(&mut ws, &mut v);
        for (r, &(s, pos)) in rows.iter().enumerate() {
            for head in q[r * h..(r + 1) * h].chunks_exact_mut(hd) {
                rope.apply(head, pos);
            }
            for head in k[r * kvd..(r + 1) * kvd].chunks_exact_mut(hd) {
                rope.apply(head, pos);
            }
            // The cache holds f16 values, as llama.cpp's default KV cache.
            for x in k[r * kvd..(r + 1) * kvd].iter_mut().chain(v[r * kvd..(r + 1) * kvd].iter_mut()) {
                *x = round_f16(*x);
            }
            if violated[s].is_some() {
                continue;
            }
            let b = &batch[s];
            if let Err(e) = pool.write_token(b.table, l, pos, &k[r * kvd..(r + 1) * kvd], &v[r * kvd..(r + 1) * kvd]) {
                violated[s] = Some(e);
            }
        }

        if dump { dumped.push((format!("Qcur-{l}"), q.clone())); dumped.push((format!("Kcur-{l}"), k.clone())); dumped.push((format!("Vcur-{l}"), v.clone())); }
        let reader = pool.reader();
        let group = c.heads / c.kv_heads;
        #[allow(clippy::cast_precision_loss)]
        let scale = 1.0 / (hd as f32).sqrt();
        let ps = pool.geometry().page_size;
        let found: Vec<(usize, OwnerViolation)> = attn
            .par_chunks_mut(hd)
            .enumerate()
            .filter_map(|(task, out)| {
                let (r, qh) = (task / c.heads, task % c.heads);
                let (s, pos) = rows[r];
                out.fill(0.0);
                if violated[s].is_some() {
                    return None;
                }
                let b = &batch[s];
                let qv = &q[r * h + qh * hd..r * h + (qh + 1) * hd];
                let kvh = qh / group;
                // llama.cpp sums attention dot products in sgemm order for a
                // chunk of two or more tokens and in vec_dot order for one.
                let order = if b.tokens.len() > 1 { SumOrder::Sgemm } else { SumOrder::VecDot };
                let n_ctx = pos + 1;
                // As llama.cpp's default (non-flash) attention on an f16 KV
                // cache: q rounded to f16, softmax normalized in full (sum in
                // f64), probabilities rounded to f16 before weighting values.
                let mut qr = [0f32; MAX_HEAD_DIM];
                let qr = &mut qr[..hd];
                for (d, x) in qr.iter_mut().zip(qv) {
                    *d = round_f16(*x);
                }
                let n_pages = n_ctx.div_ceil(ps);
                let mut views = Vec::with_capacity(n_pages);
                for pref in &b.table.pages()[..n_pages] {
                    match reader.page(l, b.owner, *pref) {
                        Ok(view) => views.push(view),
                        Err(e) => return Some((s, e)),
                    }
                }
                SCORES.with_borrow_mut(|scores| {
                    scores.resize(n_pages * ps, 0.0);
                    for (pi, view) in views.iter().enumerate() {
                        let m = ps.min(n_ctx - pi * ps);
                        dot_columns_ordered(qr, view.keys(kvh), ps, &mut scores[pi * ps..pi * ps + m], order);
                    }
                    let sc = &mut scores[..n_ctx];
                    for v in sc.iter_mut() {
                        *v *= scale;
                    }
                    softmax_ggml(sc);
                    let mut lanes = [[0f32; MAX_HEAD_DIM]; LANES];
                    let n_lanes = order.lanes();
                    for (pi, view) in views.iter().enumerate() {
                        let m = ps.min(n_ctx - pi * ps);
                        let vals = view.values(kvh);
                        for t in 0..m {
                            let p = round_f16(sc[pi * ps + t]);
                            axpy(p, &vals[t * hd..(t + 1) * hd], &mut lanes[(pi * ps + t) % n_lanes][..hd]);
                        }
                    }
                    for (d, o) in out.iter_mut().enumerate() {
                        *o = order.combine(&std::array::from_fn(|j| lanes[j][d]));
                    }
                });
                None
            })
            .collect();
        for (s, e) in found {
            violated[s].get_or_insert(e);
        }

        if dump { dumped.push((format!("kqv_out-{l}"), attn.clone())); }
        let mut ws = Workspace::new(&attn, n, h);
        lw.wo.matmul(&mut ws, &mut o);
        if dump { dumped.push((format!("attn_out-{l}"), o.clone())); }
        add_assign(&mut x, &o);
        if dump { dumped.push((format!("ffn_inp-{l}"), x.clone())); }

        norm_rows(&x, &lw.ffn_norm, c.rms_eps, &mut xn, h);
        let mut ws = Workspace::new(&xn, n, h);
        lw.gate.matmul(&mut ws, &mut gate);
        lw.up.matmul(&mut ws, &mut up);
        if dump { dumped.push((format!("ffn_gate-{l}"), gate.clone())); dumped.push((format!("ffn_up-{l}"), up.clone())); }
        silu_mul(&mut gate, &up);
        if dump { dumped.push((format!("ffn_swiglu-{l}"), gate.clone())); }
        let mut ws = Workspace::new(&gate, n, c.ffn);
        lw.down.matmul(&mut ws, &mut o);
        if dump { dumped.push((format!("ffn_out-{l}"), o.clone())); }
        add_assign(&mut x, &o);
        if dump { dumped.push((format!("l_out-{l}"), x.clone())); }
    }
    if dump {
        let m: std::collections::HashMap<_, _> = dumped.into_iter().collect();
        std::fs::write("/tmp/bh/ours_dump.json", serde_json::to_string(&m).unwrap()).unwrap();
    }

    // Logits only for the last row of each sequence that wants them.
    let mut wanted = Vec::new();
    let mut last_row = 0;
    for (s, b) in batch.iter().enumerate() {
        last_row += b.tokens.len();
        if b.want_logits && violated[s].is_none() {
            wanted.push((s, last_row - 1));
        }
    }
    let mut logits = Vec::with_capacity(wanted.len());
    if !wanted.is_empty() {
        let m = wanted.len();
        let mut hn = vec![0f32; m * h];
        for (i, (_, r)) in wanted.iter().enumerate() {
            rms_norm(&x[r * h..(r + 1) * h], &w.norm, c.rms_eps, &mut hn[i * h..(i + 1) * h]);
        }
        let head: &Matrix = w.output.as_ref().unwrap_or(&w.embed);
        let mut out = vec![0f32; m * c.vocab];
        head.matmul(&mut Workspace::new(&hn, m, h), &mut out);
        for (i, (s, _)) in wanted.iter().enumerate() {
            logits.push((*s, out[i * c.vocab..(i + 1) * c.vocab].to_vec()));
        }
    }
    let violations = violated
        .into_iter()
        .enumerate()
        .filter_map(|(s, v)| v.map(|v| (s, v)))
        .collect();
    ForwardOutput { logits, violations }
}

fn norm_rows(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32], h: usize) {
    for (xr, or) in x.chunks_exact(h).zip(out.chunks_exact_mut(h)) {
        rms_norm(xr, weight, eps, or);
    }
}
