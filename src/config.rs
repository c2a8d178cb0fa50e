//! Configuration the subcommands share, read once: the model and engine
//! flags, where the default model comes from, and the telemetry settings,
//! from this process's arguments and environment. Besides the flags' own
//! `env = ...` fallbacks (read by the argument parser), this file is the
//! one place the binary reads its environment (`tests/layout.rs` checks).

use anyhow::Context;
use bulkhead_engine::fetch;
use clap::Args;
use std::path::PathBuf;

/// Model and engine flags shared by the subcommands that run the model.
#[derive(Debug, Args)]
pub(crate) struct ModelArgs {
    /// A LLaMA-architecture GGUF file; default: the verified SmolLM2-135M-Instruct Q4_1.
    #[arg(long)]
    pub(crate) model: Option<PathBuf>,
    /// Convert the weights at load: `q8_0` quantizes every quantized matrix
    /// again to Q8_0 (a variant of the same model, served under its own slug).
    #[arg(long, value_parser = ["q8_0"])]
    pub(crate) quantize: Option<String>,
    /// KV pool memory budget in MiB.
    #[arg(long, default_value_t = 1024)]
    pub(crate) kv_budget_mib: usize,
    /// Compute threads (default: one per core).
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// Tokens per KV page.
    #[arg(long, default_value_t = 16)]
    pub(crate) page_size: usize,
    /// Zero KV pages when they are freed.
    #[arg(long)]
    pub(crate) scrub_on_free: bool,
    /// Keep no prompt pages for reuse by later prompts of the same tenant.
    #[arg(long)]
    pub(crate) no_prefix_cache: bool,
    /// Longest a prompt may take to prefill alone at the speed measured at
    /// start; longer prompts are refused at admission (4xx).
    #[arg(long, default_value_t = 60)]
    pub(crate) prefill_deadline_secs: u64,
    /// About how long one engine step may take (bounds how long a new
    /// request waits for its turn).
    #[arg(long, env = "BULKHEAD_STEP_MS", default_value_t = 200)]
    pub(crate) step_ms: u64,
    /// A decode worker computes a prompt itself, instead of landing it from
    /// its prefill worker, when at most this many of its tokens are not in
    /// its prefix cache (0: only a short suffix of a cached prompt).
    #[arg(long, env = "BULKHEAD_LOCAL_PREFILL_TOKENS", default_value_t = 64)]
    pub(crate) local_prefill_tokens: usize,
    /// Percent of the KV pool one tenant may hold while another waits.
    #[arg(long, default_value_t = 50)]
    pub(crate) tenant_share_percent: usize,
    /// Where the model runs: `cpu`, or `cuda` / `cuda:N` (a build with
    /// `--features cuda` and an NVIDIA driver).
    #[arg(long, default_value = "cpu")]
    pub(crate) device: bulkhead_gpu::DeviceKind,
    /// Testing only: every request after this many answers wrong (the leak
    /// prober's test). Refused unless built with the test-hooks feature.
    #[arg(long, hide = true)]
    pub(crate) corrupt_answers_after: Option<u64>,
    /// Testing and benchmarks only: run the kernels at most this wide
    /// (`avx2` on an AVX-512 machine is the path AVX2-only CPUs take). From
    /// the environment too, so `up` and `bench serving` pass it to every
    /// worker they start. Refused unless built with the test-hooks feature.
    #[arg(long, hide = true, env = "BULKHEAD_SIMD_CAP", value_parser = ["avx512", "avx2", "scalar"])]
    pub(crate) simd_cap: Option<String>,
    /// A compute gate file (`up` gives one): the engine holds it while it
    /// computes, and background work on this host that waits at it (the
    /// embedding worker's `--compute-gate`) computes only while no engine
    /// does.
    #[arg(long)]
    pub(crate) compute_gate: Option<PathBuf>,
}

impl ModelArgs {
    /// Refuses, in one sentence and before anything loads, a device this
    /// build or machine cannot run on.
    pub(crate) fn check_device(&self) -> anyhow::Result<()> {
        match self.device {
            bulkhead_gpu::DeviceKind::Cpu => Ok(()),
            bulkhead_gpu::DeviceKind::Cuda(n) => {
                let found = bulkhead_gpu::open(n)?;
                Err(bulkhead_gpu::GpuError::NoEngine {
                    name: found.name,
                    major: found.major,
                    minor: found.minor,
                }
                .into())
            }
        }
    }

    /// The model file to load: `--model`, or the default one, fetched if missing.
    pub(crate) fn path(&self) -> anyhow::Result<PathBuf> {
        match &self.model {
            Some(p) => Ok(p.clone()),
            None => fetch::ensure_default_model(&model_source(true))
                .context("fetching the default model"),
        }
    }

    /// The model file loaded (and converted, with `--quantize`), and its path.
    pub(crate) fn load(&self) -> anyhow::Result<(bulkhead_engine::ModelFile, PathBuf)> {
        self.check_device()?;
        self.load_file()
    }

    /// [`ModelArgs::load`] without the device check (for `generate`, whose
    /// CUDA path has its own).
    pub(crate) fn load_file(&self) -> anyhow::Result<(bulkhead_engine::ModelFile, PathBuf)> {
        if let Some(level) = &self.simd_cap {
            cap_simd(level)?;
        }
        let path = self.path()?;
        let file = bulkhead_engine::ModelFile::load(&path)
            .with_context(|| format!("loading {}", path.display()))?;
        let file = match self.quantize.as_deref() {
            Some("q8_0") => file.requantized_q8_0(),
            _ => file,
        };
        Ok((file, path))
    }

    /// The engine configuration these flags describe.
    pub(crate) fn engine_config(&self) -> bulkhead_engine::EngineConfig {
        let mut c = bulkhead_engine::EngineConfig::with_budget(self.kv_budget_mib << 20);
        if let Some(t) = self.threads {
            c.threads = t.max(1);
        }
        c.page_size = self.page_size;
        c.scrub_on_free = self.scrub_on_free;
        c.prefix_cache = !self.no_prefix_cache;
        c.local_prefill_tokens = self.local_prefill_tokens;
        c.prefill_deadline = std::time::Duration::from_secs(self.prefill_deadline_secs.max(1));
        c.step_time = std::time::Duration::from_millis(self.step_ms.max(1));
        c.tenant_share_percent = self.tenant_share_percent.clamp(1, 100);
        c.corrupt_answers_after = self.corrupt_answers_after;
        c.compute_gate.clone_from(&self.compute_gate);
        c
    }
}

/// Caps the kernels at `level` (`avx512`, `avx2`, `scalar`) in a test or
/// benchmark build; refused in a serving build.
pub(crate) fn cap_simd(level: &str) -> anyhow::Result<()> {
    use bulkhead_engine::SimdLevel;
    bulkhead_engine::hooks::cap_simd(match level {
        "scalar" => SimdLevel::Scalar,
        "avx2" => SimdLevel::Avx2,
        _ => SimdLevel::Avx512,
    })?;
    Ok(())
}

/// Where the default model comes from, as this process's environment says
/// (`BULKHEAD_MODEL_DIR`, `XDG_CACHE_HOME`, `HOME`, `BULKHEAD_PYTHON`);
/// with `show`, each step on stderr.
pub(crate) fn model_source(show: bool) -> fetch::Source {
    let progress = if show {
        fetch::Progress::Show(|step| eprintln!("{step}"))
    } else {
        fetch::Progress::Quiet
    };
    fetch::Source::from_vars(|k| std::env::var_os(k), progress)
}

/// The telemetry settings of this process's environment (OpenTelemetry's
/// variables, `RUST_LOG`, `BULKHEAD_LOG_FORMAT`, `BULKHEAD_TRACE_POLLS`):
/// the one place the binary reads them.
pub(crate) fn telemetry_settings() -> bulkhead_telemetry::Settings {
    bulkhead_telemetry::Settings::from_vars(|k| std::env::var(k).ok())
}

/// The Python that benchmarks run llama-cpp-python with
/// (`BULKHEAD_PYTHON`, default `python3`).
pub(crate) fn python() -> std::ffi::OsString {
    std::env::var_os("BULKHEAD_PYTHON").unwrap_or_else(|| "python3".into())
}

/// A secret a component takes from its environment only (never from its
/// command line, which every local user can read): `name`'s value.
pub(crate) fn secret(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}
