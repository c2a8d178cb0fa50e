//! One forward pass of a LLaMA model over a ragged batch: prefill chunks and
//! decode tokens of many sequences stacked as rows, keys and values written
//! to and read from tenant-tagged pages.
//!
//! Attention reaches page memory only through `PageReader::page`, which
//! checks the page's owner tag against the reading sequence; a refused page
//! contributes nothing and the sequence is reported as violated.
//!
//! [`Numerics::LlamaCpp`] (the default) reproduces llama.cpp's CPU numerics bit
//! for bit, in the summation orders of its AVX-512 build (sgemm order for a
//! chunk of two or more tokens, vec_dot order for one), so the same file gives
//! the same greedy tokens on any CPU; [`Numerics::F32Reference`] keeps f32
//! pages and is checked against candle's `quantized_llama`. Activation buffers
//! (`Buffers`) live across steps.

use crate::gguf::{ModelConfig, ModelFile};
use bulkhead_kernels::attention::{
    HeadPages, KvElement, QueryTile, Softmax, SumOrder, TileScratch, attend_tile,
};
use bulkhead_kernels::ops::{add_assign, rms_norm, rope_pairs, round_f16_slice, silu_mul};
use bulkhead_kernels::{Matrix, QuantScratch, Workspace, matmul_all};
use bulkhead_kv::{KvData, KvDtype, KvPool, OwnerViolation, PageTable, PageView};
use rayon::prelude::*;
use std::cell::RefCell;

/// One sequence's part of a step.
#[derive(Debug)]
pub(crate) struct BatchSeq<'a> {
    pub(crate) table: &'a PageTable,
    /// Position of `tokens[0]` in the sequence.
    pub(crate) start: usize,
    pub(crate) tokens: &'a [u32],
    /// Whether logits of the last row are wanted.
    pub(crate) want_logits: bool,
}

/// Activation buffers reused from step to step (no allocation, no page
/// faults on the hot path). Contents are overwritten before they are read.
#[derive(Debug, Default)]
pub(crate) struct Buffers {
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    attn: Vec<f32>,
    o: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    /// Attention outputs in task order, before they go to `attn`.
    tiles: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    hn: Vec<f32>,
    /// Quantized activations, reused by every matmul of every step.
    quant: QuantScratch,
    /// Logits of the sequences listed in `ForwardOutput::logits`, in order.
    pub(crate) logits: Vec<f32>,
}

/// The first `len` elements of `buf`, growing it if needed.
fn take(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    &mut buf[..len]
}

/// What a forward pass produced.
#[derive(Debug)]
pub(crate) struct ForwardOutput {
    /// Batch indices of the sequences whose logits are in
    /// `Buffers::logits` (`vocab` each, in this order): those that wanted
    /// them and were not violated.
    pub(crate) logits: Vec<usize>,
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
    pub(crate) fn new(c: &ModelConfig, numerics: Numerics) -> Self {
        let half = c.head_dim / 2;
        if numerics == Numerics::F32Reference {
            return Self::direct(c);
        }
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

    /// Angles `p · base^(-2i/d)` computed directly in f32, as candle does.
    fn direct(c: &ModelConfig) -> Self {
        let half = c.head_dim / 2;
        #[allow(clippy::cast_precision_loss)]
        let theta: Vec<f32> = (0..c.head_dim)
            .step_by(2)
            .map(|i| 1f32 / c.rope_base.powf(i as f32 / c.head_dim as f32))
            .collect();
        let mut cos = Vec::with_capacity(c.context_window * half);
        let mut sin = Vec::with_capacity(c.context_window * half);
        for p in 0..c.context_window {
            for t in &theta {
                #[allow(clippy::cast_precision_loss)]
                let a = p as f32 * t;
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        Rope { cos, sin, half }
    }

    fn apply(&self, x: &mut [f32], pos: usize) {
        let (c, s) = (
            &self.cos[pos * self.half..(pos + 1) * self.half],
            &self.sin[pos * self.half..(pos + 1) * self.half],
        );
        // As ggml's rotate_pairs compiled with FMA contraction.
        rope_pairs(x, c, s);
    }
}

thread_local! {
    /// Per-thread attention buffers, reused across tasks.
    static SCRATCH: RefCell<TileScratch> = RefCell::new(TileScratch::default());
}

/// How the forward pass rounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Numerics {
    /// llama.cpp's CPU numerics: an f16 KV cache (keys, values, queries and
    /// attention weights rounded to f16), ggml's RoPE angles, summation
    /// orders and `exp`. The same file gives the same tokens as llama.cpp.
    LlamaCpp,
    /// Everything in f32 with directly computed RoPE angles: the reference
    /// against which the forward pass is checked (candle, dequantized weights).
    F32Reference,
}

/// Runs the model over `batch`. Must run inside the engine's rayon pool.
pub(crate) fn forward(
    model: &ModelFile,
    rope: &Rope,
    numerics: Numerics,
    pool: &mut KvPool,
    batch: &[BatchSeq<'_>],
    bufs: &mut Buffers,
) -> ForwardOutput {
    let (c, w) = (&model.config, &model.weights);
    let (h, hd, kvd) = (c.hidden, c.head_dim, c.kv_heads * c.head_dim);
    let rows: Vec<(usize, usize)> = batch
        .iter()
        .enumerate()
        .flat_map(|(s, b)| (0..b.tokens.len()).map(move |i| (s, b.start + i)))
        .collect();
    let n = rows.len();
    let Buffers {
        x,
        xn,
        q,
        attn,
        o,
        k,
        v,
        tiles,
        gate,
        up,
        hn,
        quant,
        logits,
    } = bufs;
    let x = take(x, n * h);
    for (r, tok) in batch.iter().flat_map(|b| b.tokens).enumerate() {
        w.embed.row_f32(*tok as usize, &mut x[r * h..(r + 1) * h]);
    }
    // Each row's slots are about to be written in every layer: the pages
    // they fall in get every other stale slot zeroed first.
    let mut violated: Vec<Option<OwnerViolation>> = batch
        .iter()
        .map(|b| pool.begin_write(b.table, b.start, b.tokens.len()).err())
        .collect();
    let (xn, q, attn, o) = (
        take(xn, n * h),
        take(q, n * h),
        take(attn, n * h),
        take(o, n * h),
    );
    let (k, v) = (take(k, n * kvd), take(v, n * kvd));
    let (gate, up) = (take(gate, n * c.ffn), take(up, n * c.ffn));

    for (l, lw) in w.layers.iter().enumerate() {
        norm_rows(x, &lw.attn_norm, c.rms_eps, xn, h);
        let mut ws = Workspace::new(xn, n, h, quant);
        matmul_all(
            &mut ws,
            &mut [(&lw.wq, &mut *q), (&lw.wk, &mut *k), (&lw.wv, &mut *v)],
        );
        let layer = Layer {
            l,
            rows: &rows,
            h,
            hd,
            kvd,
        };
        rope_and_store(&layer, rope, numerics, pool, batch, q, k, v, &mut violated);
        for (s, e) in attention(&layer, c, numerics, pool, batch, q, attn, tiles, &violated) {
            violated[s].get_or_insert(e);
        }

        let mut ws = Workspace::new(attn, n, h, quant);
        lw.wo.matmul(&mut ws, o);
        add_assign(x, o);

        norm_rows(x, &lw.ffn_norm, c.rms_eps, xn, h);
        let mut ws = Workspace::new(xn, n, h, quant);
        matmul_all(&mut ws, &mut [(&lw.gate, &mut *gate), (&lw.up, &mut *up)]);
        silu_mul(gate, up);
        let mut ws = Workspace::new(gate, n, c.ffn, quant);
        lw.down.matmul(&mut ws, o);
        add_assign(x, o);
    }

    // Logits only for the last row of each sequence that wants them.
    let wanted = final_logits(model, batch, &violated, x, (hn, quant), logits);
    let violations = violated
        .into_iter()
        .enumerate()
        .filter_map(|(s, v)| v.map(|v| (s, v)))
        .collect();
    ForwardOutput {
        logits: wanted.into_iter().map(|(s, _)| s).collect(),
        violations,
    }
}

/// One layer's place in a forward pass: its index, each row's sequence
/// and position, and the model's widths.
struct Layer<'a> {
    l: usize,
    rows: &'a [(usize, usize)],
    h: usize,
    hd: usize,
    kvd: usize,
}

/// RoPE on every row's queries and keys, then each row's key and value
/// written to its sequence's pages (a sequence whose write was refused is
/// marked violated and written no more).
#[allow(clippy::too_many_arguments)]
fn rope_and_store(
    layer: &Layer<'_>,
    rope: &Rope,
    numerics: Numerics,
    pool: &mut KvPool,
    batch: &[BatchSeq<'_>],
    q: &mut [f32],
    k: &mut [f32],
    v: &mut [f32],
    violated: &mut [Option<OwnerViolation>],
) {
    let (h, hd, kvd) = (layer.h, layer.hd, layer.kvd);
    for (r, &(s, pos)) in layer.rows.iter().enumerate() {
        for head in q[r * h..(r + 1) * h].chunks_exact_mut(hd) {
            rope.apply(head, pos);
        }
        for head in k[r * kvd..(r + 1) * kvd].chunks_exact_mut(hd) {
            rope.apply(head, pos);
        }
        // With llama.cpp numerics the cache holds f16 values (its default).
        if numerics == Numerics::LlamaCpp {
            round_f16_slice(&mut k[r * kvd..(r + 1) * kvd]);
            round_f16_slice(&mut v[r * kvd..(r + 1) * kvd]);
        }
        if violated[s].is_some() {
            continue;
        }
        let b = &batch[s];
        if let Err(e) = pool.write_token(
            b.table,
            layer.l,
            pos,
            &k[r * kvd..(r + 1) * kvd],
            &v[r * kvd..(r + 1) * kvd],
        ) {
            violated[s] = Some(e);
        }
    }
}

/// Query rows of one sequence that one attention task takes together in a
/// prefill chunk: each key and value page is read from memory once for
/// all of them (see `bulkhead_kernels::attention`).
pub(crate) const TILE_ROWS: usize = 8;

/// One attention task: `rows` rows of sequence `seq` from batch row `row`,
/// against KV head `kv_head`.
#[derive(Debug, Clone, Copy)]
struct Task {
    seq: usize,
    row: usize,
    rows: usize,
    kv_head: usize,
}

/// Attention of every row over its sequence's pages; the violations found
/// reading pages.
///
/// Each sequence's pages for this layer are checked once, here, before any
/// task runs: a sequence with a refused page gets no task and its rows stay
/// zero. Tasks are tiles of up to [`TILE_ROWS`] consecutive rows of one
/// sequence against one KV head, each computing all the query heads of
/// that KV head. Queries are rounded to f16 in place with llama.cpp
/// numerics (they are not read again in this layer).
#[allow(clippy::too_many_arguments)]
fn attention(
    layer: &Layer<'_>,
    c: &ModelConfig,
    numerics: Numerics,
    pool: &KvPool,
    batch: &[BatchSeq<'_>],
    q: &mut [f32],
    attn: &mut [f32],
    tiles: &mut Vec<f32>,
    violated: &[Option<OwnerViolation>],
) -> Vec<(usize, OwnerViolation)> {
    if numerics == Numerics::LlamaCpp {
        // As llama.cpp's default attention on an f16 KV cache.
        round_f16_slice(q);
    }
    let reader = pool.reader();
    let ps = pool.geometry().page_size;
    let mut found = Vec::new();
    let views: Vec<Vec<PageView<'_>>> = batch
        .iter()
        .enumerate()
        .map(|(s, b)| {
            if violated[s].is_some() {
                return Vec::new();
            }
            let pages = (b.start + b.tokens.len()).div_ceil(ps);
            let checked: Result<Vec<_>, _> = (0..pages)
                .map(|index| reader.page(b.table, index, layer.l))
                .collect();
            checked.unwrap_or_else(|e| {
                found.push((s, e));
                Vec::new()
            })
        })
        .collect();
    let mut tasks = Vec::new();
    let mut row = 0;
    let threads = rayon::current_num_threads().max(1);
    for (s, b) in batch.iter().enumerate() {
        let len = b.tokens.len();
        if !views[s].is_empty() {
            let mut r = 0;
            for rows in tile_sizes(len, c.kv_heads, threads) {
                for kv_head in 0..c.kv_heads {
                    tasks.push(Task {
                        seq: s,
                        row: row + r,
                        rows,
                        kv_head,
                    });
                }
                r += rows;
            }
        }
        row += len;
    }
    let shape = Shape {
        h: layer.h,
        hd: layer.hd,
        group: c.heads / c.kv_heads,
        ps,
        rows: layer.rows,
        softmax: Softmax {
            #[allow(clippy::cast_precision_loss)]
            scale: 1.0 / (layer.hd as f32).sqrt(),
            round_f16: numerics == Numerics::LlamaCpp,
        },
    };
    match pool.geometry().dtype {
        KvDtype::F16 => run_tiles::<half::f16>(&shape, batch, &views, &tasks, q, tiles),
        KvDtype::F32 => run_tiles::<f32>(&shape, batch, &views, &tasks, q, tiles),
    }
    // Each task's rows to their place; rows without a task are zero.
    attn.fill(0.0);
    let width = shape.group * shape.hd;
    let mut at = 0;
    for t in &tasks {
        for r in 0..t.rows {
            let dst = (t.row + r) * shape.h + t.kv_head * width;
            attn[dst..dst + width].copy_from_slice(&tiles[at..at + width]);
            at += width;
        }
    }
    found
}

/// How a chunk of `len` rows splits into tiles: at most [`TILE_ROWS`]
/// rows each, as even as possible, and (where the rows allow) so many that
/// the tasks (tiles × KV heads) keep every thread busy to the end.
fn tile_sizes(len: usize, kv_heads: usize, threads: usize) -> Vec<usize> {
    let mut tiles = len.div_ceil(TILE_ROWS).max(1);
    while !(tiles * kv_heads).is_multiple_of(threads)
        && tiles < len
        && tiles < 2 * len.div_ceil(TILE_ROWS)
    {
        tiles += 1;
    }
    if !(tiles * kv_heads).is_multiple_of(threads) {
        tiles = len.div_ceil(TILE_ROWS).max(1);
    }
    (0..tiles)
        .map(|i| len / tiles + usize::from(i < len % tiles))
        .collect()
}

/// One KV head's keys and values, page by page, as the kernel takes them.
pub(crate) type HeadSlices<'a, E> = (Vec<&'a [E]>, Vec<&'a [E]>);

/// What every attention task of a layer shares.
struct Shape<'a> {
    h: usize,
    hd: usize,
    group: usize,
    ps: usize,
    rows: &'a [(usize, usize)],
    softmax: Softmax,
}

/// Runs `tasks` in parallel, task `i`'s outputs (`rows × group × hd`) to
/// its place in `tiles`, in task order.
fn run_tiles<E: Element>(
    shape: &Shape<'_>,
    batch: &[BatchSeq<'_>],
    views: &[Vec<PageView<'_>>],
    tasks: &[Task],
    q: &[f32],
    tiles: &mut Vec<f32>,
) {
    let width = shape.group * shape.hd;
    let total: usize = tasks.iter().map(|t| t.rows * width).sum();
    let tiles = take(tiles, total);
    // Each (sequence, KV head)'s pages as slices, made once for its tasks.
    let heads: Vec<Vec<HeadSlices<'_, E>>> = views
        .iter()
        .map(|pages| {
            if pages.is_empty() {
                return Vec::new();
            }
            (0..shape.h / width)
                .map(|kvh| {
                    (
                        pages.iter().map(|v| E::slice(v.keys(kvh))).collect(),
                        pages.iter().map(|v| E::slice(v.values(kvh))).collect(),
                    )
                })
                .collect()
        })
        .collect();
    let mut outs = Vec::with_capacity(tasks.len());
    let mut rest = tiles;
    for t in tasks {
        let (out, tail) = rest.split_at_mut(t.rows * width);
        outs.push(out);
        rest = tail;
    }
    outs.into_par_iter().zip(tasks).for_each(|(out, t)| {
        let b = &batch[t.seq];
        let (keys, values) = &heads[t.seq][t.kv_head];
        // llama.cpp sums attention dot products in sgemm order for a
        // chunk of two or more tokens and in vec_dot order for one.
        let order = if b.tokens.len() > 1 {
            SumOrder::Sgemm
        } else {
            SumOrder::VecDot
        };
        let tile = QueryTile {
            q: &q[t.row * shape.h + t.kv_head * width..],
            row_stride: shape.h,
            rows: t.rows,
            group: shape.group,
            hd: shape.hd,
            first_ctx: shape.rows[t.row].1 + 1,
            order,
        };
        let pages = HeadPages {
            keys,
            values,
            width: shape.ps,
        };
        SCRATCH.with_borrow_mut(|scratch| attend_tile(&tile, &pages, shape.softmax, scratch, out));
    });
}

/// The output head over the last row of each sequence that wants logits
/// and is not violated; those sequences, in order.
fn final_logits(
    model: &ModelFile,
    batch: &[BatchSeq<'_>],
    violated: &[Option<OwnerViolation>],
    x: &[f32],
    (hn, quant): (&mut Vec<f32>, &mut QuantScratch),
    logits: &mut Vec<f32>,
) -> Vec<(usize, usize)> {
    let (c, w) = (&model.config, &model.weights);
    let h = c.hidden;
    let mut wanted = Vec::new();
    let mut last_row = 0;
    for (s, b) in batch.iter().enumerate() {
        last_row += b.tokens.len();
        if b.want_logits && violated[s].is_none() {
            wanted.push((s, last_row - 1));
        }
    }
    if !wanted.is_empty() {
        let m = wanted.len();
        let hn = take(hn, m * h);
        for (i, (_, r)) in wanted.iter().enumerate() {
            rms_norm(
                &x[r * h..(r + 1) * h],
                &w.norm,
                c.rms_eps,
                &mut hn[i * h..(i + 1) * h],
            );
        }
        let head: &Matrix = w.output.as_ref().unwrap_or(&w.embed);
        head.matmul(
            &mut Workspace::new(hn, m, h, quant),
            take(logits, m * c.vocab),
        );
    }
    wanted
}

/// Page memory of one element type, as the pool hands it out.
trait Element: KvElement {
    fn slice(data: KvData<'_>) -> &[Self];
}

impl Element for f32 {
    fn slice(data: KvData<'_>) -> &[f32] {
        match data {
            KvData::F32(s) => s,
            KvData::F16(_) => &[],
        }
    }
}

impl Element for half::f16 {
    fn slice(data: KvData<'_>) -> &[half::f16] {
        match data {
            KvData::F16(s) => s,
            KvData::F32(_) => &[],
        }
    }
}

fn norm_rows(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32], h: usize) {
    for (xr, or) in x.chunks_exact(h).zip(out.chunks_exact_mut(h)) {
        rms_norm(xr, weight, eps, or);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_cover_the_chunk_evenly_and_keep_both_threads_busy() {
        for len in 1..200 {
            let sizes = tile_sizes(len, 3, 2);
            assert_eq!(sizes.iter().sum::<usize>(), len, "{len}");
            assert!(
                sizes.iter().all(|&s| (1..=TILE_ROWS).contains(&s)),
                "{len}: {sizes:?}"
            );
            let (lo, hi) = (sizes.iter().min(), sizes.iter().max());
            assert!(hi.unwrap() - lo.unwrap() <= 1, "{len}: {sizes:?}");
            if len > 1 {
                assert_eq!(sizes.len() * 3 % 2, 0, "{len}: {sizes:?}");
            }
        }
        assert_eq!(tile_sizes(25, 3, 2), vec![7, 6, 6, 6]);
        assert_eq!(tile_sizes(1, 3, 2), vec![1]);
    }
}
