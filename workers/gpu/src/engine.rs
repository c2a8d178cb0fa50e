//! The model's forward pass on a CUDA device: the GGUF weights uploaded in
//! their own block formats (Q4_0, Q4_1, Q8_0, F32), the KV pool in device
//! memory with its owner tags ([`crate::pool`]), and greedy generation for
//! a set of prompts: each prompt's rows in one pass, then every sequence's
//! next token in one pass per step.
//!
//! Every row carries its own page table, owner and position, so a prompt's
//! rows and a decode step's rows go through the same kernels: the KV write
//! and the attention kernels check each page's tag against the row's table
//! entry before touching the page, and a refusal sets the row's error word,
//! which fails that request ([`GpuError::OwnerRefused`]), never the
//! process. Pages are scrubbed on the device when their request ends,
//! before they are free again.
//!
//! A build without the `cuda` feature has the type and the error only.

#[cfg(not(feature = "cuda"))]
use crate::GpuError;

/// What [`GpuEngine::generate`] produced and how long it took.
#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    /// Each prompt's greedy tokens.
    pub tokens: Vec<Vec<u32>>,
    /// Prompt tokens computed.
    pub prompt_tokens: usize,
    /// Seconds the prompts took (to their first tokens).
    pub prefill_secs: f64,
    /// Tokens decoded after the first ones.
    pub decoded_tokens: usize,
    /// Seconds decoding took.
    pub decode_secs: f64,
}

#[cfg(feature = "cuda")]
pub use cuda::GpuEngine;

/// The CUDA engine; this build has none ([`GpuEngine::start`] says so).
#[cfg(not(feature = "cuda"))]
#[derive(Debug)]
pub struct GpuEngine {
    never: std::convert::Infallible,
}

#[cfg(not(feature = "cuda"))]
impl GpuEngine {
    /// Always [`GpuError::NotBuilt`] in a build without the `cuda` feature.
    pub fn start(
        model: std::sync::Arc<bulkhead_engine::ModelFile>,
        ordinal: u32,
        cache: &std::path::Path,
        kv_tokens: usize,
    ) -> Result<Self, GpuError> {
        let _ = (model, ordinal, cache, kv_tokens);
        Err(GpuError::NotBuilt)
    }

    /// Unreachable: no engine exists in this build.
    pub fn generate(
        &mut self,
        prompts: &[Vec<u32>],
        max_tokens: usize,
    ) -> Result<Generated, GpuError> {
        let _ = (prompts, max_tokens);
        match self.never {}
    }
}

/// The index of the largest logit, the first of equals (greedy).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in logits.iter().enumerate() {
        if *v > logits[best] {
            best = i;
        }
    }
    u32::try_from(best).unwrap_or(u32::MAX)
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::{Generated, argmax};
    use crate::kernels::{FILES, cached};
    use crate::pool::{DeviceTable, PageBook};
    use crate::{DeviceInfo, GpuError};
    use bulkhead_engine::ModelFile;
    use bulkhead_kernels::{Matrix, WeightFormat};
    use bulkhead_kv::TenantId;
    use cudarc::driver::{
        CudaContext, CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, LaunchConfig,
        PushKernelArg,
    };
    use std::sync::Arc;
    use std::time::Instant;

    /// Tokens a KV page holds on the device.
    const PAGE_SIZE: usize = 16;

    /// Every kernel, loaded.
    struct Functions {
        attention: CudaFunction,
        kv_write: CudaFunction,
        scrub: CudaFunction,
        rms_norm: CudaFunction,
        rope: CudaFunction,
        silu_mul: CudaFunction,
        add: CudaFunction,
        q4_0: CudaFunction,
        q4_1: CudaFunction,
        q8_0: CudaFunction,
        f32: CudaFunction,
    }

    /// A weight matrix in device memory.
    struct DeviceMatrix {
        blocks: Option<(WeightFormat, CudaSlice<u8>)>,
        dense: Option<CudaSlice<f32>>,
        rows: u32,
        cols: u32,
    }

    struct DeviceLayer {
        attn_norm: CudaSlice<f32>,
        wq: DeviceMatrix,
        wk: DeviceMatrix,
        wv: DeviceMatrix,
        wo: DeviceMatrix,
        ffn_norm: CudaSlice<f32>,
        gate: DeviceMatrix,
        up: DeviceMatrix,
        down: DeviceMatrix,
    }

    /// One row of a pass: a token at a position of the sequence whose
    /// table is `tables[table]`.
    #[derive(Debug, Clone, Copy)]
    struct Row {
        table: usize,
        position: usize,
        token: u32,
    }

    /// The model on one device, with its KV pool.
    pub struct GpuEngine {
        model: Arc<ModelFile>,
        _ctx: Arc<CudaContext>,
        stream: Arc<CudaStream>,
        f: Functions,
        layers: Vec<DeviceLayer>,
        norm: CudaSlice<f32>,
        output: DeviceMatrix,
        kv: CudaSlice<u16>,
        tag_tenant: CudaSlice<u64>,
        tag_request: CudaSlice<u64>,
        tag_generation: CudaSlice<u64>,
        book: PageBook,
        page_elems: u64,
        device: u32,
        info: DeviceInfo,
        arch: String,
    }

    impl std::fmt::Debug for GpuEngine {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("GpuEngine")
                .field("device", &self.info)
                .field("arch", &self.arch)
                .finish_non_exhaustive()
        }
    }

    fn u32_of(n: usize, what: &str) -> Result<u32, GpuError> {
        u32::try_from(n).map_err(|_| GpuError::Model(format!("{what} ({n}) does not fit u32")))
    }

    /// `threads` threads in blocks of `block`.
    fn grid(threads: usize, block: u32) -> LaunchConfig {
        let blocks = threads.div_ceil(block as usize).max(1);
        LaunchConfig {
            grid_dim: (u32::try_from(blocks).unwrap_or(u32::MAX), 1, 1),
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    impl GpuEngine {
        /// Device `ordinal` with `model`'s weights and a KV pool of about
        /// `kv_tokens` tokens; its kernels' PTX cached under `cache`.
        pub fn start(
            model: Arc<ModelFile>,
            ordinal: u32,
            cache: &std::path::Path,
            kv_tokens: usize,
        ) -> Result<Self, GpuError> {
            let info = crate::open(ordinal)?;
            let arch = format!("compute_{}{}", info.major, info.minor);
            let c = model.config().clone();
            if c.head_dim > 128
                || !c.head_dim.is_multiple_of(2)
                || c.heads * c.head_dim != c.hidden
                || c.kv_heads == 0
                || !c.heads.is_multiple_of(c.kv_heads)
            {
                return Err(GpuError::Model(format!(
                    "{} heads ({} KV heads) of {} in {} hidden: the CUDA kernels take heads of at most 128 that fill the hidden size, grouped evenly over the KV heads",
                    c.heads, c.kv_heads, c.head_dim, c.hidden
                )));
            }
            let err = |e: cudarc::driver::DriverError| GpuError::Driver {
                device: ordinal,
                message: e.to_string(),
            };
            let ctx = CudaContext::new(ordinal as usize).map_err(err)?;
            let stream = ctx.default_stream();
            let mut modules = Vec::new();
            for file in &FILES {
                let ptx = cached(file, &arch, cache)?;
                modules.push(
                    ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx.ptx))
                        .map_err(err)?,
                );
            }
            let load = |m: usize, name: &str| modules[m].load_function(name).map_err(err);
            let f = Functions {
                attention: load(0, "paged_attention_decode")?,
                kv_write: load(0, "paged_kv_write")?,
                scrub: load(0, "scrub_pages")?,
                rms_norm: load(1, "rms_norm")?,
                rope: load(1, "rope")?,
                silu_mul: load(1, "silu_mul")?,
                add: load(1, "add_in_place")?,
                q4_0: load(2, "matvec_q4_0")?,
                q4_1: load(2, "matvec_q4_1")?,
                q8_0: load(2, "matvec_q8_0")?,
                f32: load(2, "matvec_f32")?,
            };
            let upload = |m: &Matrix| -> Result<DeviceMatrix, GpuError> {
                let (rows, cols) = (u32_of(m.rows(), "rows")?, u32_of(m.cols(), "columns")?);
                Ok(match m {
                    Matrix::Quant(q) => DeviceMatrix {
                        blocks: Some((
                            q.format(),
                            stream.clone_htod(&q.gguf_bytes()).map_err(err)?,
                        )),
                        dense: None,
                        rows,
                        cols,
                    },
                    Matrix::F32 { data, .. } => DeviceMatrix {
                        blocks: None,
                        dense: Some(stream.clone_htod(data).map_err(err)?),
                        rows,
                        cols,
                    },
                })
            };
            let t = model.tensors();
            let mut layers = Vec::with_capacity(t.layers.len());
            for l in &t.layers {
                layers.push(DeviceLayer {
                    attn_norm: stream.clone_htod(l.attn_norm).map_err(err)?,
                    wq: upload(l.wq)?,
                    wk: upload(l.wk)?,
                    wv: upload(l.wv)?,
                    wo: upload(l.wo)?,
                    ffn_norm: stream.clone_htod(l.ffn_norm).map_err(err)?,
                    gate: upload(l.gate)?,
                    up: upload(l.up)?,
                    down: upload(l.down)?,
                });
            }
            let norm = stream.clone_htod(t.norm).map_err(err)?;
            let output = upload(t.output)?;
            let pages = kv_tokens.div_ceil(PAGE_SIZE).max(1);
            let page_elems = c.layers * 2 * c.kv_heads * PAGE_SIZE * c.head_dim;
            let kv = stream.alloc_zeros::<u16>(pages * page_elems).map_err(err)?;
            let book = PageBook::new(pages);
            let zeros = vec![0u64; pages];
            let tag_tenant = stream.clone_htod(&zeros).map_err(err)?;
            let tag_request = stream.clone_htod(&zeros).map_err(err)?;
            let tag_generation = stream.clone_htod(&zeros).map_err(err)?;
            Ok(GpuEngine {
                model,
                _ctx: ctx,
                stream,
                f,
                layers,
                norm,
                output,
                kv,
                tag_tenant,
                tag_request,
                tag_generation,
                book,
                page_elems: page_elems as u64,
                device: ordinal,
                info,
                arch,
            })
        }

        fn driver(&self, e: cudarc::driver::DriverError) -> GpuError {
            GpuError::Driver {
                device: self.device,
                message: e.to_string(),
            }
        }

        /// The device's tags made equal to the book's.
        fn sync_tags(&mut self) -> Result<(), GpuError> {
            let tags = self.book.tags();
            let tenant: Vec<u64> = tags.iter().map(|t| t.tenant).collect();
            let request: Vec<u64> = tags.iter().map(|t| t.request).collect();
            let generation: Vec<u64> = tags.iter().map(|t| t.generation).collect();
            let s = Arc::clone(&self.stream);
            s.memcpy_htod(&tenant, &mut self.tag_tenant)
                .and_then(|()| s.memcpy_htod(&request, &mut self.tag_request))
                .and_then(|()| s.memcpy_htod(&generation, &mut self.tag_generation))
                .map_err(|e| self.driver(e))
        }

        /// Greedy generation of `max_tokens` tokens (at least one) for
        /// every prompt, each its own request with its own pages: the
        /// prompts one pass each, then one pass per step for all of them.
        pub fn generate(
            &mut self,
            prompts: &[Vec<u32>],
            max_tokens: usize,
        ) -> Result<Generated, GpuError> {
            let max_tokens = max_tokens.max(1);
            let window = self.model.config().context_window;
            let mut tables = Vec::with_capacity(prompts.len());
            for (i, p) in prompts.iter().enumerate() {
                if p.is_empty() || p.len() + max_tokens > window {
                    self.release(tables)?;
                    return Err(GpuError::Model(format!(
                        "prompt {i} of {} tokens plus {max_tokens} to generate does not fit the {window}-token window",
                        p.len()
                    )));
                }
                let pages = (p.len() + max_tokens).div_ceil(PAGE_SIZE);
                match self.book.allocate(TenantId::new(1 + i as u64), pages) {
                    Ok(t) => tables.push(t),
                    Err(full) => {
                        self.release(tables)?;
                        return Err(GpuError::Pool(full));
                    }
                }
            }
            if let Err(e) = self.sync_tags() {
                self.release(tables)?;
                return Err(e);
            }
            let ran = self.run(prompts, max_tokens, &tables);
            self.release(tables)?;
            ran
        }

        fn run(
            &mut self,
            prompts: &[Vec<u32>],
            max_tokens: usize,
            tables: &[DeviceTable],
        ) -> Result<Generated, GpuError> {
            let vocab = self.model.config().vocab;
            let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
            let started = Instant::now();
            for (i, p) in prompts.iter().enumerate() {
                let rows: Vec<Row> = p
                    .iter()
                    .enumerate()
                    .map(|(position, &token)| Row {
                        table: i,
                        position,
                        token,
                    })
                    .collect();
                let logits = self.forward(&rows, tables, true)?;
                tokens[i].push(argmax(&logits[..vocab]));
            }
            let prefill_secs = started.elapsed().as_secs_f64();
            let started = Instant::now();
            for step in 1..max_tokens {
                let rows: Vec<Row> = prompts
                    .iter()
                    .enumerate()
                    .map(|(i, p)| Row {
                        table: i,
                        position: p.len() + step - 1,
                        token: tokens[i][step - 1],
                    })
                    .collect();
                let logits = self.forward(&rows, tables, false)?;
                for (i, out) in tokens.iter_mut().enumerate() {
                    out.push(argmax(&logits[i * vocab..(i + 1) * vocab]));
                }
            }
            Ok(Generated {
                tokens,
                prompt_tokens: prompts.iter().map(Vec::len).sum(),
                prefill_secs,
                decoded_tokens: prompts.len() * (max_tokens - 1),
                decode_secs: started.elapsed().as_secs_f64(),
            })
        }

        /// Ends every allocation in `tables`: tags freed, pages scrubbed on
        /// the device, then free again.
        fn release(&mut self, tables: Vec<DeviceTable>) -> Result<(), GpuError> {
            let pages: Vec<u32> = tables
                .into_iter()
                .flat_map(|t| self.book.release(t))
                .collect();
            self.sync_tags()?;
            if !pages.is_empty() {
                let list = self.stream.clone_htod(&pages).map_err(|e| self.driver(e))?;
                let count = u32_of(pages.len(), "pages")?;
                let mut b = self.stream.launch_builder(&self.f.scrub);
                b.arg(&mut self.kv)
                    .arg(&list)
                    .arg(&count)
                    .arg(&self.page_elems);
                let cfg = grid(pages.len() * self.page_elems as usize, 256);
                // SAFETY: the kernel's arguments in its order; `list` holds
                // `count` pages of the pool, each `page_elems` long.
                #[allow(unsafe_code)]
                unsafe { b.launch(cfg) }.map_err(|e| self.driver(e))?;
                self.stream.synchronize().map_err(|e| self.driver(e))?;
            }
            self.book.scrubbed(pages);
            Ok(())
        }

        /// `out = m · x` for `xs` rows of `x`.
        fn matvec(
            &self,
            m: &DeviceMatrix,
            x: &CudaView<'_, f32>,
            xs: u32,
            out: &mut CudaViewMut<'_, f32>,
        ) -> Result<(), GpuError> {
            let f = match &m.blocks {
                Some((WeightFormat::Q4_0, _)) => &self.f.q4_0,
                Some((WeightFormat::Q4_1, _)) => &self.f.q4_1,
                Some((WeightFormat::Q8_0, _)) => &self.f.q8_0,
                None => &self.f.f32,
            };
            let mut b = self.stream.launch_builder(f);
            b.arg(out);
            match (&m.blocks, &m.dense) {
                (Some((_, data)), _) => b.arg(data),
                (None, Some(data)) => b.arg(data),
                (None, None) => return Err(GpuError::Model("a matrix without data".to_owned())),
            };
            b.arg(x).arg(&m.rows).arg(&m.cols).arg(&xs);
            let cfg = grid(m.rows as usize * xs as usize * 32, 128);
            // SAFETY: the kernel's arguments in its order; `x` holds `xs`
            // rows of `cols`, `out` `xs` rows of `rows`.
            #[allow(unsafe_code)]
            unsafe { b.launch(cfg) }.map_err(|e| self.driver(e))?;
            Ok(())
        }

        /// One pass over `rows`; the logits of the last row (`last_only`)
        /// or of every row, row-major. A row whose page was refused fails
        /// the pass with [`GpuError::OwnerRefused`].
        #[allow(clippy::too_many_lines)]
        fn forward(
            &mut self,
            rows: &[Row],
            tables: &[DeviceTable],
            last_only: bool,
        ) -> Result<Vec<f32>, GpuError> {
            let c = self.model.config().clone();
            let (n, h, hd) = (rows.len(), c.hidden, c.head_dim);
            let kvd = c.kv_heads * hd;
            let max_pages = tables.iter().map(|t| t.pages.len()).max().unwrap_or(1);
            // Per row: its table (entries past a table's end expect a
            // generation no page has), owner, position.
            let mut table = vec![0u32; n * max_pages];
            let mut want_gen = vec![u64::MAX; n * max_pages];
            let (mut tenant, mut request) = (vec![0u64; n], vec![0u64; n]);
            let (mut position, mut context) = (vec![0u32; n], vec![0u32; n]);
            let mut x = vec![0f32; n * h];
            let embed = self.model.tensors().embed;
            for (r, row) in rows.iter().enumerate() {
                let t = &tables[row.table];
                table[r * max_pages..][..t.pages.len()].copy_from_slice(&t.pages);
                want_gen[r * max_pages..][..t.generations.len()].copy_from_slice(&t.generations);
                tenant[r] = t.tenant;
                request[r] = t.request;
                position[r] = u32_of(row.position, "position")?;
                context[r] = position[r] + 1;
                if row.token as usize >= embed.rows() {
                    return Err(GpuError::Model(format!(
                        "token {} is not in the vocabulary",
                        row.token
                    )));
                }
                embed.row_f32(row.token as usize, &mut x[r * h..(r + 1) * h]);
            }
            let s = Arc::clone(&self.stream);
            let e = |e: cudarc::driver::DriverError| GpuError::Driver {
                device: self.device,
                message: e.to_string(),
            };
            let table = s.clone_htod(&table).map_err(e)?;
            let want_gen = s.clone_htod(&want_gen).map_err(e)?;
            let tenant = s.clone_htod(&tenant).map_err(e)?;
            let request = s.clone_htod(&request).map_err(e)?;
            let position = s.clone_htod(&position).map_err(e)?;
            let context = s.clone_htod(&context).map_err(e)?;
            let mut error = s.alloc_zeros::<u32>(n).map_err(e)?;
            let mut x = s.clone_htod(&x).map_err(e)?;
            let mut xn = s.alloc_zeros::<f32>(n * h).map_err(e)?;
            let mut q = s.alloc_zeros::<f32>(n * h).map_err(e)?;
            let mut k = s.alloc_zeros::<f32>(n * kvd).map_err(e)?;
            let mut v = s.alloc_zeros::<f32>(n * kvd).map_err(e)?;
            let mut attn = s.alloc_zeros::<f32>(n * h).map_err(e)?;
            let mut o = s.alloc_zeros::<f32>(n * h).map_err(e)?;
            let mut gate = s.alloc_zeros::<f32>(n * c.ffn).map_err(e)?;
            let mut up = s.alloc_zeros::<f32>(n * c.ffn).map_err(e)?;

            let (nr, h32, hd32) = (
                u32_of(n, "rows")?,
                u32_of(h, "hidden")?,
                u32_of(hd, "head")?,
            );
            let (heads, kv_heads) = (u32_of(c.heads, "heads")?, u32_of(c.kv_heads, "kv heads")?);
            let (layers, page, mp) = (
                u32_of(c.layers, "layers")?,
                u32_of(PAGE_SIZE, "page")?,
                u32_of(max_pages, "pages")?,
            );
            let (eps, theta) = (c.rms_eps, c.rope_base);
            #[allow(clippy::cast_precision_loss)]
            let scale = 1.0f32 / (hd as f32).sqrt();
            let norm_cfg = LaunchConfig {
                grid_dim: (nr, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let (nh, nffn) = ((n * h) as u64, (n * c.ffn) as u64);
            // One kernel launch: the builder, its arguments, the launch.
            macro_rules! launch {
                ($f:expr, $cfg:expr; $($a:expr),+ $(,)?) => {{
                    let mut b = s.launch_builder($f);
                    $( b.arg($a); )+
                    // SAFETY: each kernel's arguments in its order, every
                    // buffer sized for `n` rows as the kernel indexes it;
                    // tables hold `max_pages` entries per row.
                    #[allow(unsafe_code)]
                    unsafe { b.launch($cfg) }.map_err(e)?;
                }};
            }
            for (l, lw) in self.layers.iter().enumerate() {
                let l32 = u32_of(l, "layer")?;
                launch!(&self.f.rms_norm, norm_cfg; &mut xn, &x, &lw.attn_norm, &h32, &eps);
                self.matvec(&lw.wq, &xn.slice(..), nr, &mut q.slice_mut(..))?;
                self.matvec(&lw.wk, &xn.slice(..), nr, &mut k.slice_mut(..))?;
                self.matvec(&lw.wv, &xn.slice(..), nr, &mut v.slice_mut(..))?;
                launch!(&self.f.rope, grid(n * c.heads * hd / 2, 128);
                    &mut q, &position, &nr, &heads, &hd32, &theta);
                launch!(&self.f.rope, grid(n * c.kv_heads * hd / 2, 128);
                    &mut k, &position, &nr, &kv_heads, &hd32, &theta);
                launch!(&self.f.kv_write, grid(n * kvd, 128);
                    &mut self.kv, &k, &v,
                    &self.tag_tenant, &self.tag_request, &self.tag_generation,
                    &table, &want_gen, &tenant, &request, &position, &mut error,
                    &nr, &kv_heads, &hd32, &l32, &layers, &page, &mp);
                launch!(&self.f.attention, grid(n * c.heads * 32, 128);
                    &mut attn, &q, &self.kv,
                    &self.tag_tenant, &self.tag_request, &self.tag_generation,
                    &table, &want_gen, &tenant, &request, &context, &mut error,
                    &nr, &heads, &kv_heads, &hd32, &l32, &layers, &page, &mp, &scale);
                self.matvec(&lw.wo, &attn.slice(..), nr, &mut o.slice_mut(..))?;
                launch!(&self.f.add, grid(n * h, 256); &mut x, &o, &nh);

                launch!(&self.f.rms_norm, norm_cfg; &mut xn, &x, &lw.ffn_norm, &h32, &eps);
                self.matvec(&lw.gate, &xn.slice(..), nr, &mut gate.slice_mut(..))?;
                self.matvec(&lw.up, &xn.slice(..), nr, &mut up.slice_mut(..))?;
                launch!(&self.f.silu_mul, grid(n * c.ffn, 256); &mut gate, &up, &nffn);
                self.matvec(&lw.down, &gate.slice(..), nr, &mut o.slice_mut(..))?;
                launch!(&self.f.add, grid(n * h, 256); &mut x, &o, &nh);
            }
            launch!(&self.f.rms_norm, norm_cfg; &mut xn, &x, &self.norm, &h32, &eps);
            let (from, xs) = if last_only { (n - 1, 1) } else { (0, nr) };
            let mut logits = s.alloc_zeros::<f32>(xs as usize * c.vocab).map_err(e)?;
            self.matvec(
                &self.output,
                &xn.slice(from * h..),
                xs,
                &mut logits.slice_mut(..),
            )?;
            let words = s.clone_dtoh(&error).map_err(e)?;
            s.synchronize().map_err(e)?;
            if let Some((row, &word)) = words.iter().enumerate().find(|(_, w)| **w != 0) {
                return Err(GpuError::OwnerRefused {
                    sequence: rows[row].table,
                    entry: word - 1,
                });
            }
            s.clone_dtoh(&logits).map_err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_first_of_equal_maxima() {
        assert_eq!(argmax(&[0.5, 2.0, -1.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NEG_INFINITY, -3.0]), 1);
        assert_eq!(argmax(&[1.0]), 0);
    }
}
