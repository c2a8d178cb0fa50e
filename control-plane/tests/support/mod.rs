//! Test harness: every scenario runs once per backend, on a fresh SQLite
//! file and on a fresh schema of the PostgreSQL server (`DATABASE_URL` when
//! it names one, else `postgres://postgres@127.0.0.1:5432/test`). With
//! `CI=true` an unreachable PostgreSQL fails the test instead of skipping it.

// Tests read their services from the environment (clippy.toml keeps
// library code from it).
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)]
#![allow(dead_code, unreachable_pub)]

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use bulkhead_control_api::{Role, Timestamp};
use bulkhead_control_plane::{AppState, Backend, Db, Settings, app, store};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use sqlx::Connection;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tower::ServiceExt;

static COUNTER: AtomicU64 = AtomicU64::new(0);

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        Timestamp::now().millis() % 1_000_000
    )
}

/// One database for one scenario, removed afterwards.
pub struct TestDb {
    pub db: Db,
    cleanup: Cleanup,
}

enum Cleanup {
    File(PathBuf),
    Schema { base: String, schema: String },
}

impl TestDb {
    pub fn label(&self) -> String {
        self.db.backend().to_string()
    }

    async fn remove(self) {
        self.db.close().await;
        match self.cleanup {
            Cleanup::File(p) => {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", p.display()));
                }
            }
            Cleanup::Schema { base, schema } => {
                if let Ok(mut c) = sqlx::PgConnection::connect(&base).await {
                    let _ =
                        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
                            .execute(&mut c)
                            .await;
                }
            }
        }
    }
}

pub fn postgres_base_url() -> String {
    match std::env::var("DATABASE_URL") {
        Ok(u) if u.starts_with("postgres") => u,
        _ => "postgres://postgres@127.0.0.1:5432/test".to_owned(),
    }
}

/// A fresh SQLite database and, when reachable, a fresh PostgreSQL schema.
pub async fn backends() -> Vec<TestDb> {
    let mut out = Vec::new();
    let path = std::env::temp_dir().join(format!("{}.db", unique("bulkhead_cp")));
    let db = Db::connect(&Db::sqlite_url(&path))
        .await
        .expect("open SQLite");
    assert_eq!(db.backend(), Backend::Sqlite);
    out.push(TestDb {
        db,
        cleanup: Cleanup::File(path),
    });
    let base = postgres_base_url();
    match sqlx::PgConnection::connect(&base).await {
        Ok(mut c) => {
            drop_orphaned_schemas(&mut c).await;
            let schema = unique("bh_test");
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
                .execute(&mut c)
                .await
                .expect("create a test schema");
            let sep = if base.contains('?') { '&' } else { '?' };
            let url = format!("{base}{sep}options=-csearch_path%3D{schema}");
            let db = Db::connect(&url).await.expect("open PostgreSQL");
            assert_eq!(db.backend(), Backend::Postgres);
            out.push(TestDb {
                db,
                cleanup: Cleanup::Schema { base, schema },
            });
        }
        Err(e) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("CI=true but PostgreSQL at {base} is unreachable: {e}")
        }
        Err(e) => {
            eprintln!("note: PostgreSQL at {base} unreachable ({e}); this run covers SQLite only")
        }
    }
    out
}

/// Drops test schemas left by test processes that died mid-scenario (a
/// failed assertion skips the cleanup); the owning pid is in the name.
async fn drop_orphaned_schemas(c: &mut sqlx::PgConnection) {
    let names: Vec<(String,)> =
        sqlx::query_as("SELECT schema_name::text FROM information_schema.schemata WHERE schema_name LIKE 'bh_test_%'")
            .fetch_all(&mut *c)
            .await
            .unwrap_or_default();
    for (name,) in names {
        let pid = name.split('_').nth(2).and_then(|p| p.parse::<u32>().ok());
        let alive = pid.is_some_and(|p| {
            p == std::process::id() || std::path::Path::new(&format!("/proc/{p}")).exists()
        });
        if !alive {
            let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {name} CASCADE")))
                .execute(&mut *c)
                .await;
        }
    }
}

/// A `#[tokio::test]` named `$name` that runs `$body` (a block evaluating
/// to `anyhow::Result<()>`, with `$h` the harness) on every backend.
#[allow(unused_macros)]
macro_rules! backend_test {
    ($name:ident, |$h:ident| $body:block) => {
        #[tokio::test]
        async fn $name() {
            $crate::support::each_backend(|$h| async move { $body }).await;
        }
    };
}

/// Runs `scenario` once per backend; a failure names the backend.
pub async fn each_backend<F, Fut>(scenario: F)
where
    F: Fn(Harness) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    each_backend_with(Duration::from_secs(60), scenario).await
}

/// As [`each_backend`], with a given node liveness limit.
pub async fn each_backend_with<F, Fut>(node_ttl: Duration, scenario: F)
where
    F: Fn(Harness) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    for t in backends().await {
        let label = t.label();
        let h = Harness::new(t.db.clone(), node_ttl).await;
        let result = scenario(h).await;
        t.remove().await;
        if let Err(e) = result {
            panic!("[{label}] {e:?}");
        }
    }
}

/// The router over one database, with one token per role.
pub struct Harness {
    pub db: Db,
    pub app: Router,
    pub admin: String,
    pub responder: String,
    pub node: String,
    pub gateway: String,
}

/// The gateway's context signing key in these tests.
pub fn gateway_key() -> bulkhead_worker_api::context::SigningKey {
    bulkhead_worker_api::context::SigningKey::from_seed("test", &[42; 32]).expect("key")
}

/// The context the gateway signed for call `call` of `account` on `model`.
pub fn signed_call(call: &str, account: &str, model: &str) -> String {
    let mut ctx = bulkhead_worker_api::context::TenantContext::new(
        account,
        1,
        call.to_owned(),
        model,
        None,
        256,
        None,
        std::time::SystemTime::now(),
    );
    ctx.request_id = call.to_owned();
    gateway_key().sign(&ctx)
}

impl Harness {
    async fn new(db: Db, node_ttl: Duration) -> Harness {
        let now = Timestamp::now();
        let mut conn = db.pool().acquire().await.expect("connection");
        let mut token = async |name: &str, role: Role| {
            store::operators::create(&mut conn, name, role, now)
                .await
                .expect("operator")
                .token
        };
        let admin = token("ada-admin", Role::Admin).await;
        let responder = token("rita-responder", Role::Responder).await;
        let node = token("worker-fleet", Role::Node).await;
        let gateway = token("edge", Role::Gateway).await;
        drop(conn);
        let settings = Settings {
            page_name: "Bulkhead".to_owned(),
            public_url: "http://status.test:8788".to_owned(),
            node_ttl,
            heartbeat_interval: Duration::from_secs(5),
            status_cache: Duration::ZERO,
            gateway_lease: Duration::from_secs(3),
            contexts: gateway_key().verifying(),
        };
        Harness {
            app: app(AppState::new(db.clone(), settings)),
            db,
            admin,
            responder,
            node,
            gateway,
        }
    }

    /// One request through the real router; the body parsed as JSON (or
    /// `Value::String` when it is not JSON).
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let (status, _, text) = self.raw(method, path, token, body).await;
        let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, v)
    }

    /// One request; status, content type and body text.
    pub async fn raw(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, String, String) {
        let mut req = Request::builder().method(method).uri(path);
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let peer = caller(path, body.as_ref());
        let body = match body {
            Some(v) => {
                req = req.header("content-type", "application/json");
                Body::from(v.to_string())
            }
            None => Body::empty(),
        };
        let mut req = req.body(body).expect("request");
        if let Some(role) = peer {
            req.extensions_mut()
                .insert(axum::extract::ConnectInfo(bulkhead_trust::Peer {
                    addr: std::net::SocketAddr::from(([127, 0, 0, 1], 9)),
                    role: Some(role),
                    scope: Default::default(),
                }));
        }
        let resp = self.app.clone().oneshot(req).await.expect("router");
        let status = resp.status();
        let ctype = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        (status, ctype, String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Creates an operator as the admin; the answer (`token`, `operator`).
    pub async fn create_operator(&self, name: &str, role: &str) -> anyhow::Result<Value> {
        let body = json!({"name": name, "role": role});
        let path = "/admin/v1/operators";
        self.post(path, &self.admin, Some(body), StatusCode::CREATED)
            .await
    }

    /// The responder flips [`SLUG`] to `visibility` for `reason`, insisting
    /// on 200; the answer (with its `propagation`).
    pub async fn flip(&self, visibility: &str, reason: &str) -> anyhow::Result<Value> {
        let path = format!("/admin/v1/models/{SLUG_PATH}/visibility");
        let body = json!({"visibility": visibility, "reason": reason});
        self.post(&path, &self.responder, Some(body), StatusCode::OK)
            .await
    }

    /// `GET path` of the public routes, without a token.
    pub async fn public(&self, path: &str) -> (StatusCode, Value) {
        self.call(Method::GET, path, None, None).await
    }

    /// `POST path` of `body` with `token`, whatever the answer.
    pub async fn attempt(&self, path: &str, token: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, path, Some(token), Some(body)).await
    }

    /// `GET path` with `token`, insisting on 200.
    pub async fn get(&self, path: &str, token: &str) -> anyhow::Result<Value> {
        self.ok(Method::GET, path, token, None, StatusCode::OK)
            .await
    }

    /// `POST path` with `token`, insisting on `expected`.
    pub async fn post(
        &self,
        path: &str,
        token: &str,
        body: Option<Value>,
        expected: StatusCode,
    ) -> anyhow::Result<Value> {
        self.ok(Method::POST, path, token, body, expected).await
    }

    /// Registers a node as the node operator, insisting on 200.
    pub async fn register(&self, body: Value) -> anyhow::Result<Value> {
        let path = "/admin/v1/nodes";
        self.ok(Method::POST, path, &self.node, Some(body), StatusCode::OK)
            .await
    }

    /// Activates [`SLUG`]'s config `version` as the admin; the status and
    /// body, whatever they are.
    pub async fn activate(&self, version: u32, body: Option<Value>) -> (StatusCode, Value) {
        let path = format!("{}/{version}/activate", configs_path());
        self.call(Method::POST, &path, Some(&self.admin), body)
            .await
    }

    /// Creates a model as the admin (201).
    pub async fn create_model(&self, slug: &str, visibility: &str) -> anyhow::Result<Value> {
        let body =
            serde_json::json!({"slug": slug, "task": "Text Generation", "visibility": visibility});
        self.post(
            "/admin/v1/models",
            &self.admin,
            Some(body),
            StatusCode::CREATED,
        )
        .await
    }

    /// Creates an account as the admin (201); its view.
    pub async fn create_account(&self, name: &str) -> anyhow::Result<Value> {
        let body = serde_json::json!({ "name": name });
        self.post(
            "/admin/v1/accounts",
            &self.admin,
            Some(body),
            StatusCode::CREATED,
        )
        .await
    }

    /// Adds a config to [`SLUG`] as the admin (201).
    pub async fn add_config(&self, spec: Value) -> anyhow::Result<Value> {
        self.post(
            &configs_path(),
            &self.admin,
            Some(spec),
            StatusCode::CREATED,
        )
        .await
    }

    /// Activates [`SLUG`]'s config `version` as the admin, insisting on 200.
    pub async fn activate_ok(&self, version: u32, body: Option<Value>) -> anyhow::Result<Value> {
        let path = format!("{}/{version}/activate", configs_path());
        self.post(&path, &self.admin, body, StatusCode::OK).await
    }

    /// `call` that insists on `expected`.
    pub async fn ok(
        &self,
        method: Method,
        path: &str,
        token: &str,
        body: Option<Value>,
        expected: StatusCode,
    ) -> anyhow::Result<Value> {
        let (status, v) = self.call(method.clone(), path, Some(token), body).await;
        anyhow::ensure!(status == expected, "{method} {path}: {status} {v}");
        Ok(v)
    }
}

/// `req` as if it came over the internal port with the gateway's
/// certificate.
pub fn from_gateway(mut req: axum::http::Request<Body>) -> axum::http::Request<Body> {
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(bulkhead_trust::Peer {
            addr: std::net::SocketAddr::from(([127, 0, 0, 1], 9)),
            role: Some(bulkhead_trust::Role::Gateway),
            scope: Default::default(),
        }));
    req
}

/// The certificate a real caller of `path` would present on the internal
/// port (as the server's mutual TLS would record it): a worker's, of the
/// role it registers, for node calls; the gateway's for the routing table,
/// usage voids, tenants' files and batches; the batch runner's for batch runs.
/// Tests of what a missing or wrong certificate gets live in the root
/// crate's tests/control_plane.rs, over real sockets.
fn caller(path: &str, body: Option<&Value>) -> Option<bulkhead_trust::Role> {
    use bulkhead_trust::Role;
    if path.starts_with("/admin/v1/routing")
        || path.starts_with("/admin/v1/usage/void")
        || path.starts_with("/admin/v1/files")
        || path.starts_with("/admin/v1/batches")
    {
        return Some(Role::Gateway);
    }
    if path.starts_with("/admin/v1/batch-runs") {
        return Some(Role::BatchRunner);
    }
    if path.starts_with("/admin/v1/usage") && body.is_some() {
        return Some(Role::Decode);
    }
    if path.starts_with("/admin/v1/nodes") {
        return Some(match body.and_then(|b| b["role"].as_str()) {
            Some("prefill") => Role::Prefill,
            Some("colocated") => Role::Colocated,
            _ => Role::Decode,
        });
    }
    None
}

/// A config spec with the given limits.
pub fn config(context_window: u64, max_output: u64) -> Value {
    serde_json::json!({
        "context_window": context_window,
        "max_output": max_output,
        "weights_file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "weights_sha256": SHA,
        "quantization": "q4_1",
        "page_size": 16,
        "kv_budget": { "prefill_bytes": 1u64 << 30, "decode_bytes": 1u64 << 30 },
        "parallelism": { "tensor": 1, "pipeline": 1 }
    })
}

pub const SHA: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
pub const SLUG: &str = "@cf/huggingfacetb/smollm2-135m-instruct";
pub const SLUG_PATH: &str = "%40cf%2Fhuggingfacetb%2Fsmollm2-135m-instruct";

/// [`SLUG`]'s configs.
pub fn configs_path() -> String {
    format!("/admin/v1/models/{SLUG_PATH}/configs")
}

/// A node registration body.
pub fn node(name: &str, role: &str, pool: u64) -> Value {
    serde_json::json!({
        "name": name,
        "role": role,
        "model": SLUG,
        "address": format!("127.0.0.1:{}", 9000 + name.len()),
        "kv_pool_tokens": pool,
        "weights_sha256": SHA,
        "quantization": "q4_1",
        "page_size": 16,
        "kv_budget_bytes": 1u64 << 30,
        // Fast enough for any window the tests configure.
        "prefill": { "ns_per_token": 1000, "ns_per_pair": 0, "deadline_ms": 60000 }
    })
}
