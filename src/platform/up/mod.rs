//! `bulkhead up`: the whole platform on this machine, with embedded
//! defaults. It fetches the default model if missing, opens (or creates)
//! the SQLite database in the data directory, registers the default model
//! and demo accounts, then starts the control plane, a prefill worker, a
//! decode worker and a gateway as separate processes talking over loopback
//! sockets, writes `credentials.json` and prints a ready-to-paste curl
//! line. A component that exits is restarted where it was, with backoff;
//! Ctrl-C (or SIGTERM) stops every component. A second `up` reuses the
//! data directory: same accounts, same tokens.
//!
//! By default it serves two models: the default file as it is (Q4_1) and
//! converted to Q8_0 at load, each with `--prefill-workers` prefill and
//! `--decode-workers` decode workers (colocated ones with `--colocated`); last
//! it starts the leak prober (unless `--no-prober`). Tokens and the TLS
//! directory reach the components in their environment, never on a command
//! line. If this machine cannot prefill a model's configured context window
//! within `--prefill-deadline-secs`, `up` serves a smaller window, a quarter
//! under the longest prompt prefilled in time (in whole 256s), and says so;
//! a window that fits is served whole, and it says that too.

pub(crate) mod child;

use anyhow::Context;
use bulkhead_control_api::{
    ConfigSpec, ConfigView, CreateModel, KvBudget, ModelSlug, NodeView, Parallelism, Properties,
    Role, Timestamp, Visibility,
};
use bulkhead_control_plane::{AccountId, Db, store};
use bulkhead_engine::fetch;
use bulkhead_trust::Role as CertRole;
use clap::Args;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Flags of `bulkhead up`.
#[derive(Debug, Args)]
pub(crate) struct UpArgs {
    /// Where the database and credentials live.
    #[arg(long, default_value = ".bulkhead")]
    data_dir: PathBuf,
    /// The gateway's port on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 8787)]
    port: u16,
    /// KV pool memory of each worker, in MiB.
    #[arg(long, default_value_t = 512)]
    kv_budget_mib: u64,
    /// Compute threads of each worker (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Context window of the registered config (it must fit the pools).
    #[arg(long, default_value_t = 8192)]
    context_window: u64,
    /// Max output of the registered config.
    #[arg(long, default_value_t = 2048)]
    max_output: u64,
    /// Longest a prompt may take to prefill on a worker at the speed it
    /// measures when it starts; if the context window takes longer on this
    /// machine, `up` serves the longest window that does not, and says so.
    #[arg(long, default_value_t = 60)]
    prefill_deadline_secs: u64,
    /// Models to serve, as variants of the default file: `q4_1` (the file's
    /// own weights, `@cf/huggingfacetb/smollm2-135m-instruct`) and `q8_0`
    /// (converted to Q8_0 at load, the same slug with `-q8`).
    #[arg(long, value_delimiter = ',', default_value = "q4_1,q8_0", value_parser = ["q4_1", "q8_0"])]
    models: Vec<String>,
    /// Prefill workers of each model.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=8))]
    prefill_workers: u8,
    /// Decode workers of each model (colocated ones with `--colocated`).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=8))]
    decode_workers: u8,
    /// Run each model on colocated workers (`bulkhead serve`: prefill and
    /// decode in one process) instead of prefill/decode pairs.
    #[arg(long)]
    colocated: bool,
    /// Do not start the leak prober (`bulkhead prober`), which otherwise
    /// calls every public model as two sentinel accounts and withdraws a
    /// model whose answers leak or go wrong.
    #[arg(long)]
    no_prober: bool,
    /// Seconds between the prober's rounds.
    #[arg(long, default_value_t = 30)]
    prober_interval_secs: u64,
    /// An HTTP URL the prober POSTs each finding to.
    #[arg(long)]
    prober_webhook: Option<String>,
    /// Testing only: each decode or colocated worker answers wrong after
    /// this many requests. Refused unless built with the test hooks.
    #[arg(long, hide = true)]
    corrupt_answers_after: Option<u64>,
    /// Testing only: each prefill worker breaks this percent of its page
    /// frames (the chaos soak). Refused unless built with the test hooks.
    #[arg(long, hide = true)]
    frame_faults_percent: Option<u8>,
}

/// A model `up` serves: the default file, as it is or converted at load.
#[derive(Debug, Clone, Copy)]
struct Served {
    /// `--models` value.
    variant: &'static str,
    /// Appended to the default slug.
    suffix: &'static str,
    /// The workers' `--quantize`, if any.
    quantize: Option<&'static str>,
    /// What its workers register (lower case).
    quantization: &'static str,
    description: &'static str,
    /// Before the role in its workers' node names.
    prefix: &'static str,
}

/// What the models `up` serves cost: Workers AI's rates for
/// `@cf/meta/llama-3.2-1b-instruct` (2,457 and 18,252 neurons per million
/// prompt and output tokens) scaled down to a 135M-parameter model.
const PRICE: bulkhead_control_api::Price = bulkhead_control_api::Price {
    input_neurons_per_mtok: 330,
    output_neurons_per_mtok: 2_460,
};

const SERVED: [Served; 2] = [
    Served {
        variant: "q4_1",
        suffix: "",
        quantize: None,
        quantization: "q4_1",
        description: "SmolLM2 135M Instruct (Q4_1), Apache-2.0",
        prefix: "up-",
    },
    Served {
        variant: "q8_0",
        suffix: "-q8",
        quantize: Some("q8_0"),
        quantization: "q8_0",
        description: "SmolLM2 135M Instruct, converted to Q8_0 at load, Apache-2.0",
        prefix: "up-q8-",
    },
];

impl Served {
    fn slug(self) -> String {
        format!("{}{}", crate::platform::register::DEFAULT_SLUG, self.suffix)
    }

    /// The node name of its `i`-th (from 1) worker of `role`.
    fn node_name(self, role: &str, i: u8) -> String {
        if i == 1 {
            format!("{}{role}", self.prefix)
        } else {
            format!("{}{role}-{i}", self.prefix)
        }
    }
}

impl UpArgs {
    /// The models to serve, in the order given, each once.
    fn served(&self) -> Vec<Served> {
        let mut out: Vec<Served> = Vec::new();
        for m in &self.models {
            if let Some(s) = SERVED.iter().find(|s| s.variant == m)
                && !out.iter().any(|o| o.variant == s.variant)
            {
                out.push(*s);
            }
        }
        out
    }
}

/// What `up` writes for people and scripts.
#[derive(Debug, Serialize, Deserialize)]
struct CredentialsFile {
    gateway_url: String,
    control_plane_url: String,
    /// The control plane's internal (mutual TLS) URL, for workers and
    /// gateways started by hand with the identities in `tls/`.
    #[serde(default)]
    internal_url: String,
    status_url: String,
    operator_token: String,
    model: String,
    /// Every model served (the first is `model`).
    #[serde(default)]
    models: Vec<String>,
    accounts: Vec<DemoAccount>,
    /// Where each component serves `GET /metrics` for Prometheus.
    #[serde(default)]
    metrics: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct DemoAccount {
    id: String,
    name: String,
    token: String,
}

/// The tokens `up` itself uses to run the components (kept private to the
/// data directory).
#[derive(Debug, Serialize, Deserialize)]
struct Internal {
    admin: String,
    gateway: String,
    node: String,
    /// The leak prober's sentinel accounts.
    #[serde(default)]
    sentinels: Vec<crate::platform::prober::Sentinel>,
}

/// The request the printed curl line sends. SmolLM2's chat template adds a
/// default system prompt under which the 135M model rambles; a plain one,
/// greedy, gets a plain answer.
pub(crate) const EXAMPLE_BODY: &str = r#"{"messages": [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What is the capital of France?"}], "temperature": 0}"#;

pub(crate) fn run(args: &UpArgs) -> anyhow::Result<()> {
    create_private_dir(&args.data_dir)?;
    // One `up` per data directory: a second one would re-register the
    // workers of the first under new addresses. The lock dies with us.
    let lock = std::fs::File::create(args.data_dir.join("up.lock"))?;
    if lock.try_lock().is_err() {
        anyhow::bail!(
            "another `bulkhead up` is running on {}",
            args.data_dir.display()
        );
    }
    if args.port != 0 {
        std::net::TcpListener::bind(("127.0.0.1", args.port))
            .with_context(|| format!("port {} is taken (choose another with --port)", args.port))?;
    }
    let weights = fetch::ensure_default_model(&crate::config::model_source(true))
        .context("fetching the default model")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // Listen for Ctrl-C and SIGTERM before any component exists, so a
    // signal during start-up still stops everything.
    let mut signals = rt.block_on(async { Signals::new() })?;
    let (internal, mut creds) = rt.block_on(bootstrap(args))?;
    // Recorded before anything starts, so a failed start is retried with
    // the same accounts and tokens.
    let path = args.data_dir.join("credentials.json");
    write_private(&path, &serde_json::to_string_pretty(&creds)?)?;
    // The platform's CA and every component's certificate (reused).
    let tls = args.data_dir.join("tls");
    bulkhead_trust::authority::init_dir(&tls, &bulkhead_trust::Role::ALL)
        .context("creating the platform's TLS identities")?;
    bulkhead_worker_api::context::KeyRing::create(&tls.join(crate::tls::CONTEXT_KEYS))?;
    let mut components = Components::default();
    let started = start(args, &weights, &internal, &mut creds, &mut components)
        .and_then(|()| rt.block_on(check_routable(args, &creds, &internal)))
        .and_then(|()| start_prober(args, &internal, &mut creds, &mut components));
    if let Err(e) = started {
        components.stop();
        return Err(e);
    }
    write_private(&path, &serde_json::to_string_pretty(&creds)?)?;
    announce(&creds, &args.data_dir);
    // A component that exits is restarted (same addresses, backoff); the
    // platform stops only on a signal.
    rt.block_on(async {
        tokio::select! {
            biased;
            () = signals.next() => {}
            () = components.supervise() => {}
        }
    });
    eprintln!("bulkhead up: stopping");
    components.stop();
    drop(lock);
    Ok(())
}

/// Ctrl-C and SIGTERM, registered once.
struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Signals {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    async fn next(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Every worker `up` started must be routable before it says ready: a
/// config that does not fit their pools is an error, not a dead curl line.
async fn check_routable(
    args: &UpArgs,
    creds: &CredentialsFile,
    internal: &Internal,
) -> anyhow::Result<()> {
    let client = bulkhead_control_api::Client::new(&bulkhead_control_api::Credentials {
        control_plane_url: creds.control_plane_url.clone(),
        operator_token: internal.admin.clone(),
    })?;
    // Asked with the operator certificate: worker ports are mutual TLS.
    let operator = bulkhead_trust::Identity::load(
        &bulkhead_trust::TlsFiles::in_dir(&args.data_dir.join("tls"), CertRole::Operator),
        CertRole::Operator,
    )?;
    let tls = operator.connector(&[CertRole::Decode])?;
    for served in args.served() {
        let names = worker_names(args, served);
        let workers = |nodes: &[NodeView]| -> anyhow::Result<Vec<NodeView>> {
            names
                .iter()
                .map(|name| {
                    nodes
                        .iter()
                        .find(|n| n.registration.name == *name)
                        .cloned()
                        .with_context(|| format!("{name} did not register"))
                })
                .collect()
        };
        let nodes: Vec<NodeView> = client.get("/admin/v1/nodes").await?;
        let mut ours = workers(&nodes)?;
        if reduce_window(&client, &served.slug(), &ours).await? {
            let nodes: Vec<NodeView> = client.get("/admin/v1/nodes").await?;
            ours = workers(&nodes)?;
        }
        for n in &ours {
            if let Some(why) = &n.unroutable_reason {
                anyhow::bail!(
                    "{} is not routable: {why} (adjust --kv-budget-mib, --context-window or --max-output)",
                    n.registration.name
                );
            }
        }
        // Ready means answering: every decode worker has linked to a
        // prefill worker (they learn of them through the control plane).
        for n in ours
            .iter()
            .filter(|n| n.registration.role == bulkhead_control_api::NodeRole::Decode)
        {
            let until = std::time::Instant::now() + Duration::from_secs(30);
            while !linked(&tls, &n.registration.address).await {
                anyhow::ensure!(
                    std::time::Instant::now() < until,
                    "{} linked to no prefill worker within 30 s",
                    n.registration.name
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    Ok(())
}

/// Whether the decode worker at `address` is linked to a prefill worker
/// (its `/stats` lists one).
async fn linked(tls: &bulkhead_trust::tokio_rustls::TlsConnector, address: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = bulkhead_trust::connect::dial(tls, CertRole::Decode, address).await else {
        return false;
    };
    let req = format!("GET /stats HTTP/1.0\r\nHost: {address}\r\n\r\n");
    let mut out = Vec::new();
    let read = async {
        s.write_all(req.as_bytes()).await?;
        s.flush().await?;
        s.read_to_end(&mut out).await
    };
    if !matches!(
        tokio::time::timeout(Duration::from_secs(5), read).await,
        Ok(Ok(_))
    ) {
        return false;
    }
    let text = String::from_utf8_lossy(&out);
    let Some((_, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["prefills"].as_array().map(|a| !a.is_empty()))
        .unwrap_or(false)
}

/// A window this machine cannot prefill within the workers' deadline is
/// not advertised: activates a config with the longest one it can, says
/// why, and tells whether it did. A window that fits is served whole, and
/// `up` says that too, with the time it takes.
async fn reduce_window(
    client: &bulkhead_control_api::Client,
    slug: &str,
    ours: &[NodeView],
) -> anyhow::Result<bool> {
    let servable = ours
        .iter()
        .filter_map(|n| n.registration.prefill.map(|f| (f.max_prompt(), f)))
        .min_by_key(|(max, _)| *max);
    let path = format!("/admin/v1/models/{}/configs", urlencode(slug));
    let configs: Vec<ConfigView> = client.get(&path).await?;
    let (Some((max, figures)), Some(active)) = (servable, configs.iter().find(|c| c.active)) else {
        return Ok(false);
    };
    if active.spec.properties.context_window <= max {
        let window = active.spec.properties.context_window;
        eprintln!(
            "bulkhead up: serving the whole {window}-token context window of {slug}: about {} s to prefill \
             here, within the {} s prefill deadline (this machine prefills up to {max} tokens in time)",
            figures.prompt_ms(window).div_ceil(1000),
            figures.deadline_ms / 1000,
        );
        return Ok(false);
    }
    // A quarter kept in hand: a worker restarted while the others are busy
    // measures itself slower, and must still fit the window to be routable.
    let window = (max * 3 / 4 / 256) * 256;
    anyhow::ensure!(
        window >= 256,
        "this machine prefills at most {max} tokens within {} s; no useful context window fits",
        figures.deadline_ms / 1000
    );
    let was = active.spec.properties.context_window;
    eprintln!(
        "bulkhead up: prefilling the {was}-token context window of {slug} would take about {} s here, over the \
         {} s prefill deadline; serving a {window}-token window, a quarter under the longest prompt prefilled \
         in time (raise --prefill-deadline-secs to serve more)",
        figures.prompt_ms(was).div_ceil(1000),
        figures.deadline_ms / 1000,
    );
    let mut spec = active.spec.clone();
    spec.properties.context_window = window;
    spec.properties.max_output = spec.properties.max_output.min(window);
    let added: ConfigView = client.post(&path, &spec).await?;
    let _: ConfigView = client
        .post(
            &format!("{path}/{}/activate", added.version),
            &serde_json::json!({"reason": format!("bulkhead up: the {was}-token window cannot be prefilled within the deadline here")}),
        )
        .await?;
    Ok(true)
}

/// The node names of every worker `up` starts for `served`.
fn worker_names(args: &UpArgs, served: Served) -> Vec<String> {
    if args.colocated {
        return (1..=args.decode_workers)
            .map(|i| served.node_name("serve", i))
            .collect();
    }
    let prefill = (1..=args.prefill_workers).map(|i| served.node_name("prefill", i));
    let decode = (1..=args.decode_workers).map(|i| served.node_name("decode", i));
    prefill.chain(decode).collect()
}

/// `@` and `/` escaped for a path segment.
fn urlencode(s: &str) -> String {
    s.replace('@', "%40").replace('/', "%2F")
}

/// Database, operators, model and demo accounts; reuses what a previous
/// `up` left in the data directory.
async fn bootstrap(args: &UpArgs) -> anyhow::Result<(Internal, CredentialsFile)> {
    let db = Db::connect(&Db::sqlite_url(&args.data_dir.join("bulkhead.db"))).await?;
    let now = Timestamp::now();
    let mut c = db.pool().acquire().await?;
    let internal_path = args.data_dir.join("internal-tokens.json");
    let previous: Option<Internal> = std::fs::read_to_string(&internal_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let mut token = async |old: Option<&str>, name: &str, role: Role| -> anyhow::Result<String> {
        if let Some(t) = old
            && store::operators::authenticate(&mut c, t)
                .await?
                .is_some_and(|o| o.role == role)
        {
            return Ok(t.to_owned());
        }
        let name = format!("{name}-{}", now.millis());
        Ok(store::operators::create(&mut c, &name, role, now)
            .await?
            .token)
    };
    let internal = Internal {
        admin: token(
            previous.as_ref().map(|p| p.admin.as_str()),
            "up-admin",
            Role::Admin,
        )
        .await?,
        gateway: token(
            previous.as_ref().map(|p| p.gateway.as_str()),
            "up-gateway",
            Role::Gateway,
        )
        .await?,
        node: token(
            previous.as_ref().map(|p| p.node.as_str()),
            "up-node",
            Role::Node,
        )
        .await?,
        sentinels: Vec::new(),
    };
    let old_creds: Option<CredentialsFile> =
        std::fs::read_to_string(args.data_dir.join("credentials.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok());
    let operator_token = token(
        old_creds.as_ref().map(|o| o.operator_token.as_str()),
        "responder",
        Role::Responder,
    )
    .await?;
    // The prober's two sentinel accounts, marked as such (reused).
    let mut internal = internal;
    internal.sentinels = sentinels(&mut c, previous.as_ref(), now).await?;
    write_private(&internal_path, &serde_json::to_string_pretty(&internal)?)?;

    // Worker records of earlier runs: their names are reused now, perhaps
    // under a new node token.
    for n in store::nodes::list(&mut c, None).await? {
        if n.registration.name.starts_with("up-") {
            store::nodes::remove(&mut c, n.id).await?;
        }
    }

    publish_models(&mut c, args, now).await?;

    let accounts = demo_accounts(&mut c, old_creds.as_ref(), now).await?;
    drop(c);
    db.close().await;
    Ok((
        internal,
        CredentialsFile {
            gateway_url: String::new(),
            control_plane_url: String::new(),
            internal_url: String::new(),
            status_url: String::new(),
            operator_token,
            model: args.served().first().map_or_else(
                || crate::platform::register::DEFAULT_SLUG.to_owned(),
                |m| m.slug(),
            ),
            models: args.served().iter().map(|m| m.slug()).collect(),
            accounts,
            metrics: Default::default(),
        },
    ))
}

/// Whether `token` still belongs to account `id` (a data directory kept
/// from an earlier `up`).
async fn still_valid(c: &mut store::Conn, token: &str, id: &str) -> anyhow::Result<bool> {
    Ok(store::api_tokens::account_of(&mut *c, token)
        .await?
        .as_deref()
        == Some(id))
}

/// A new API token named `name` for account `id`.
async fn token_for(
    c: &mut store::Conn,
    id: &str,
    name: &str,
    now: Timestamp,
) -> anyhow::Result<String> {
    let id = AccountId::parse(id).context("account id")?;
    Ok(store::api_tokens::create(&mut *c, &id, name, now)
        .await?
        .token)
}

/// The prober's sentinel accounts: those of the previous run when their
/// tokens still work, else new ones.
async fn sentinels(
    c: &mut store::Conn,
    previous: Option<&Internal>,
    now: Timestamp,
) -> anyhow::Result<Vec<crate::platform::prober::Sentinel>> {
    let mut out = Vec::new();
    for (i, name) in ["sentinel-a", "sentinel-b"].into_iter().enumerate() {
        let old = previous.and_then(|p| p.sentinels.get(i));
        let old = old.map(|s| (s.id.as_str(), s.token.as_str()));
        let (id, token) = account(c, old, (name, Kind::Sentinel), now).await?;
        out.push(crate::platform::prober::Sentinel { id, token });
    }
    Ok(out)
}

/// What an account `up` makes is for.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// The prober's (its token labelled `prober`).
    Sentinel,
    /// A demo tenant's (its token labelled `demo`).
    Demo,
}

/// The id and token of `old` when its token still works; else of a new
/// account `name` of `kind`, with a new token.
async fn account(
    c: &mut store::Conn,
    old: Option<(&str, &str)>,
    (name, kind): (&str, Kind),
    now: Timestamp,
) -> anyhow::Result<(String, String)> {
    if let Some((id, token)) = old
        && still_valid(c, token, id).await?
    {
        return Ok((id.to_owned(), token.to_owned()));
    }
    let (account, label) = match kind {
        Kind::Sentinel => (
            store::accounts::create_sentinel(&mut *c, name, now).await?,
            "prober",
        ),
        Kind::Demo => (store::accounts::create(&mut *c, name, now).await?, "demo"),
    };
    let token = token_for(c, &account.id, label, now).await?;
    Ok((account.id, token))
}

/// A config for the default model's weights (whose sha256 is given):
/// `quantization` as its workers register it, `properties`, `budget` bytes
/// of KV memory per role, 16-token pages, one device, `up`'s price.
pub(crate) fn config(
    sha256: &str,
    quantization: &str,
    properties: Properties,
    budget: u64,
) -> ConfigSpec {
    ConfigSpec {
        properties,
        weights_file: fetch::FILE_NAME.to_owned(),
        weights_sha256: sha256.to_owned(),
        quantization: quantization.to_owned(),
        page_size: 16,
        kv_budget: KvBudget {
            prefill_bytes: budget,
            decode_bytes: budget,
        },
        parallelism: Parallelism::default(),
        price: PRICE,
    }
}

/// The served models, public, each with a config that matches what its
/// workers load (a new version only when it changed).
async fn publish_models(c: &mut store::Conn, args: &UpArgs, now: Timestamp) -> anyhow::Result<()> {
    let budget = args.kv_budget_mib << 20;
    for served in args.served() {
        let slug: ModelSlug = served.slug().parse()?;
        let properties = Properties {
            context_window: args.context_window,
            max_output: args.max_output,
        };
        let spec = config(fetch::SHA256, served.quantization, properties, budget);
        let model = match store::models::find_optional(&mut *c, &slug).await? {
            Some(m) => m,
            None => {
                let create = CreateModel {
                    slug: slug.clone(),
                    task: "Text Generation".to_owned(),
                    description: served.description.to_owned(),
                    visibility: Visibility::Public,
                    config: None,
                };
                store::models::create(&mut *c, &create, now).await?
            }
        };
        let active = store::configs::active(&mut *c, &model).await?;
        if active.as_ref().is_none_or(|a| a.spec != spec) {
            let v = store::configs::add(&mut *c, &model, &spec, "bulkhead up", now).await?;
            // Nodes of a previous run are silent by now or about to be replaced.
            store::configs::activate(
                &mut *c,
                &model,
                v,
                "bulkhead up",
                "bulkhead up",
                now,
                Duration::ZERO,
            )
            .await?;
        }
    }
    Ok(())
}

/// Two demo accounts, each with an API token (reused when still valid).
async fn demo_accounts(
    c: &mut store::Conn,
    old: Option<&CredentialsFile>,
    now: Timestamp,
) -> anyhow::Result<Vec<DemoAccount>> {
    let mut accounts = Vec::new();
    for name in ["alice", "bob"] {
        let reuse = old.and_then(|o| o.accounts.iter().find(|a| a.name == name));
        let reuse = reuse.map(|a| (a.id.as_str(), a.token.as_str()));
        let (id, token) = account(c, reuse, (name, Kind::Demo), now).await?;
        let name = name.to_owned();
        accounts.push(DemoAccount { id, name, token });
    }
    Ok(accounts)
}

/// The child processes, stopped in reverse order.
#[derive(Debug, Default)]
struct Components {
    running: Vec<Running>,
}

/// A started component and how to start it again.
#[derive(Debug)]
struct Running {
    name: String,
    child: Child,
    /// Its arguments with every `127.0.0.1:0` replaced by the address it
    /// bound, so a restart listens where everyone else expects it.
    args: Vec<String>,
    /// Its secrets, passed in the environment.
    env: Vec<(&'static str, String)>,
    started: std::time::Instant,
    /// The wait before the next restart (doubles, at most 30 s; back to
    /// 1 s after a minute up).
    backoff: Duration,
}

/// The key of a listening line that names what `flag` bound.
fn bound_key(flag: &str, line: &str) -> &'static str {
    match flag {
        "--http" => "http",
        "--metrics-listen" => "metrics",
        "--internal-listen" => "internal",
        _ if line.contains("transfer=") => "transfer",
        _ => "http",
    }
}

impl Components {
    /// Starts `bulkhead <args>` and waits for its `listening` line (the rest
    /// of its output is passed through), with secrets and identities in the
    /// child's environment (never on its command line, which every local
    /// user can read).
    fn spawn_with(
        &mut self,
        name: &str,
        args: &[&str],
        env: Vec<(&'static str, String)>,
    ) -> anyhow::Result<String> {
        let name = name.to_owned();
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
        // Their own process group: a Ctrl-C at the terminal reaches `up`
        // alone, which stops them in order.
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting the {name}"))?;
        let stdout = child.stdout.take().context("child stdout")?;
        let stderr = child.stderr.take().context("child stderr")?;
        self.running.push(Running {
            name: name.clone(),
            child,
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            env,
            started: std::time::Instant::now(),
            backoff: Duration::from_secs(1),
        });
        // Its log lines, prefixed with its name.
        let tag = name.clone();
        std::thread::spawn(move || {
            // Never stops draining, even if our own stderr is gone: a
            // component blocked on a full pipe would stop serving.
            for l in lossy_lines(BufReader::new(stderr)) {
                let _ = writeln!(std::io::stderr().lock(), "[{tag}] {l}");
            }
        });
        let mut lines = lossy_lines(BufReader::new(stdout));
        let line = match lines.next() {
            Some(l) if l.contains("listening") => l,
            _ => anyhow::bail!("the {name} did not start (see its messages above)"),
        };
        std::thread::spawn(move || {
            for l in lines {
                let _ = writeln!(std::io::stdout().lock(), "[{name}] {l}");
            }
        });
        // Pin what it bound, for a restart.
        if let Some(r) = self.running.last_mut() {
            for i in 1..r.args.len() {
                if r.args[i] == "127.0.0.1:0"
                    && let Ok(a) = addr(&line, bound_key(&r.args[i - 1], &line))
                {
                    r.args[i] = a;
                }
            }
        }
        Ok(line)
    }

    /// Restarts every component that exits, with backoff, until cancelled.
    /// A restarted worker registers again; the others keep serving.
    async fn supervise(&mut self) {
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let Some(i) = self
                .running
                .iter_mut()
                .position(|r| matches!(r.child.try_wait(), Ok(Some(_))))
            else {
                continue;
            };
            let dead = self.running.remove(i);
            let backoff = if dead.started.elapsed() > Duration::from_secs(60) {
                Duration::from_secs(1)
            } else {
                dead.backoff
            };
            eprintln!(
                "bulkhead up: the {} exited; restarting it in {} s",
                dead.name,
                backoff.as_secs()
            );
            tokio::time::sleep(backoff).await;
            let args: Vec<&str> = dead.args.iter().map(String::as_str).collect();
            let env = dead.env.clone();
            let started = tokio::task::block_in_place(|| self.spawn_with(&dead.name, &args, env));
            match started {
                Ok(_) => {
                    let r = self.running.last_mut().expect("just started");
                    // Keep it in its place, so `stop` still goes newest first.
                    r.backoff = (backoff * 2).min(Duration::from_secs(30));
                    let r = self.running.pop().expect("just started");
                    self.running.insert(i, r);
                    eprintln!("bulkhead up: the {} is back", dead.name);
                }
                Err(e) => {
                    eprintln!("bulkhead up: restarting the {} failed: {e:#}", dead.name);
                    // Tried again when it is seen to have exited, after a
                    // longer wait.
                    if let Some(mut r) = self.running.pop() {
                        r.backoff = (backoff * 2).min(Duration::from_secs(30));
                        self.running.insert(i, r);
                    }
                }
            }
        }
    }

    /// Stops every component, newest first: SIGTERM, so it flushes its
    /// telemetry, then SIGKILL after a grace period.
    fn stop(&mut self) {
        while let Some(Running { mut child, .. }) = self.running.pop() {
            #[cfg(unix)]
            if let Ok(pid) = i32::try_from(child.id()) {
                use nix::sys::signal::{Signal, kill};
                let _ = kill(nix::unistd::Pid::from_raw(pid), Signal::SIGTERM);
                let until = std::time::Instant::now() + Duration::from_secs(3);
                while std::time::Instant::now() < until {
                    if let Ok(Some(_)) = child.try_wait() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Components {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Lines of `r` until it ends or fails, invalid UTF-8 replaced (a line
/// that is not text must not stop the draining).
fn lossy_lines(mut r: impl BufRead) -> impl Iterator<Item = String> {
    std::iter::from_fn(move || {
        let mut buf = Vec::new();
        match r.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => None,
            Ok(_) => {
                while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                    buf.pop();
                }
                Some(String::from_utf8_lossy(&buf).into_owned())
            }
        }
    })
}

fn addr(line: &str, key: &str) -> anyhow::Result<String> {
    line.split(&format!("{key}="))
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .map(str::to_owned)
        .with_context(|| format!("no {key}= in `{line}`"))
}

fn start(
    args: &UpArgs,
    weights: &Path,
    internal: &Internal,
    creds: &mut CredentialsFile,
    c: &mut Components,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        !args.served().is_empty(),
        "--models names no model to serve"
    );
    let data = args
        .data_dir
        .to_str()
        .context("the data directory must be UTF-8")?;
    let weights = weights.to_str().context("the model path must be UTF-8")?;
    let mib = args.kv_budget_mib.to_string();
    let tls = args.data_dir.join("tls");
    let tls = tls.to_str().context("the data directory must be UTF-8")?;
    let tls_env = || ("BULKHEAD_TLS_DIR", tls.to_owned());
    let line = c.spawn_with(
        "control plane",
        &[
            "control-plane",
            "--listen",
            "127.0.0.1:0",
            "--internal-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--data-dir",
            data,
        ],
        vec![tls_env()],
    )?;
    let cp = format!("http://{}", addr(&line, "http")?);
    let cp_internal = format!("https://{}", addr(&line, "internal")?);
    creds.metrics = [(
        "control-plane".to_owned(),
        format!("http://{}/metrics", addr(&line, "metrics")?),
    )]
    .into_iter()
    .collect();
    let spawn = WorkerSpawn {
        args,
        weights,
        mib: &mib,
        cp_internal: &cp_internal,
        tls,
        node_token: &internal.node,
        deadline: args.prefill_deadline_secs.to_string(),
        threads: args.threads.map(|t| t.to_string()),
        corrupt: args.corrupt_answers_after.map(|n| n.to_string()),
        faults: args.frame_faults_percent.map(|p| p.to_string()),
        max_pool: pool_bound(Path::new(weights), args.kv_budget_mib << 20)?,
    };
    for served in args.served() {
        if args.colocated {
            for i in 1..=args.decode_workers {
                spawn.worker(c, creds, &served, "serve", i, &[])?;
            }
            continue;
        }
        // Prefill first: a decode worker finds them through the control plane.
        for i in 1..=args.prefill_workers {
            spawn.worker(
                c,
                creds,
                &served,
                "prefill",
                i,
                &["--listen", "127.0.0.1:0"],
            )?;
        }
        for i in 1..=args.decode_workers {
            spawn.worker(c, creds, &served, "decode", i, &[])?;
        }
    }
    let line = spawn_gateway(c, args.port, &cp_internal, &internal.gateway, tls)?;
    creds.gateway_url = format!("http://{}", addr(&line, "http")?);
    creds.metrics.insert(
        "gateway".to_owned(),
        format!("http://{}/metrics", addr(&line, "metrics")?),
    );
    creds.status_url = cp.clone();
    creds.control_plane_url = cp;
    creds.internal_url = cp_internal;
    Ok(())
}

/// Starts the gateway on `port`; its announcement line.
fn spawn_gateway(
    c: &mut Components,
    port: u16,
    cp_internal: &str,
    gateway_token: &str,
    tls: &str,
) -> anyhow::Result<String> {
    let listen = format!("127.0.0.1:{port}");
    c.spawn_with(
        "gateway",
        &[
            "gateway",
            "--listen",
            &listen,
            "--control-plane",
            cp_internal,
            "--instance",
            "up",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
        vec![
            ("BULKHEAD_GATEWAY_TOKEN", gateway_token.to_owned()),
            ("BULKHEAD_TLS_DIR", tls.to_owned()),
        ],
    )
}

/// What every worker `up` starts is given.
struct WorkerSpawn<'a> {
    args: &'a UpArgs,
    weights: &'a str,
    mib: &'a str,
    cp_internal: &'a str,
    tls: &'a str,
    node_token: &'a str,
    deadline: String,
    threads: Option<String>,
    corrupt: Option<String>,
    faults: Option<String>,
    /// The pool bound the workers' certificates carry.
    max_pool: u64,
}

impl WorkerSpawn<'_> {
    /// Starts worker `i` of `served` in `role` (`prefill`, `decode` or
    /// `serve`) with `extra` flags, records its metrics URL in `creds`;
    /// its announcement line. Each model's workers hold certificates
    /// scoped to that model and to the pool they are given: they can
    /// register nothing else, and the gateway sends another model's
    /// requests to none of them.
    fn worker(
        &self,
        c: &mut Components,
        creds: &mut CredentialsFile,
        served: &Served,
        role: &str,
        i: u8,
        extra: &[&str],
    ) -> anyhow::Result<String> {
        let slug = served.slug();
        let scope = bulkhead_trust::Scope::model(&slug, Some(self.max_pool));
        let tls_dir = self.args.data_dir.join("tls");
        let cert_role = match role {
            "prefill" => CertRole::Prefill,
            "decode" => CertRole::Decode,
            _ => CertRole::Colocated,
        };
        let (files, _) = bulkhead_trust::authority::init_scoped(&tls_dir, cert_role, &scope)
            .with_context(|| format!("issuing the {cert_role} certificate for {slug}"))?;
        let path = |p: &std::path::Path| -> anyhow::Result<String> {
            Ok(p.to_str()
                .context("the data directory must be UTF-8")?
                .to_owned())
        };
        let node_name = served.node_name(role, i);
        let mut a: Vec<&str> = vec![role, "--http", "127.0.0.1:0"];
        a.extend_from_slice(extra);
        a.extend_from_slice(&["--model", self.weights, "--model-slug", &slug]);
        if let Some(q) = served.quantize {
            a.extend_from_slice(&["--quantize", q]);
        }
        a.extend_from_slice(&[
            "--kv-budget-mib",
            self.mib,
            "--control-plane",
            self.cp_internal,
        ]);
        a.extend_from_slice(&["--metrics-listen", "127.0.0.1:0"]);
        a.extend_from_slice(&["--node-name", &node_name]);
        a.extend_from_slice(&["--prefill-deadline-secs", &self.deadline]);
        if let Some(t) = &self.threads {
            a.extend_from_slice(&["--threads", t]);
        }
        if role != "prefill"
            && let Some(n) = &self.corrupt
        {
            a.extend_from_slice(&["--corrupt-answers-after", n]);
        }
        if role == "prefill"
            && let Some(p) = &self.faults
        {
            a.extend_from_slice(&["--frame-faults-percent", p]);
        }
        let env = vec![
            ("BULKHEAD_NODE_TOKEN", self.node_token.to_owned()),
            ("BULKHEAD_TLS_DIR", self.tls.to_owned()),
            ("BULKHEAD_TLS_CA", path(&files.ca)?),
            ("BULKHEAD_TLS_CERT", path(&files.cert)?),
            ("BULKHEAD_TLS_KEY", path(&files.key)?),
        ];
        let line = c.spawn_with(&format!("{} worker", &node_name["up-".len()..]), &a, env)?;
        let key = node_name.trim_start_matches("up-").to_owned();
        creds
            .metrics
            .insert(key, format!("http://{}/metrics", addr(&line, "metrics")?));
        Ok(line)
    }
}

/// The most tokens a worker's pool can hold in `budget` bytes (f16 keys
/// and values, 16-token pages, as `up`'s workers keep them): the bound
/// their certificates carry. Both served variants share the geometry.
fn pool_bound(weights: &Path, budget: u64) -> anyhow::Result<u64> {
    let model = bulkhead_engine::ModelFile::load(weights)
        .with_context(|| format!("reading {}", weights.display()))?;
    let c = model.config();
    let page = (c.layers * 2 * c.kv_heads * c.head_dim * 2 * 16) as u64;
    anyhow::ensure!(page > 0, "{}: a model with no KV", weights.display());
    Ok(budget / page * 16)
}

/// Starts the leak prober (unless `--no-prober`): the sentinels' tokens and
/// the responder's token go in its environment.
fn start_prober(
    args: &UpArgs,
    internal: &Internal,
    creds: &mut CredentialsFile,
    c: &mut Components,
) -> anyhow::Result<()> {
    if args.no_prober {
        return Ok(());
    }
    let interval = args.prober_interval_secs.to_string();
    let state = args.data_dir.join("prober.json");
    let state = state.to_str().context("the data directory must be UTF-8")?;
    let mut a = vec![
        "prober",
        "--gateway",
        &creds.gateway_url,
        "--control-plane",
        &creds.control_plane_url,
        "--interval-secs",
        &interval,
        "--state",
        state,
        "--metrics-listen",
        "127.0.0.1:0",
    ];
    if let Some(w) = &args.prober_webhook {
        a.extend_from_slice(&["--webhook", w]);
    }
    let env = vec![
        ("BULKHEAD_PROBER_TOKEN", creds.operator_token.clone()),
        (
            "BULKHEAD_SENTINELS",
            serde_json::to_string(&internal.sentinels)?,
        ),
    ];
    let line = c.spawn_with("prober", &a, env)?;
    let metrics = format!("http://{}/metrics", addr(&line, "metrics")?);
    creds.metrics.insert("prober".to_owned(), metrics);
    Ok(())
}

/// Writes a secret file: created 0600, written in full, then renamed into
/// place, so it is never readable by others nor half written.
fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut f = options
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn create_private_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

fn announce(c: &CredentialsFile, dir: &Path) {
    let a = &c.accounts[0];
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "bulkhead up: ready");
    let _ = writeln!(out, "  gateway        {}", c.gateway_url);
    let _ = writeln!(
        out,
        "  control plane  {}  (status page and feeds: {}/ , {}/api/v2/summary.json)",
        c.control_plane_url, c.status_url, c.status_url
    );
    for m in &c.models {
        let _ = writeln!(out, "  model          {m}");
    }
    for acct in &c.accounts {
        let _ = writeln!(
            out,
            "  account {:<6} id {}  token {}",
            acct.name, acct.id, acct.token
        );
    }
    let _ = writeln!(out, "  operator token {}  (responder)", c.operator_token);
    for (component, url) in &c.metrics {
        let _ = writeln!(out, "  metrics        {component:<14} {url}");
    }
    let _ = writeln!(
        out,
        "  credentials    {}",
        dir.join("credentials.json").display()
    );
    let _ = writeln!(out, "try:");
    let _ = writeln!(
        out,
        "  curl -s {}/client/v4/accounts/{}/ai/run/{} -H 'Authorization: Bearer {}' -d '{}'",
        c.gateway_url, a.id, c.model, a.token, EXAMPLE_BODY
    );
    let _ = writeln!(out, "Ctrl-C stops everything.");
    let _ = out.flush();
}
