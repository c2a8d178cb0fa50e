//! `bulkhead serve`, `bulkhead prefill` and `bulkhead decode`: worker
//! processes. Configuration is parsed and the model loaded before any port
//! is bound; each prints one `listening ...` line once it accepts.
//!
//! The three roles share one `WorkerArgs` (identity, metrics port,
//! registration, model) and one `go_live` (register, start the metrics, print
//! the listening line).

use crate::config::ModelArgs;
use crate::platform::register::{Announcement, Capacity, RegisterArgs, engine_load};
use anyhow::Context;
use bulkhead_control_api::NodeRole;
use bulkhead_engine::Engine;
use bulkhead_node::{
    ContextCheck, DecodeOptions, DecodeWorker, LinkFault, PrefillOptions, PrefillWorker, Role,
    TransportKind, app, hello,
};
use bulkhead_worker_api::context::VerifyingKeys;
use clap::Args;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

use crate::tls::TlsArgs;
use bulkhead_trust::{Identity, Peer, Role as CertRole, TlsListener};

/// The worker API's port: mutual TLS admitting the gateway (which
/// generates) and operators' tools (stats, metrics, aborts).
pub(crate) fn worker_api(http: TcpListener, identity: &Identity) -> anyhow::Result<TlsListener> {
    let acceptor = identity.acceptor(&[CertRole::Gateway, CertRole::Operator])?;
    Ok(TlsListener::new(http, acceptor)?)
}

/// Serves `router` on `listener`, each request knowing its caller's role.
pub(crate) async fn serve_api(listener: TlsListener, router: axum::Router) -> std::io::Result<()> {
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<Peer>(),
    )
    .with_graceful_shutdown(crate::process::shutdown())
    .await
}

/// What every worker role takes: its identity, metrics port, registration
/// and model.
#[derive(Debug, Args)]
pub(crate) struct WorkerArgs {
    #[command(flatten)]
    tls: TlsArgs,
    #[command(flatten)]
    metrics_listen: crate::process::MetricsArgs,
    #[command(flatten)]
    register: RegisterArgs,
    #[command(flatten)]
    model: ModelArgs,
}

/// A worker about to take requests: what it announces.
struct Live<'a> {
    role: NodeRole,
    identity: &'a Identity,
    engine: &'a Arc<Engine>,
    weights: &'a std::path::Path,
    http: &'a TcpListener,
    transfer: Option<&'a TcpListener>,
    prefills: Option<tokio::sync::watch::Sender<Vec<String>>>,
}

impl WorkerArgs {
    /// This worker's certificate of `role`, for its model.
    fn identity(&self, role: CertRole) -> anyhow::Result<Identity> {
        self.tls
            .load_worker(role, self.register.model_slug().as_str())
    }

    /// Registers with the control plane (when there is one), starts the
    /// metrics port and the worker's metrics, and prints the listening
    /// line.
    async fn go_live(&self, live: Live<'_>, worker: &Role) -> anyhow::Result<()> {
        let http = live.http.local_addr()?;
        let transfer = live.transfer.map(TcpListener::local_addr).transpose()?;
        self.register
            .register(Announcement {
                identity: live.identity,
                role: live.role,
                capacity: Capacity::of_engine(live.engine)?,
                load: engine_load(live.engine),
                weights: live.weights,
                kv_budget_bytes: budget_bytes(&self.model),
                address: self.register.advertised(http),
                transfer_address: transfer.map(|t| self.register.advertised(t)),
                prefills: live.prefills,
            })
            .await?;
        let metrics_line = self.metrics_listen.start().await?;
        let command = match live.role {
            NodeRole::Colocated => "serve",
            NodeRole::Prefill => "prefill",
            NodeRole::Decode => "decode",
        };
        let transfer = transfer.map_or(String::new(), |t| format!("transfer={t} "));
        announce(&format!(
            "bulkhead {command}: listening {transfer}http={http}{metrics_line}"
        ));
        metrics(worker, &self.register, live.role, live.http)
    }
}

/// Flags of `bulkhead serve` (colocated worker).
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// HTTP address of the worker API.
    #[arg(long, default_value = "127.0.0.1:8081")]
    http: String,
    /// A prefix every tenant's prompts may start with (raw text as the
    /// model sees it, e.g. a system prompt rendered by the chat template),
    /// computed once at start and cached for all tenants of the model;
    /// what follows it stays each tenant's own.
    #[arg(long)]
    shared_prefix_file: Option<PathBuf>,
    #[command(flatten)]
    worker: WorkerArgs,
}

/// How KV pages travel between prefill and decode workers.
#[derive(Debug, Args)]
pub(crate) struct TransportArgs {
    /// `tcp` (default) or `rdma` (needs a build with `--features rdma` and an RDMA device).
    #[arg(long, default_value = "tcp", value_parser = ["tcp", "rdma"])]
    transport: String,
    /// RDMA device name (default: the first one).
    #[arg(long)]
    rdma_device: Option<String>,
}

impl TransportArgs {
    /// The transport, checked against this build and host before any port is bound.
    fn kind(&self) -> anyhow::Result<TransportKind> {
        let kind = match self.transport.as_str() {
            "rdma" => TransportKind::Rdma {
                device: self.rdma_device.clone(),
            },
            _ => TransportKind::Tcp,
        };
        kind.check()
            .map_err(|e| anyhow::anyhow!("--transport rdma: {e}"))?;
        Ok(kind)
    }
}

/// Flags of `bulkhead prefill`.
#[derive(Debug, Args)]
pub(crate) struct PrefillArgs {
    /// Address decode workers connect to for KV transfers.
    #[arg(long, default_value = "127.0.0.1:9100")]
    listen: String,
    /// HTTP address for /health, /stats, /metrics and /admin/abort.
    #[arg(long, default_value = "127.0.0.1:9101")]
    http: String,
    /// Longest one frame write may block on a decode worker that does not read.
    #[arg(long, default_value_t = 30_000)]
    write_timeout_ms: u64,
    /// Testing only: wait this long before every frame sent (a slow link).
    /// Refused unless built with the test-hooks feature (`cargo test` builds).
    #[arg(long, hide = true)]
    page_delay_ms: Option<u64>,
    /// Testing only: break this percent of the page frames sent (the chaos
    /// soak). Refused unless built with the test-hooks feature.
    #[arg(long, hide = true)]
    frame_faults_percent: Option<u8>,
    #[command(flatten)]
    transport: TransportArgs,
    #[command(flatten)]
    worker: WorkerArgs,
}

/// Flags of `bulkhead decode`.
#[derive(Debug, Args)]
pub(crate) struct DecodeArgs {
    /// HTTP address of the worker API.
    #[arg(long, default_value = "127.0.0.1:8082")]
    http: String,
    /// Pin a prefill worker by its transfer address (repeat for several).
    /// Without it, a decode worker given `--control-plane` links to every
    /// routable prefill worker of its model the control plane names (and
    /// follows changes); one given neither uses 127.0.0.1:9100.
    #[arg(long)]
    prefill: Vec<String>,
    /// Longest a transfer may go without a sign of life (the prefill
    /// worker reports progress after every step) before it is aborted.
    #[arg(long, default_value_t = 60_000)]
    transfer_timeout_ms: u64,
    /// Longest to wait for an abort's acknowledgement before closing the connection.
    #[arg(long, default_value_t = 10_000)]
    ack_timeout_ms: u64,
    #[command(flatten)]
    transport: TransportArgs,
    #[command(flatten)]
    worker: WorkerArgs,
}

/// The worker's context check, metering every call it admits, and the
/// reporter of that usage (to the control plane, when there is one).
pub(crate) fn metered(
    tls: &TlsArgs,
    register: &RegisterArgs,
    identity: &bulkhead_trust::Identity,
) -> anyhow::Result<(Arc<ContextCheck>, UsageReporter)> {
    let slug = register.model_slug().as_str();
    let (sink, rx) = bulkhead_node::usage::UsageSink::new();
    let contexts = ContextCheck::metered(tls.verifying_keys()?, slug, sink);
    Ok((
        contexts,
        UsageReporter(register.client(identity)?.map(|c| (rx, c))),
    ))
}

/// Usage records and the client they are reported through.
pub(crate) struct UsageReporter(
    Option<(
        tokio::sync::mpsc::UnboundedReceiver<bulkhead_node::usage::UsageRecord>,
        bulkhead_control_api::Client,
    )>,
);

impl UsageReporter {
    /// Starts reporting (on the current runtime). Without a control plane
    /// the records are counted in metrics only.
    pub(crate) fn start(self) {
        if let Some((rx, client)) = self.0 {
            tokio::spawn(crate::platform::usage_report::run(rx, client));
        }
    }
}

/// A started engine and the weights file it loaded.
fn load(model: &ModelArgs) -> anyhow::Result<(Arc<Engine>, PathBuf)> {
    let (file, path) = model.load()?;
    let config = model.engine_config();
    tracing::info!(
        target: "bulkhead::worker",
        kernels = ?bulkhead_engine::simd_level(),
        threads = config.threads,
        "engine starting"
    );
    Ok((Arc::new(Engine::start(Arc::new(file), &config)?), path))
}

fn budget_bytes(model: &ModelArgs) -> u64 {
    (model.kv_budget_mib as u64) << 20
}

pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

pub(crate) fn announce(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Registers the worker's instruments under its node name.
fn metrics(
    role: &Role,
    register: &RegisterArgs,
    kind: NodeRole,
    http: &TcpListener,
) -> anyhow::Result<()> {
    let node = register.node_name(kind, &register.advertised(http.local_addr()?));
    bulkhead_node::gauges::register(role, &node);
    Ok(())
}

pub(crate) fn serve(args: &ServeArgs) -> anyhow::Result<()> {
    let w = &args.worker;
    w.model.check_device()?;
    let identity = w.identity(CertRole::Colocated)?;
    let (contexts, usage) = metered(&w.tls, &w.register, &identity)?;
    let (engine, weights) = load(&w.model)?;
    if let Some(path) = &args.shared_prefix_file {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let slug = w.register.model_slug();
        let tokens = bulkhead_node::prefix::publish_shared(&engine, slug.as_str(), &text)?;
        announce(&format!(
            "bulkhead serve: shared prefix of {tokens} tokens cached for every tenant of {}",
            slug.as_str()
        ));
    }
    runtime()?.block_on(async {
        usage.start();
        let http = crate::process::bind(&args.http).await?;
        let role = Role::Colocated(Arc::clone(&engine));
        let live = Live {
            role: NodeRole::Colocated,
            identity: &identity,
            engine: &engine,
            weights: &weights,
            http: &http,
            transfer: None,
            prefills: None,
        };
        w.go_live(live, &role).await?;
        serve_api(worker_api(http, &identity)?, app(role, contexts)).await?;
        Ok(())
    })
}

pub(crate) fn prefill(args: &PrefillArgs) -> anyhow::Result<()> {
    args.worker.model.check_device()?;
    let transport = args.transport.kind()?;
    let mut options = PrefillOptions::new(
        Duration::from_millis(args.write_timeout_ms.max(1)),
        transport,
    );
    // A slowed link wins over broken frames when both are asked for.
    let slow = args
        .page_delay_ms
        .map(|ms| LinkFault::Slow(Duration::from_millis(ms)));
    if let Some(fault) = slow.or(args.frame_faults_percent.map(LinkFault::Broken)) {
        options.sabotage(fault)?;
    }
    let w = &args.worker;
    // Every request carries the gateway's context of its call: the tenant
    // and the cache scope come from it alone.
    options.contexts = bulkhead_node::prefill::ContextKeys::new(
        w.tls.verifying_keys()?,
        w.register.model_slug().as_str(),
    );
    let identity = w.identity(CertRole::Prefill)?;
    let (engine, weights) = load(&w.model)?;
    let hello = hello(&engine, &options.transport);
    let worker = PrefillWorker::new(Arc::clone(&engine), hello, options);
    runtime()?.block_on(async {
        let listen = crate::process::bind(&args.listen).await?;
        let http = crate::process::bind(&args.http).await?;
        let role = Role::Prefill(worker.clone());
        let live = Live {
            role: NodeRole::Prefill,
            identity: &identity,
            engine: &engine,
            weights: &weights,
            http: &http,
            transfer: Some(&listen),
            prefills: None,
        };
        w.go_live(live, &role).await?;
        let api = worker_api(http, &identity)?;
        // A prefill worker serves no generate calls (the route is not even
        // there); its check holds a key no gateway has.
        let none = ContextCheck::new(VerifyingKeys::none(), "");
        tokio::spawn(serve_api(api, app(role, none)));
        // Transfers: only decode workers' certificates.
        let listen = TlsListener::new(listen, identity.acceptor(&[CertRole::Decode])?)?;
        tokio::select! {
            r = worker.serve(listen) => r?,
            () = crate::process::shutdown() => {}
        }
        Ok(())
    })
}

pub(crate) fn decode(args: &DecodeArgs) -> anyhow::Result<()> {
    args.worker.model.check_device()?;
    let transport = args.transport.kind()?;
    let w = &args.worker;
    let identity = w.identity(CertRole::Decode)?;
    let (contexts, usage) = metered(&w.tls, &w.register, &identity)?;
    let (engine, weights) = load(&w.model)?;
    let hello = hello(&engine, &transport);
    // Pinned, else discovered through the control plane, else the default.
    let discover = args.prefill.is_empty() && w.register.has_control_plane();
    let pinned = if !args.prefill.is_empty() {
        args.prefill.clone()
    } else if discover {
        Vec::new()
    } else {
        vec!["127.0.0.1:9100".to_owned()]
    };
    let options = DecodeOptions {
        prefill: pinned.clone(),
        transfer_timeout: Duration::from_millis(args.transfer_timeout_ms.max(1)),
        ack_timeout: Duration::from_millis(args.ack_timeout_ms.max(1)),
        transport,
        identity: identity.clone(),
        model: w.register.model_slug().as_str().to_owned(),
    };
    runtime()?.block_on(async {
        usage.start();
        let worker = DecodeWorker::start(Arc::clone(&engine), hello, options);
        let http = crate::process::bind(&args.http).await?;
        if !discover && !worker.ready(Duration::from_secs(30)).await {
            anyhow::bail!(
                "no compatible prefill worker answered at {} within 30 s",
                pinned.join(", ")
            );
        }
        let prefills = discover.then(|| {
            let (tx, mut rx) = tokio::sync::watch::channel(Vec::new());
            let fleet = worker.clone();
            tokio::spawn(async move {
                while rx.changed().await.is_ok() {
                    let addrs = rx.borrow_and_update().clone();
                    fleet.set_prefills(&addrs);
                }
            });
            tx
        });
        // A discovering worker announces at once: its prefill workers may
        // become routable only later (a config change), and until one is
        // linked its requests get 503, which a gateway sends elsewhere.
        let role = Role::Decode(worker);
        let live = Live {
            role: NodeRole::Decode,
            identity: &identity,
            engine: &engine,
            weights: &weights,
            http: &http,
            transfer: None,
            prefills,
        };
        w.go_live(live, &role).await?;
        serve_api(worker_api(http, &identity)?, app(role, contexts)).await?;
        Ok(())
    })
}
