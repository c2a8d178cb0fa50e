//! Worker registration with the control plane: after loading weights and
//! binding its ports, a worker registers its role, model, addresses and the
//! KV pool capacity it measured, then heartbeats with its load. Off unless
//! `--control-plane` (or `BULKHEAD_CONTROL_PLANE_URL`) is given.

use anyhow::Context;
use bulkhead_control_api::{
    Client, ClientError, Credentials, Heartbeat, ModelSlug, NodeLoad, NodeRole, NodeStatus,
    Parallelism, PrefillFigures, RegisterNode,
};
use bulkhead_engine::Engine;
use clap::Args;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The default model's slug.
pub(crate) const DEFAULT_SLUG: &str = "@cf/huggingfacetb/smollm2-135m-instruct";

/// Flags for registering with the control plane.
#[derive(Debug, Clone, Args)]
pub(crate) struct RegisterArgs {
    /// The control plane's internal URL to register with,
    /// `https://HOST:PORT` (off when absent).
    #[arg(long = "control-plane", env = "BULKHEAD_CONTROL_PLANE_URL")]
    control_plane: Option<String>,
    /// Operator token with the `node` (or `admin`) role.
    #[arg(long, env = "BULKHEAD_NODE_TOKEN", hide_env_values = true)]
    node_token: Option<String>,
    /// Name to register under (default: ROLE@HTTP-ADDRESS).
    #[arg(long)]
    node_name: Option<String>,
    /// Host to register instead of the address a port is bound to (for a
    /// worker listening on 0.0.0.0: its pod or host IP; the port is kept).
    #[arg(long, env = "BULKHEAD_ADVERTISE_HOST")]
    advertise_host: Option<String>,
    /// Slug of the model this worker serves (default: the default model's;
    /// for `bulkhead embed`, the embedding model's).
    #[arg(long)]
    model_slug: Option<ModelSlug>,
}

/// The slug a generating worker serves unless told otherwise.
fn default_slug() -> &'static ModelSlug {
    static SLUG: std::sync::LazyLock<ModelSlug> = std::sync::LazyLock::new(|| {
        DEFAULT_SLUG
            .parse()
            .unwrap_or_else(|e| panic!("the default slug is valid: {e}"))
    });
    &SLUG
}

/// What a worker measured of itself and serves, as it registers it.
#[derive(Debug, Clone)]
pub(crate) struct Capacity {
    /// Tokens one request may hold (a generating worker's KV pool; an
    /// embedding worker's tokens of one call).
    pub(crate) pool_tokens: u64,
    /// Its weights' quantization (lower case).
    pub(crate) quantization: String,
    /// Tokens per KV page (1 for a worker that keeps no KV).
    pub(crate) page_size: u32,
    /// Its measured speed on a prompt and its deadline.
    pub(crate) prefill: PrefillFigures,
}

impl Capacity {
    /// What `engine` measured and serves.
    pub(crate) fn of_engine(engine: &Engine) -> anyhow::Result<Capacity> {
        let info = engine.info();
        Ok(Capacity {
            pool_tokens: info.limits.pool_tokens() as u64,
            quantization: info.model.quantization.to_ascii_lowercase(),
            page_size: u32::try_from(info.limits.page_size())?,
            prefill: prefill_figures(info),
        })
    }
}

/// Reads a worker's load for its heartbeats (on a blocking thread).
pub(crate) type LoadProbe = Arc<dyn Fn() -> Option<NodeLoad> + Send + Sync>;

/// The load of `engine`: its pool's free pages and its queue.
pub(crate) fn engine_load(engine: &Arc<Engine>) -> LoadProbe {
    let engine = Arc::clone(engine);
    Arc::new(move || {
        engine.stats().map(|s| NodeLoad {
            free_pages: s.pool.free_pages as u64,
            total_pages: s.pool.total_pages as u64,
            queue_depth: s.waiting as u64,
        })
    })
}

/// What the worker tells the control plane about itself.
pub(crate) struct Announcement<'a> {
    /// The worker's identity: the control plane's internal port is mutual
    /// TLS.
    pub(crate) identity: &'a bulkhead_trust::Identity,
    pub(crate) role: NodeRole,
    pub(crate) capacity: Capacity,
    /// Its load, read before every heartbeat.
    pub(crate) load: LoadProbe,
    pub(crate) weights: &'a Path,
    pub(crate) kv_budget_bytes: u64,
    pub(crate) address: String,
    pub(crate) transfer_address: Option<String>,
    /// A decode worker that finds its prefill workers through the control
    /// plane: told their transfer addresses on registration and after
    /// every heartbeat.
    pub(crate) prefills: Option<watch::Sender<Vec<String>>>,
}

impl RegisterArgs {
    /// `bound` as others reach it: with `--advertise-host`, that host and
    /// the bound port.
    pub(crate) fn advertised(&self, bound: std::net::SocketAddr) -> String {
        match &self.advertise_host {
            Some(h) if h.contains(':') && !h.starts_with('[') => format!("[{h}]:{}", bound.port()),
            Some(h) => format!("{h}:{}", bound.port()),
            None => bound.to_string(),
        }
    }

    /// The node's name: `--node-name`, or `role@address`.
    pub(crate) fn node_name(&self, role: NodeRole, address: &str) -> String {
        self.node_name
            .clone()
            .unwrap_or_else(|| format!("{role}@{address}"))
    }

    /// The slug of the model this worker serves.
    pub(crate) fn model_slug(&self) -> &ModelSlug {
        self.model_slug.as_ref().unwrap_or_else(|| default_slug())
    }

    /// These flags, serving `slug` unless `--model-slug` names another.
    pub(crate) fn serving_by_default(&self, slug: ModelSlug) -> RegisterArgs {
        let mut r = self.clone();
        r.model_slug.get_or_insert(slug);
        r
    }

    /// Whether a control plane is configured.
    pub(crate) fn has_control_plane(&self) -> bool {
        self.control_plane.is_some()
    }

    /// A control-plane client with the node's token and certificate, when
    /// one is configured (usage reports use it).
    pub(crate) fn client(
        &self,
        identity: &bulkhead_trust::Identity,
    ) -> anyhow::Result<Option<Client>> {
        let Some(url) = &self.control_plane else {
            return Ok(None);
        };
        let token = self
            .node_token
            .clone()
            .context("--control-plane needs --node-token (or BULKHEAD_NODE_TOKEN), a token with the node role")?;
        Ok(Some(Client::with_identity(
            &Credentials {
                control_plane_url: url.clone(),
                operator_token: token,
            },
            identity,
        )?))
    }

    /// Registers (when configured) and spawns the heartbeat task.
    pub(crate) async fn register(&self, a: Announcement<'_>) -> anyhow::Result<()> {
        let Some(url) = &self.control_plane else {
            return Ok(());
        };
        let token = self
            .node_token
            .clone()
            .context("--control-plane needs --node-token (or BULKHEAD_NODE_TOKEN), a token with the node role")?;
        let client = Client::with_identity(
            &Credentials {
                control_plane_url: url.clone(),
                operator_token: token,
            },
            a.identity,
        )?;
        let weights = a.weights.to_path_buf();
        let sha =
            tokio::task::spawn_blocking(move || bulkhead_engine::fetch::sha256_file(&weights))
                .await?
                .context("hashing the weights")?;
        let c = a.capacity;
        let body = RegisterNode {
            name: self.node_name(a.role, &a.address),
            role: a.role,
            model: self.model_slug().clone(),
            address: a.address,
            transfer_address: a.transfer_address,
            kv_pool_tokens: c.pool_tokens,
            weights_sha256: sha,
            quantization: c.quantization,
            page_size: c.page_size,
            kv_budget_bytes: a.kv_budget_bytes,
            parallelism: Parallelism::default(),
            prefill: Some(c.prefill),
        };
        let status: NodeStatus = client
            .post("/admin/v1/nodes", &body)
            .await
            .with_context(|| format!("registering with the control plane at {url}"))?;
        report(&status);
        if let Some(tx) = &a.prefills {
            tell_prefills(tx, &status);
        }
        tokio::spawn(heartbeats(client, body, status, a.load, a.prefills));
        Ok(())
    }
}

/// The engine's measured prefill speed and deadline, as registered.
fn prefill_figures(info: &bulkhead_engine::EngineInfo) -> PrefillFigures {
    let ns = |secs: f64| {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let n = (secs * 1e9).ceil() as u64;
        n.max(1)
    };
    PrefillFigures {
        ns_per_token: ns(info.speed.secs_per_token()),
        ns_per_pair: ns(info.speed.secs_per_pair()),
        deadline_ms: u64::try_from(info.prefill_deadline.as_millis()).unwrap_or(u64::MAX),
    }
}

/// Publishes the prefill workers `s` names, if they changed.
fn tell_prefills(tx: &watch::Sender<Vec<String>>, s: &NodeStatus) {
    let mut now: Vec<String> = s
        .prefill_peers
        .iter()
        .map(|p| p.transfer_address.clone())
        .collect();
    now.sort();
    tx.send_if_modified(|was| {
        let changed = *was != now;
        if changed {
            tracing::info!(target: "bulkhead::worker", prefills = ?now, "prefill workers of this model");
            *was = now;
        }
        changed
    });
}

fn report(s: &NodeStatus) {
    let (id, name) = (&s.node.id, &s.node.registration.name);
    match &s.node.unroutable_reason {
        None => tracing::info!(target: "bulkhead::worker", %id, %name, "registered: routable"),
        Some(why) => {
            tracing::warn!(target: "bulkhead::worker", %id, %name, %why, "registered: NOT routable")
        }
    }
}

/// How often a decode worker that knows no prefill worker heartbeats (and
/// so asks the control plane for them).
const PEERLESS_HEARTBEAT: Duration = Duration::from_millis(500);

/// Heartbeats forever; re-registers if the control plane forgot the node.
async fn heartbeats(
    client: Client,
    body: RegisterNode,
    mut status: NodeStatus,
    load: LoadProbe,
    prefills: Option<watch::Sender<Vec<String>>>,
) {
    let mut routable = status.node.routable;
    loop {
        let mut wait = Duration::from_millis(status.heartbeat_interval_ms.max(100));
        if prefills.is_some() && status.prefill_peers.is_empty() {
            // A decode worker with no prefill worker asks again soon.
            wait = wait.min(PEERLESS_HEARTBEAT);
        }
        tokio::time::sleep(wait).await;
        let probe = Arc::clone(&load);
        let load = tokio::task::spawn_blocking(move || probe())
            .await
            .ok()
            .flatten();
        let path = format!("/admin/v1/nodes/{}/heartbeat", status.node.id);
        let next = match client
            .post::<_, NodeStatus>(&path, &Heartbeat { load })
            .await
        {
            Err(ClientError::Api { status: 404, .. }) => {
                client.post("/admin/v1/nodes", &body).await
            }
            other => other,
        };
        match next {
            Ok(s) => {
                if s.node.routable != routable {
                    report(&s);
                    routable = s.node.routable;
                }
                if let Some(tx) = &prefills {
                    tell_prefills(tx, &s);
                }
                status = s;
            }
            Err(e) => tracing::warn!(target: "bulkhead::worker", error = %e, "heartbeat failed"),
        }
    }
}
