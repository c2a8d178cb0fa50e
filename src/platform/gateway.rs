//! `bulkhead gateway`: authenticates tenants, routes by model slug to the
//! workers the control plane marks routable, enforces visibility and
//! per-account limits, and serves the Workers AI and OpenAI APIs. All
//! configuration is parsed and checked before the port is bound.

use anyhow::Context;
use bulkhead_control_api::{Client, Credentials};
use bulkhead_gateway::{AppState, JwtConfig, JwtKeys, Limiter, Limits, RoutingWatch, app};
use clap::Args;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// Flags of `bulkhead gateway`.
#[derive(Debug, Args)]
pub(crate) struct GatewayArgs {
    /// Address tenants call.
    #[arg(long, default_value = "127.0.0.1:8787")]
    listen: String,
    /// The control plane's internal URL, `https://HOST:PORT`.
    #[arg(long = "control-plane", env = "BULKHEAD_CONTROL_PLANE_URL")]
    control_plane: String,
    #[command(flatten)]
    tls: crate::tls::TlsArgs,
    /// Operator token with the `gateway` role.
    #[arg(long, env = "BULKHEAD_GATEWAY_TOKEN", hide_env_values = true)]
    gateway_token: String,
    /// Redis for rate limits shared by every gateway (in memory without it).
    #[arg(long, env = "REDIS_URL")]
    redis_url: Option<String>,
    /// Prefix of the rate-limit keys in Redis.
    #[arg(long, default_value = "bulkhead:rl")]
    rate_limit_prefix: String,
    /// Requests per minute per account.
    #[arg(long, default_value_t = 300)]
    requests_per_minute: u64,
    /// Tokens (prompt estimate plus max_tokens) per minute per account.
    #[arg(long, default_value_t = 300_000)]
    tokens_per_minute: u64,
    /// Requests in flight per account.
    #[arg(long, default_value_t = 16)]
    concurrency: u64,
    /// Connections open at once, from everyone; past it a new one is closed.
    #[arg(long, default_value_t = 4096)]
    max_connections: usize,
    /// Connections open at once from one address.
    #[arg(long, default_value_t = 256)]
    max_connections_per_address: usize,
    /// Longest a request's headers may take to arrive, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    header_timeout_ms: u64,
    /// Longest a request's body may take to arrive, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    body_timeout_ms: u64,
    /// File holding the HS256 secret for JWTs (at least 32 bytes).
    #[arg(long)]
    jwt_hs256_secret_file: Option<PathBuf>,
    /// JWKS file with the RS256 / EdDSA public keys for JWTs.
    #[arg(long)]
    jwks_file: Option<PathBuf>,
    /// JWKS URL on this host (http://127.0.0.1 or http://localhost, e.g. a
    /// key sidecar), fetched at start; remote key sets go through --jwks-file.
    #[arg(long)]
    jwks_url: Option<String>,
    /// Required JWT issuer (`iss`).
    #[arg(long)]
    jwt_issuer: Option<String>,
    /// Required JWT audience (`aud`).
    #[arg(long)]
    jwt_audience: Option<String>,
    /// The JWT claim naming the account.
    #[arg(long, default_value = "account_id")]
    jwt_account_claim: String,
    /// This gateway's instance name (a random suffix is always added).
    #[arg(long)]
    instance: Option<String>,
    /// Where operators scrape `GET /metrics` (off when absent). Not the
    /// tenant port: metric labels name every model, private ones too.
    #[arg(long)]
    metrics_listen: Option<String>,
    /// Prefix-aware routing: a conversation's requests (its
    /// `x-session-affinity` header, or its first messages) go to the
    /// worker that holds its prefix, within its tenant's namespace, while
    /// that worker's load is near the best. `false`: by load alone.
    #[arg(long, env = "BULKHEAD_PREFIX_AFFINITY", default_value_t = true, action = clap::ArgAction::Set)]
    prefix_affinity: bool,
}

pub(crate) fn run(args: &GatewayArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(serve(args))
}

async fn jwt(args: &GatewayArgs) -> anyhow::Result<Option<JwtConfig>> {
    let secret = match &args.jwt_hs256_secret_file {
        Some(p) => Some(std::fs::read(p).with_context(|| format!("reading {}", p.display()))?),
        None => None,
    };
    let jwks = match (&args.jwks_file, &args.jwks_url) {
        (Some(_), Some(_)) => anyhow::bail!("give --jwks-file or --jwks-url, not both"),
        (Some(p), None) => {
            Some(std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?)
        }
        (None, Some(url)) => Some(
            fetch(url)
                .await
                .with_context(|| format!("fetching {url}"))?,
        ),
        (None, None) => None,
    };
    let keys = match jwks {
        Some(j) => JwtKeys::from_jwks(&j).map_err(anyhow::Error::msg)?,
        None => JwtKeys::default(),
    };
    let mut cfg =
        JwtConfig::new(secret.as_deref().map(trim_newline), keys).map_err(anyhow::Error::msg)?;
    if !cfg.enabled() {
        return Ok(None);
    }
    cfg.issuer = args.jwt_issuer.clone();
    cfg.audience = args.jwt_audience.clone();
    cfg.account_claim = args.jwt_account_claim.clone();
    Ok(Some(cfg))
}

fn trim_newline(s: &[u8]) -> &[u8] {
    s.strip_suffix(b"\n").unwrap_or(s)
}

async fn fetch(url: &str) -> anyhow::Result<String> {
    use http_body_util::{BodyExt, Empty};
    use hyper::body::Bytes;
    let uri: hyper::Uri = url.parse()?;
    // Keys fetched in clear over a network could be swapped in transit;
    // this build has no TLS client, so only loopback URLs are accepted.
    anyhow::ensure!(
        uri.scheme_str() == Some("http")
            && matches!(uri.host(), Some("127.0.0.1" | "localhost" | "[::1]")),
        "--jwks-url must be http://127.0.0.1, http://localhost or http://[::1]; fetch remote key sets into a --jwks-file"
    );
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Empty<Bytes>>();
    let resp = tokio::time::timeout(Duration::from_secs(10), client.get(uri)).await??;
    anyhow::ensure!(resp.status().is_success(), "status {}", resp.status());
    let bytes = resp.into_body().collect().await?.to_bytes();
    Ok(String::from_utf8(bytes.to_vec())?)
}

async fn serve(args: &GatewayArgs) -> anyhow::Result<()> {
    let identity = args.tls.load(bulkhead_trust::Role::Gateway)?;
    let upstream = bulkhead_gateway::Upstream::new(&identity, args.tls.signing_key()?)?;
    let limits = Limits {
        requests_per_minute: args.requests_per_minute,
        tokens_per_minute: args.tokens_per_minute,
        concurrency: args.concurrency.max(1),
    };
    let jwt = jwt(args).await?;
    let limiter = match &args.redis_url {
        Some(url) => Limiter::redis(limits, url, &args.rate_limit_prefix)
            .await
            .with_context(|| "connecting to Redis for rate limits")?,
        None => Limiter::memory(limits),
    };
    let client = Client::with_identity(
        &Credentials {
            control_plane_url: args.control_plane.clone(),
            operator_token: args.gateway_token.clone(),
        },
        &identity,
    )?;
    // A random suffix always: two processes under one name would let one
    // acknowledge flips for the other.
    let mut b = [0u8; 6];
    getrandom::fill(&mut b)?;
    let suffix = hex::encode(b);
    let instance = format!("{}-{suffix}", args.instance.as_deref().unwrap_or("gw"));
    // Budgets live beside the rate limits: shared in Redis, or this
    // process's own; either way an account's counters for a period start
    // from what the ledger says was spent (in Redis: whenever they are
    // missing, so a flush does not reset a spent budget).
    let budgets = match &args.redis_url {
        Some(url) => bulkhead_gateway::Budgets::redis_from_ledger(
            url,
            &args.rate_limit_prefix,
            client.clone(),
        )
        .await
        .with_context(|| "connecting to Redis for budgets")?,
        None => bulkhead_gateway::Budgets::memory_from_ledger(client.clone()),
    };
    let watch = RoutingWatch::start(client, instance.clone());
    if !watch.ready(Duration::from_secs(30)).await {
        anyhow::bail!(
            "no routing table from the control plane at {} within 30 s (is it up, and is the token's role `gateway`?)",
            args.control_plane
        );
    }
    bulkhead_gateway::metrics::register(&watch, &instance);
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let metrics = crate::process::metrics_port(
        args.metrics_listen.as_deref(),
        bulkhead_telemetry::metrics_app(),
    )
    .await?;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "bulkhead gateway: listening http={}{metrics}",
        listener.local_addr()?
    );
    let _ = out.flush();
    drop(out);
    let conn = bulkhead_gateway::ConnLimits {
        max_connections: args.max_connections.max(1),
        max_per_address: args.max_connections_per_address.max(1),
        header_timeout: Duration::from_millis(args.header_timeout_ms.max(1)),
        body_timeout: Duration::from_millis(args.body_timeout_ms.max(1)),
    };
    bulkhead_gateway::serve(
        listener,
        app(AppState::new(watch, jwt, limiter, upstream)
            .with_budgets(budgets)
            .with_affinity(args.prefix_affinity)),
        conn,
        crate::process::shutdown(),
    )
    .await?;
    Ok(())
}
