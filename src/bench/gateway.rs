//! `bulkhead bench gateway`: the gateway's own cost, measured in one run
//! against baselines from the same run. A control plane (SQLite in a temp
//! directory) and two gateways run in this process on real sockets; one
//! colocated worker runs as a child process and registers its pool.
//!
//! - `rps`, `p50_ms`, `p99_ms`: authenticated requests the gateway answers
//!   itself (`GET /v1/models` and a refused private model), from 8
//!   concurrent keep-alive clients.
//! - `added_latency_p50_ms`, `added_latency_p99_ms`: a one-token completion
//!   through the gateway against the same request sent straight to the
//!   worker, alternated; the difference of the percentiles.
//! - `flip_apply_p99_ms`: a visibility flip from request to acknowledgement,
//!   which waits until both gateways applied it.
//! - `metering_added_p50_ms`: a one-token completion of an account with a
//!   budget (its maximum cost reserved at admission and settled at the end)
//!   against the same request of an account without one, alternated on the
//!   same gateway; the workers meter both alike. With `--redis-url`, the
//!   second gateway keeps limits and budgets in that Redis (a budget is
//!   reserved beside the limiter's own round trip) and is measured the same
//!   way (`redis_metering_added_p50_ms`).

use anyhow::Context;
use bulkhead_control_api::{CreateModel, Properties, Role, Timestamp, Visibility};
use bulkhead_control_plane::{AccountId, AppState as CpState, Db, Settings, app as cp_app, store};
use bulkhead_gateway::{AppState, Limiter, Limits, RoutingWatch, app};
use bulkhead_trust::Role as CertRole;
use clap::Args;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::json;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Flags of `bulkhead bench gateway`.
#[derive(Debug, Args)]
pub(crate) struct GatewayBenchArgs {
    /// Seconds of load for the requests the gateway answers itself.
    #[arg(long, default_value_t = 3)]
    seconds: u64,
    /// Full requests through the gateway (and as many straight to the worker).
    #[arg(long, default_value_t = 200)]
    full_requests: usize,
    /// Visibility flips.
    #[arg(long, default_value_t = 40)]
    flips: usize,
    /// Also measure budgets kept in this Redis (the second gateway keeps
    /// its limits and budgets there).
    #[arg(long)]
    redis_url: Option<String>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

const SLUG: &str = "@cf/huggingfacetb/smollm2-135m-instruct";
const HIDDEN: &str = "@cf/bench/hidden";

type Http = HttpClient<HttpConnector, Full<Bytes>>;

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn run(args: &GatewayBenchArgs) -> anyhow::Result<()> {
    let weights = bulkhead_engine::fetch::ensure_default_model(&crate::config::model_source(true))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(bench(args, &weights))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// One completion through the gateway at `gw`; its status.
async fn complete(http: &Http, gw: &str, auth: &str, completion: &str) -> anyhow::Result<u16> {
    let url = format!("{gw}/v1/completions");
    let (status, _) = send(http, "POST", &url, Some(auth), Some(completion.to_owned())).await?;
    Ok(status)
}

async fn send(
    http: &Http,
    method: &str,
    url: &str,
    auth: Option<&str>,
    body: Option<String>,
) -> anyhow::Result<(u16, Bytes)> {
    let mut req = hyper::Request::builder().method(method).uri(url);
    if let Some(a) = auth {
        req = req.header("authorization", a);
    }
    if body.is_some() {
        req = req.header("content-type", "application/json");
    }
    let req = req.body(Full::new(Bytes::from(body.unwrap_or_default())))?;
    let resp = http.request(req).await?;
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await?.to_bytes();
    Ok((status, bytes))
}

async fn bench(args: &GatewayBenchArgs, weights: &std::path::Path) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("bulkhead-bench-gw-{}", std::process::id()));
    let cp = ControlPlane::start(&dir).await?;
    let ids = seed(&cp.db, weights).await?;
    let (worker, worker_addr) = start_worker(&cp, &ids.node_token)?;
    let gateway_id = cp.identity(CertRole::Gateway)?;
    let gateways = start_gateways(args, &cp, &ids.gw_token, &gateway_id).await?;
    let gw = gateways[0].clone();
    let auth = format!("Bearer {}", ids.token);
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let http: Http = HttpClient::builder(TokioExecutor::new()).build(connector);
    let completion =
        json!({"model": SLUG, "prompt": "Hi", "max_tokens": 1, "temperature": 0}).to_string();
    wait_routable(&http, &gw, &auth, &completion).await?;

    // 1. Requests the gateway answers itself.
    let hidden = format!("{gw}/client/v4/accounts/{}/ai/run/{HIDDEN}", ids.account);
    let (rps, own) = own_answers(&http, &gw, &hidden, &auth, args.seconds).await?;

    // 2. Added latency on a full request, and what budget metering adds.
    let direct_call = DirectCall::new(&gateway_id, worker_addr, &ids.account, &cp.keys)?;
    let (via_gw, direct) = gateway_vs_direct(
        &http,
        &gw,
        &auth,
        &completion,
        &direct_call,
        args.full_requests,
    )
    .await?;
    let budgeted = format!("Bearer {}", ids.budgeted_token);
    let (unmetered, metered) = metering_cost(
        &http,
        &gw,
        [&auth, &budgeted],
        &completion,
        args.full_requests,
    )
    .await?;
    // With Redis, the second gateway keeps its limits and budgets there.
    let redis_metering_p50 = match &args.redis_url {
        Some(_) => Some(
            metering_added(
                &http,
                &gateways[1],
                [&auth, &budgeted],
                &completion,
                args.full_requests,
            )
            .await?,
        ),
        None => None,
    };

    // 3. Flips, each acknowledged after both gateways applied it. A routing
    // hub younger than its lease waits the lease out (it cannot know every
    // gateway yet), so let it come of age first.
    let age = cp.started.elapsed();
    if age < Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_secs(2) - age).await;
    }
    let flips = flip_times(&cp.url, &ids.admin, args.flips).await?;
    drop(worker);

    // 4. What the protections add to one worker call (see protection_cost).
    let (plain, protected) = protection_cost(
        &gateway_id,
        &cp.identity(CertRole::Colocated)?,
        &cp.keys,
        args.full_requests.max(50),
    )
    .await?;
    let _ = std::fs::remove_dir_all(&dir);

    let out = Figures {
        rps,
        own,
        via_gw,
        direct,
        flips,
        plain,
        protected,
        metered,
        unmetered,
        redis_metering_p50,
    }
    .json();
    if args.json {
        println!("{out}");
    } else {
        print_report(&out);
    }
    Ok(())
}

/// What one run measured: sorted latencies (ms) and rates.
struct Figures {
    rps: f64,
    own: Vec<f64>,
    via_gw: Vec<f64>,
    direct: Vec<f64>,
    flips: Vec<f64>,
    plain: Vec<f64>,
    protected: Vec<f64>,
    metered: Vec<f64>,
    unmetered: Vec<f64>,
    redis_metering_p50: Option<f64>,
}

impl Figures {
    /// The figures `--json` prints.
    fn json(&self) -> serde_json::Value {
        let p = percentile;
        json!({
            "rps": self.rps,
            "p50_ms": p(&self.own, 0.5),
            "p99_ms": p(&self.own, 0.99),
            "added_latency_p50_ms": p(&self.via_gw, 0.5) - p(&self.direct, 0.5),
            "added_latency_p99_ms": p(&self.via_gw, 0.99) - p(&self.direct, 0.99),
            "flip_apply_p99_ms": p(&self.flips, 0.99),
            "full_request_p50_ms": p(&self.via_gw, 0.5),
            "direct_request_p50_ms": p(&self.direct, 0.5),
            "flip_apply_p50_ms": p(&self.flips, 0.5),
            "requests": self.own.len(),
            "call_plain_p50_ms": p(&self.plain, 0.5),
            "call_protected_p50_ms": p(&self.protected, 0.5),
            "protections_added_p50_ms": p(&self.protected, 0.5) - p(&self.plain, 0.5),
            "metered_request_p50_ms": p(&self.metered, 0.5),
            "unmetered_request_p50_ms": p(&self.unmetered, 0.5),
            "metering_added_p50_ms": p(&self.metered, 0.5) - p(&self.unmetered, 0.5),
            "redis_metering_added_p50_ms": self.redis_metering_p50,
        })
    }
}

/// The figures of one run as sentences.
fn print_report(out: &serde_json::Value) {
    let f = |k: &str| out[k].as_f64().unwrap_or(f64::NAN);
    println!(
        "gateway-answered requests: {:.0} req/s, p50 {:.3} ms, p99 {:.3} ms ({} requests, 8 clients)",
        f("rps"),
        f("p50_ms"),
        f("p99_ms"),
        out["requests"]
    );
    println!(
        "full request (1 token): via gateway p50 {:.3} ms, direct p50 {:.3} ms; added p50 {:.3} ms, p99 {:.3} ms (target < 2 ms at p50)",
        f("full_request_p50_ms"),
        f("direct_request_p50_ms"),
        f("added_latency_p50_ms"),
        f("added_latency_p99_ms")
    );
    println!(
        "visibility flip applied by both gateways: p50 {:.2} ms, p99 {:.2} ms (target < 100 ms at p99)",
        f("flip_apply_p50_ms"),
        f("flip_apply_p99_ms")
    );
    println!(
        "worker call protections (mutual TLS + signed tenant context): p50 {:.3} ms protected vs {:.3} ms plain; added {:.3} ms (target <= 0.5 ms)",
        f("call_protected_p50_ms"),
        f("call_plain_p50_ms"),
        f("protections_added_p50_ms")
    );
    println!(
        "budget metering (reserve at admission, settle at the end): p50 {:.3} ms with a budget vs {:.3} ms without; added {:.3} ms (target < 0.2 ms at p50)",
        f("metered_request_p50_ms"),
        f("unmetered_request_p50_ms"),
        f("metering_added_p50_ms")
    );
    if let Some(r) = out["redis_metering_added_p50_ms"].as_f64() {
        println!(
            "budget metering in Redis (one script at admission, one detached at the end): added p50 {r:.3} ms"
        );
    }
}

/// The control plane of a run: SQLite in `dir`, its public listener and its
/// internal mutual-TLS one, and the CA and context keys made for the run.
struct ControlPlane {
    db: Db,
    url: String,
    internal_url: String,
    tls: std::path::PathBuf,
    keys: bulkhead_worker_api::context::SigningKey,
    started: Instant,
}

impl ControlPlane {
    async fn start(dir: &std::path::Path) -> anyhow::Result<ControlPlane> {
        std::fs::create_dir_all(dir)?;
        let db = Db::connect(&Db::sqlite_url(&dir.join("bench.db"))).await?;
        let mut settings = Settings {
            page_name: "Bulkhead".to_owned(),
            public_url: "http://127.0.0.1".to_owned(),
            node_ttl: Duration::from_secs(60),
            heartbeat_interval: Duration::from_secs(5),
            status_cache: Duration::from_secs(1),
            gateway_lease: Duration::from_secs(2),
            contexts: bulkhead_worker_api::context::VerifyingKeys::none(),
        };
        // Every internal hop is mutual TLS, as in production: identities
        // from a CA made for this run.
        let tls = dir.join("tls");
        bulkhead_trust::authority::init_dir(&tls, &CertRole::ALL)?;
        bulkhead_worker_api::context::SigningKey::create(
            &tls.join(crate::tls::CONTEXT_SIGN),
            &tls.join(crate::tls::CONTEXT_PUB),
        )?;
        let keys =
            bulkhead_worker_api::context::SigningKey::load(&tls.join(crate::tls::CONTEXT_SIGN))?;
        settings.contexts = keys.verifying();
        let cp = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", cp.local_addr()?);
        let internal = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let acceptor = bulkhead_trust::Identity::load(
            &bulkhead_trust::TlsFiles::in_dir(&tls, CertRole::ControlPlane),
            CertRole::ControlPlane,
        )?
        .acceptor(&[CertRole::Gateway, CertRole::Colocated])?;
        let internal = bulkhead_trust::TlsListener::new(internal, acceptor)?;
        let internal_url = format!("https://{}", internal.local_addr());
        let router = cp_app(CpState::new(db.clone(), settings));
        let inside = router
            .clone()
            .into_make_service_with_connect_info::<bulkhead_trust::Peer>();
        tokio::spawn(async move { axum::serve(crate::process::nodelay(cp), router).await });
        tokio::spawn(async move { axum::serve(internal, inside).await });
        Ok(ControlPlane {
            db,
            url,
            internal_url,
            tls,
            keys,
            started: Instant::now(),
        })
    }

    fn identity(&self, role: CertRole) -> anyhow::Result<bulkhead_trust::Identity> {
        Ok(bulkhead_trust::Identity::load(
            &bulkhead_trust::TlsFiles::in_dir(&self.tls, role),
            role,
        )?)
    }
}

/// The run's operators, accounts and tokens.
struct Ids {
    admin: String,
    gw_token: String,
    node_token: String,
    account: String,
    token: String,
    budgeted_token: String,
}

/// Operators, an account without a budget and one with, and the two models
/// (public and private) with the weights' config.
async fn seed(db: &Db, weights: &std::path::Path) -> anyhow::Result<Ids> {
    let now = Timestamp::now();
    let mut c = db.pool().acquire().await?;
    let admin = store::operators::create(&mut c, "bench-admin", Role::Admin, now)
        .await?
        .token;
    let gw_token = store::operators::create(&mut c, "bench-gateway", Role::Gateway, now)
        .await?
        .token;
    let node_token = store::operators::create(&mut c, "bench-node", Role::Node, now)
        .await?
        .token;
    let account = store::accounts::create(&mut c, "bench", now).await?.id;
    let id = AccountId::parse(&account).context("account id")?;
    let token = store::api_tokens::create(&mut c, &id, "bench", now)
        .await?
        .token;
    let budgeted = store::accounts::create(&mut c, "bench-budgeted", now)
        .await?
        .id;
    let budgeted = AccountId::parse(&budgeted).context("account id")?;
    let budget = bulkhead_control_api::Budget {
        daily_neurons: Some(1_000_000_000),
        monthly_neurons: Some(1_000_000_000),
        free_neurons_per_day: 0,
    };
    store::accounts::set_budget(&mut c, &budgeted, &budget).await?;
    let budgeted_token = store::api_tokens::create(&mut c, &budgeted, "bench", now)
        .await?
        .token;
    let sha = bulkhead_engine::fetch::sha256_file(weights)?;
    for (slug, vis) in [(SLUG, Visibility::Public), (HIDDEN, Visibility::Private)] {
        let m = store::models::create(
            &mut c,
            &CreateModel {
                slug: slug.parse()?,
                task: "Text Generation".to_owned(),
                description: String::new(),
                visibility: vis,
                config: None,
            },
            now,
        )
        .await?;
        let limits = Properties {
            context_window: 2048,
            max_output: 256,
        };
        let spec = crate::platform::up::config(&sha, "q4_1", limits, 64 << 20);
        let v = store::configs::add(&mut c, &m, &spec, "bench", now).await?;
        store::configs::activate(&mut c, &m, v, "bench", "", now, Duration::from_secs(60)).await?;
    }
    drop(c);

    Ok(Ids {
        admin,
        gw_token,
        node_token,
        account,
        token,
        budgeted_token,
    })
}

/// The colocated worker, registered with the control plane; its address.
fn start_worker(cp: &ControlPlane, node_token: &str) -> anyhow::Result<(KillOnDrop, String)> {
    let mut child = Command::new(std::env::current_exe()?)
        .args([
            "serve",
            "--http",
            "127.0.0.1:0",
            "--kv-budget-mib",
            "64",
            "--control-plane",
            &cp.internal_url,
            "--node-token",
            node_token,
            "--node-name",
            "bench-worker",
        ])
        .env("BULKHEAD_TLS_DIR", &cp.tls)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdout = child.stdout.take().context("worker stdout")?;
    let worker = KillOnDrop(child);
    let line = BufReader::new(stdout)
        .lines()
        .next()
        .context("worker announcement")??;
    let worker_addr = line
        .split("http=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .context("worker address")?
        .to_owned();

    Ok((worker, worker_addr))
}

/// Two gateways on sockets; their URLs.
async fn start_gateways(
    args: &GatewayBenchArgs,
    cp: &ControlPlane,
    gw_token: &str,
    gateway_id: &bulkhead_trust::Identity,
) -> anyhow::Result<Vec<String>> {
    let mut gateways = Vec::new();
    for i in 0..2 {
        let client = bulkhead_control_api::Client::with_identity(
            &bulkhead_control_api::Credentials {
                control_plane_url: cp.internal_url.clone(),
                operator_token: gw_token.to_owned(),
            },
            gateway_id,
        )?;
        let watch = RoutingWatch::start(client, format!("bench-{i}"));
        anyhow::ensure!(
            watch.ready(Duration::from_secs(10)).await,
            "no routing table"
        );
        let limits = Limits {
            requests_per_minute: u64::MAX / 4,
            tokens_per_minute: u64::MAX / 4,
            concurrency: 1024,
        };
        // The second gateway keeps limits and budgets in Redis when given
        // one, as a fleet does.
        let prefix = format!("bulkhead-bench-{}", std::process::id());
        let limiter = match (i, &args.redis_url) {
            (1, Some(url)) => Limiter::redis(limits, url, &prefix).await?,
            _ => Limiter::memory(limits),
        };
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        gateways.push(format!("http://{}", l.local_addr()?));
        let upstream = bulkhead_gateway::Upstream::new(gateway_id, cp.keys.clone())?;
        let mut state = AppState::new(watch, None, limiter, upstream);
        if let (1, Some(url)) = (i, &args.redis_url) {
            state = state.with_budgets(bulkhead_gateway::Budgets::redis(url, &prefix).await?);
        }
        let router = app(state);
        tokio::spawn(async move { axum::serve(crate::process::nodelay(l), router).await });
    }
    Ok(gateways)
}

/// Waits until the worker is routable through `gw`.
async fn wait_routable(http: &Http, gw: &str, auth: &str, completion: &str) -> anyhow::Result<()> {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let s = complete(http, gw, auth, completion).await?;
        if s == 200 {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < until,
            "the worker never became routable (last status {s})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Requests per second and sorted latencies (ms) of requests the gateway
/// answers itself, from 8 keep-alive clients for `seconds`.
async fn own_answers(
    http: &Http,
    gw: &str,
    hidden: &str,
    auth: &str,
    seconds: u64,
) -> anyhow::Result<(f64, Vec<f64>)> {
    let deadline = Instant::now() + Duration::from_secs(seconds.max(1));
    let mut tasks = Vec::new();
    for t in 0..8 {
        let (http, auth, gw, hidden) = (
            http.clone(),
            auth.to_owned(),
            gw.to_owned(),
            hidden.to_owned(),
        );
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = t;
            while Instant::now() < deadline {
                let start = Instant::now();
                let (s, _) = if i % 2 == 0 {
                    send(&http, "GET", &format!("{gw}/v1/models"), Some(&auth), None).await?
                } else {
                    send(
                        &http,
                        "POST",
                        &hidden,
                        Some(&auth),
                        Some(r#"{"prompt":"x"}"#.to_owned()),
                    )
                    .await?
                };
                anyhow::ensure!(s == 200 || s == 400, "unexpected status {s}");
                lat.push(start.elapsed().as_secs_f64() * 1000.0);
                i += 1;
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    let started = Instant::now();
    let mut own = Vec::new();
    for t in tasks {
        own.extend(t.await??);
    }
    let rps = own.len() as f64 / started.elapsed().as_secs_f64();
    let own = sorted(own);

    Ok((rps, own))
}

/// The worker called directly, as the gateway calls it.
struct DirectCall {
    worker: HttpClient<bulkhead_trust::connect::Connector, Full<Bytes>>,
    addr: String,
    account: String,
    keys: bulkhead_worker_api::context::SigningKey,
}

impl DirectCall {
    fn new(
        gateway: &bulkhead_trust::Identity,
        addr: String,
        account: &str,
        keys: &bulkhead_worker_api::context::SigningKey,
    ) -> anyhow::Result<DirectCall> {
        Ok(DirectCall {
            worker: HttpClient::builder(TokioExecutor::new()).build(
                bulkhead_trust::connect::Connector::new(gateway, &[CertRole::Colocated])?,
            ),
            addr,
            account: account.to_owned(),
            keys: keys.clone(),
        })
    }
}

/// Sorted latencies (ms) of `n` one-token completions through the gateway
/// and as many straight to the worker, alternated.
async fn gateway_vs_direct(
    http: &Http,
    gw: &str,
    auth: &str,
    completion: &str,
    direct_call: &DirectCall,
    n: usize,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let direct_body = json!({"raw": "Hi", "max_tokens": 1}).to_string();
    let (mut via_gw, mut direct) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let start = Instant::now();
        let s = complete(http, gw, auth, completion).await?;
        anyhow::ensure!(s == 200, "gateway status {s}");
        via_gw.push(start.elapsed().as_secs_f64() * 1000.0);
        let start = Instant::now();
        let statement = bulkhead_worker_api::context::TenantContext::new(
            &direct_call.account,
            1,
            format!("bench-{}", direct.len()),
            SLUG,
            None,
            1,
            None,
            std::time::SystemTime::now(),
        );
        let mut req = hyper::Request::post(format!("https://{}/v1/generate", direct_call.addr))
            .header(
                bulkhead_worker_api::context::CONTEXT_HEADER,
                direct_call.keys.sign(&statement),
            )
            .header("content-type", "application/json");
        req = req.header("connection", "keep-alive");
        let resp = direct_call
            .worker
            .request(req.body(Full::new(Bytes::from(direct_body.clone())))?)
            .await?;
        anyhow::ensure!(resp.status() == 200, "worker status {}", resp.status());
        resp.into_body().collect().await?;
        direct.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    Ok((sorted(via_gw), sorted(direct)))
}

/// Sorted times (ms) of `n` visibility flips from request to the
/// acknowledgement that both gateways applied it.
async fn flip_times(cp_url: &str, admin: &str, n: usize) -> anyhow::Result<Vec<f64>> {
    let cp_http = bulkhead_control_api::Client::new(&bulkhead_control_api::Credentials {
        control_plane_url: cp_url.to_owned(),
        operator_token: admin.to_owned(),
    })?;
    let path = format!(
        "/admin/v1/models/{}/visibility",
        HIDDEN.replace('@', "%40").replace('/', "%2F")
    );
    let mut flips = Vec::new();
    for i in 0..n {
        let to = if i % 2 == 0 { "public" } else { "private" };
        let start = Instant::now();
        let v: serde_json::Value = cp_http
            .post(&path, &json!({"visibility": to, "reason": "bench"}))
            .await?;
        flips.push(start.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(
            v["propagation"]["applied"] == 2 && v["propagation"]["gateways"] == 2,
            "a flip was not applied by both gateways: {v}"
        );
    }
    Ok(sorted(flips))
}

/// What a budget adds at p50 (ms) on `gw`: [`metering_cost`]'s difference.
async fn metering_added(
    http: &Http,
    gw: &str,
    auth: [&str; 2],
    completion: &str,
    n: usize,
) -> anyhow::Result<f64> {
    let (unmetered, metered) = metering_cost(http, gw, auth, completion, n).await?;
    Ok(percentile(&metered, 0.5) - percentile(&unmetered, 0.5))
}

/// Latencies (ms) of `n` one-token completions through `gw` for an account
/// without a budget and one with, alternated (and which goes first too).
async fn metering_cost(
    http: &Http,
    gw: &str,
    auth: [&str; 2],
    completion: &str,
    n: usize,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let mut out = [Vec::with_capacity(n), Vec::with_capacity(n)];
    for i in 0..n {
        // Which account goes first alternates, so neither always follows
        // the other's request.
        let order = if i % 2 == 0 { [0, 1] } else { [1, 0] };
        for k in order {
            let (who, lat) = (auth[k], &mut out[k]);
            let start = Instant::now();
            let s = complete(http, gw, who, completion).await?;
            anyhow::ensure!(s == 200, "gateway status {s}");
            lat.push(start.elapsed().as_secs_f64() * 1000.0);
        }
    }
    let [a, b] = out;
    Ok((sorted(a), sorted(b)))
}

/// Latencies (ms) of `n` calls to a one-line `/v1/generate`, plain and
/// protected: the worker side checks the caller's certificate role and the
/// signed context (and spends its id) exactly as a worker does; the client
/// signs a fresh context per call, as the gateway does.
async fn protection_cost(
    gateway: &bulkhead_trust::Identity,
    worker: &bulkhead_trust::Identity,
    keys: &bulkhead_worker_api::context::SigningKey,
    n: usize,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    use bulkhead_worker_api::context::{CONTEXT_HEADER, ReplayGuard, TenantContext};
    let line = "{\"finish_reason\":\"length\",\"text\":\"\",\"usage\":{}}\n";
    let plain_app = axum::Router::new().route(
        "/v1/generate",
        axum::routing::post(move |_body: Bytes| async move { line }),
    );
    let guard = std::sync::Arc::new(std::sync::Mutex::new(ReplayGuard::default()));
    let ring = keys.verifying();
    let protected_app = axum::Router::new().route(
        "/v1/generate",
        axum::routing::post(
            move |bulkhead_trust::CallerRole(caller): bulkhead_trust::CallerRole,
                  headers: axum::http::HeaderMap,
                  _body: Bytes| {
                let (ring, guard) = (ring.clone(), std::sync::Arc::clone(&guard));
                async move {
                    let refused = (axum::http::StatusCode::FORBIDDEN, "refused\n");
                    if caller != Some(CertRole::Gateway) {
                        return Err(refused);
                    }
                    let header = headers
                        .get(CONTEXT_HEADER)
                        .and_then(|v| v.to_str().ok())
                        .ok_or(refused)?;
                    let ctx = ring
                        .verify(header, std::time::SystemTime::now())
                        .map_err(|_| refused)?;
                    guard
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .admit(&ctx, std::time::SystemTime::now())
                        .map_err(|_| refused)?;
                    Ok(line)
                }
            },
        ),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let plain_addr = l.local_addr()?;
    tokio::spawn(async move { axum::serve(crate::process::nodelay(l), plain_app).await });
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let l = bulkhead_trust::TlsListener::new(l, worker.acceptor(&[CertRole::Gateway])?)?;
    let tls_addr = l.local_addr();
    tokio::spawn(async move {
        axum::serve(
            l,
            protected_app.into_make_service_with_connect_info::<bulkhead_trust::Peer>(),
        )
        .await
    });
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let plain: Http = HttpClient::builder(TokioExecutor::new()).build(connector);
    let tls = HttpClient::builder(TokioExecutor::new()).build(
        bulkhead_trust::connect::Connector::new(gateway, &[worker.role()])?,
    );
    let body = json!({"raw": "Hi", "max_tokens": 1}).to_string();
    let (mut a, mut b) = (Vec::with_capacity(n), Vec::with_capacity(n));
    // One warm-up call each (connection set-up is not per request).
    for i in 0..=n {
        let start = Instant::now();
        let req = hyper::Request::post(format!("http://{plain_addr}/v1/generate"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.clone())))?;
        let took = timed(&plain, req, "plain", start).await?;
        if i > 0 {
            a.push(took);
        }
        // The protected call's time includes signing its context.
        let start = Instant::now();
        let ctx = TenantContext::new(
            &"0".repeat(32),
            1,
            format!("bench-protected-{i}"),
            SLUG,
            Some(1),
            1,
            Some(2048),
            std::time::SystemTime::now(),
        );
        let req = hyper::Request::post(format!("https://{tls_addr}/v1/generate"))
            .header("content-type", "application/json")
            .header(CONTEXT_HEADER, keys.sign(&ctx))
            .body(Full::new(Bytes::from(body.clone())))?;
        let took = timed(&tls, req, "protected", start).await?;
        if i > 0 {
            b.push(took);
        }
    }
    Ok((sorted(a), sorted(b)))
}

/// Milliseconds from `start` to the end of the body of `req`'s answer
/// through `client`, which must be a 200.
async fn timed<C>(
    client: &HttpClient<C, Full<Bytes>>,
    req: hyper::Request<Full<Bytes>>,
    what: &str,
    start: Instant,
) -> anyhow::Result<f64>
where
    C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    let resp = client.request(req).await?;
    anyhow::ensure!(resp.status() == 200, "{what} call: {}", resp.status());
    resp.into_body().collect().await?;
    Ok(start.elapsed().as_secs_f64() * 1000.0)
}
