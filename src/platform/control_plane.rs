//! `bulkhead control-plane`: runs the control plane (admin API, status page
//! and feeds) over SQLite in the data directory, or PostgreSQL when
//! `DATABASE_URL` names one; and `bulkhead control-plane token create`, which
//! mints an operator token straight in the database (the first admin token
//! has no one to ask for it).

use anyhow::Context;
use bulkhead_control_api::{Role, Timestamp};
use bulkhead_control_plane::{AppState, Db, Settings, app, store};
use clap::{Args, Subcommand};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Flags of `bulkhead control-plane`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct ControlPlaneArgs {
    #[command(subcommand)]
    command: Option<ControlPlaneCommand>,
    #[command(flatten)]
    serve: ServeFlags,
}

#[derive(Debug, Subcommand)]
enum ControlPlaneCommand {
    /// Operator tokens.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Create an operator and print its token (shown once; only its hash is stored).
    Create {
        /// Operator name; the audit log's actor.
        #[arg(long)]
        name: String,
        /// responder, admin or node.
        #[arg(long)]
        role: Role,
        #[command(flatten)]
        db: DbFlags,
    },
}

/// Where the database is.
#[derive(Debug, Args)]
pub(crate) struct DbFlags {
    /// PostgreSQL (postgres://…) or SQLite (sqlite://PATH) URL; default: SQLite in --data-dir.
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// Data directory; holds bulkhead.db when no database URL is given.
    #[arg(long, default_value = ".bulkhead")]
    data_dir: PathBuf,
}

impl DbFlags {
    async fn open(&self) -> anyhow::Result<Db> {
        let url = match &self.database_url {
            Some(u) => u.clone(),
            None => {
                std::fs::create_dir_all(&self.data_dir)
                    .with_context(|| format!("creating {}", self.data_dir.display()))?;
                Db::sqlite_url(&self.data_dir.join("bulkhead.db"))
            }
        };
        Ok(Db::connect(&url).await?)
    }
}

#[derive(Debug, Args)]
struct ServeFlags {
    /// Address of the admin API (operators' tokens) and the status page.
    #[arg(long, default_value = "127.0.0.1:8788")]
    listen: String,
    /// Address of the internal API (mutual TLS): where workers register and
    /// heartbeat and gateways read the routing table, each with its
    /// certificate. Node and routing calls are refused on --listen.
    #[arg(long, default_value = "127.0.0.1:8789")]
    internal_listen: String,
    #[command(flatten)]
    tls: crate::tls::TlsArgs,
    /// Where operators scrape `GET /metrics` (off when absent). Not the
    /// status page's port, which the public reads.
    #[arg(long)]
    metrics_listen: Option<String>,
    /// URL the status page is reached at (feed links); default: http://LISTEN.
    #[arg(long)]
    public_url: Option<String>,
    /// Status page title.
    #[arg(long, default_value = "Bulkhead")]
    page_name: String,
    /// Seconds without a heartbeat after which a node is unroutable.
    #[arg(long, default_value_t = 15)]
    node_ttl_secs: u64,
    /// Seconds between the heartbeats nodes are asked to send.
    #[arg(long, default_value_t = 5)]
    heartbeat_secs: u64,
    /// Seconds a gateway may go without hearing from the control plane
    /// before it stops admitting requests (and the longest a visibility flip
    /// waits for a gateway that does not acknowledge it).
    #[arg(long, default_value_t = 10)]
    gateway_lease_secs: u64,
    /// Milliseconds the public status routes may serve one database read.
    #[arg(long, default_value_t = 1000)]
    status_cache_ms: u64,
    #[command(flatten)]
    db: DbFlags,
}

impl ControlPlaneArgs {
    /// Whether this runs the server (not a one-shot subcommand).
    pub(crate) fn serves(&self) -> bool {
        self.command.is_none()
    }
}

pub(crate) fn run(args: &ControlPlaneArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    match &args.command {
        Some(ControlPlaneCommand::Token {
            command: TokenCommand::Create { name, role, db },
        }) => rt.block_on(create_token(name, *role, db)),
        None => rt.block_on(serve(&args.serve)),
    }
}

async fn create_token(name: &str, role: Role, db: &DbFlags) -> anyhow::Result<()> {
    let db = db.open().await?;
    let mut conn = db.pool().acquire().await?;
    let created = store::operators::create(&mut conn, name, role, Timestamp::now()).await?;
    println!("{}", created.token);
    eprintln!("created {role} operator `{name}`; the token above is shown only once");
    Ok(())
}

async fn serve(flags: &ServeFlags) -> anyhow::Result<()> {
    if flags.node_ttl_secs == 0
        || flags.heartbeat_secs == 0
        || flags.heartbeat_secs >= flags.node_ttl_secs
    {
        anyhow::bail!("--heartbeat-secs must be at least 1 and smaller than --node-ttl-secs");
    }
    let identity = flags.tls.load(bulkhead_trust::Role::ControlPlane)?;
    let acceptor = identity.acceptor(&[
        bulkhead_trust::Role::Gateway,
        bulkhead_trust::Role::Prefill,
        bulkhead_trust::Role::Decode,
        bulkhead_trust::Role::Colocated,
        bulkhead_trust::Role::BatchRunner,
    ])?;
    let db = flags.db.open().await?;
    let listener = tokio::net::TcpListener::bind(&flags.listen)
        .await
        .with_context(|| format!("binding {}", flags.listen))?;
    let addr = listener.local_addr()?;
    let internal = tokio::net::TcpListener::bind(&flags.internal_listen)
        .await
        .with_context(|| format!("binding {}", flags.internal_listen))?;
    let internal = bulkhead_trust::TlsListener::new(internal, acceptor)?;
    let internal_addr = internal.local_addr();
    let settings = Settings {
        page_name: flags.page_name.clone(),
        public_url: flags
            .public_url
            .clone()
            .unwrap_or_else(|| format!("http://{addr}")),
        node_ttl: Duration::from_secs(flags.node_ttl_secs),
        heartbeat_interval: Duration::from_secs(flags.heartbeat_secs),
        status_cache: Duration::from_millis(flags.status_cache_ms),
        gateway_lease: Duration::from_secs(flags.gateway_lease_secs.max(1)),
        // Usage is billed only to the account of the call's signed context.
        contexts: flags.tls.verifying_keys()?,
    };
    let metrics = crate::process::metrics_port(
        flags.metrics_listen.as_deref(),
        bulkhead_telemetry::metrics_app(),
    )
    .await?;
    announce(&format!(
        "bulkhead control-plane: listening http={addr} internal={internal_addr}{metrics} database={}{}",
        db.backend(),
        location(&flags.db.data_dir, flags.db.database_url.is_none())
    ));
    let router = app(AppState::new(db.clone(), settings));
    let inside = router
        .clone()
        .into_make_service_with_connect_info::<bulkhead_trust::Peer>();
    tokio::spawn(async move {
        axum::serve(internal, inside)
            .with_graceful_shutdown(crate::process::shutdown())
            .await
    });
    axum::serve(crate::process::nodelay(listener), router)
        .with_graceful_shutdown(crate::process::shutdown())
        .await?;
    db.close().await;
    Ok(())
}

fn location(dir: &Path, sqlite: bool) -> String {
    if sqlite {
        format!(" ({})", dir.join("bulkhead.db").display())
    } else {
        String::new()
    }
}

fn announce(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}
