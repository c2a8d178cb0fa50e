//! A control plane in this process on a real socket, with two accounts,
//! their API tokens, a public model and a private one allowlisted for B;
//! and gateways polling it, called through `oneshot`.

#![allow(dead_code, unreachable_pub)]

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use bulkhead_control_api::{
    Client, ConfigSpec, CreateModel, Credentials, KvBudget, Parallelism, Price, Properties, Role,
    Timestamp, Visibility,
};
use bulkhead_control_plane::{AccountId, AppState as CpState, Db, Settings, app as cp_app, store};
use bulkhead_gateway::{AppState, Limiter, Limits, RoutingWatch, app};
use bulkhead_trust::Role as CertRole;
use http_body_util::BodyExt;
use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tower::ServiceExt;

pub const OPEN: &str = "@cf/test/open-model";
pub const OPEN_ENCODED: &str = "@cf%2Ftest%2Fopen-model";
pub const SECRET: &str = "@cf/test/secret-model";

static N: AtomicU64 = AtomicU64::new(0);

pub struct Platform {
    pub url: String,
    stop: std::sync::Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    pub db: Db,
    pub admin: String,
    pub gateway_token: String,
    pub a: String,
    pub b: String,
    pub a_token: String,
    pub b_token: String,
    pub a_revoked: String,
}

pub fn unique(tag: &str) -> String {
    format!(
        "{tag}-{}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        Timestamp::now().millis()
    )
}

fn spec(context_window: u64, max_output: u64) -> ConfigSpec {
    ConfigSpec {
        properties: Properties {
            context_window,
            max_output,
        },
        weights_file: "w.gguf".to_owned(),
        weights_sha256: "a".repeat(64),
        quantization: "q4_1".to_owned(),
        page_size: 16,
        kv_budget: KvBudget {
            prefill_bytes: 1 << 30,
            decode_bytes: 1 << 30,
        },
        parallelism: Parallelism::default(),
        // Priced as `up` prices its models, so a budget can refuse.
        price: Price {
            input_neurons_per_mtok: 330,
            output_neurons_per_mtok: 2460,
        },
    }
}

/// The test CA's identity of `role` (the CA is created once per test
/// binary).
pub fn identity(role: CertRole) -> bulkhead_trust::Identity {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("bulkhead-gw-tls-{}", std::process::id()));
        bulkhead_trust::authority::init_dir(&d, &CertRole::ALL).expect("test CA");
        d
    });
    bulkhead_trust::Identity::load(&bulkhead_trust::TlsFiles::in_dir(dir, role), role)
        .expect("identity")
}

/// Starts the control plane (SQLite in a temp file, gateway lease 3 s).
pub async fn platform() -> Platform {
    let path = std::env::temp_dir().join(format!("{}.db", unique("bulkhead-gw")));
    let db = Db::connect(&Db::sqlite_url(&path)).await.expect("database");
    let settings = Settings {
        page_name: "Bulkhead".to_owned(),
        public_url: "http://status.test".to_owned(),
        node_ttl: Duration::from_secs(60),
        heartbeat_interval: Duration::from_secs(5),
        status_cache: Duration::ZERO,
        gateway_lease: Duration::from_secs(3),
        contexts: bulkhead_worker_api::context::VerifyingKeys::none(),
    };
    // The control plane's internal port: mutual TLS with the test CA.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let acceptor = identity(CertRole::ControlPlane)
        .acceptor(&[CertRole::Gateway])
        .expect("acceptor");
    let listener = bulkhead_trust::TlsListener::new(listener, acceptor).expect("listener");
    let url = format!("https://{}", listener.local_addr());
    let router = cp_app(CpState::new(db.clone(), settings))
        .into_make_service_with_connect_info::<bulkhead_trust::Peer>();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                let _ = stopped.await;
            })
            .await
    });
    let now = Timestamp::now();
    let mut c = db.pool().acquire().await.expect("connection");
    let admin = store::operators::create(&mut c, "ada", Role::Admin, now)
        .await
        .expect("admin")
        .token;
    let gateway_token = store::operators::create(&mut c, "edge", Role::Gateway, now)
        .await
        .expect("gw")
        .token;
    let a = store::accounts::create(&mut c, "alpha", now)
        .await
        .expect("a")
        .id;
    let b = store::accounts::create(&mut c, "beta", now)
        .await
        .expect("b")
        .id;
    let aid = AccountId::parse(&a).expect("id");
    let bid = AccountId::parse(&b).expect("id");
    let a_token = store::api_tokens::create(&mut c, &aid, "main", now)
        .await
        .expect("token")
        .token;
    let b_token = store::api_tokens::create(&mut c, &bid, "main", now)
        .await
        .expect("token")
        .token;
    let revoked = store::api_tokens::create(&mut c, &aid, "old", now)
        .await
        .expect("token");
    store::api_tokens::revoke(&mut c, &aid, revoked.meta.id, now)
        .await
        .expect("revoke");
    for (slug, vis) in [(OPEN, Visibility::Public), (SECRET, Visibility::Private)] {
        let m = store::models::create(
            &mut c,
            &CreateModel {
                slug: slug.parse().expect("slug"),
                task: "Text Generation".to_owned(),
                description: format!("test model {slug}"),
                visibility: vis,
                config: None,
            },
            now,
        )
        .await
        .expect("model");
        let v = store::configs::add(&mut c, &m, &spec(2048, 256), "ada", now)
            .await
            .expect("config");
        store::configs::activate(&mut c, &m, v, "ada", "", now, Duration::from_secs(60))
            .await
            .expect("activate");
    }
    let why = store::models::Why {
        actor: "ada",
        reason: "beta tests it",
        now,
    };
    store::models::set_allowed(&mut c, &SECRET.parse().expect("slug"), (&bid, true), why)
        .await
        .expect("allowlist");
    drop(c);
    Platform {
        url,
        stop: std::sync::Mutex::new(Some(stop)),
        db,
        admin,
        gateway_token,
        a,
        b,
        a_token,
        b_token,
        a_revoked: revoked.token,
    }
}

impl Platform {
    /// Shuts the control plane down (open long polls finish first).
    pub fn stop_control_plane(&self) {
        if let Some(tx) = self.stop.lock().expect("lock").take() {
            let _ = tx.send(());
        }
    }

    /// A gateway polling this control plane, ready.
    pub async fn gateway(
        &self,
        jwt: Option<bulkhead_gateway::JwtConfig>,
        limiter: Limiter,
    ) -> Router {
        let gateway = identity(CertRole::Gateway);
        let client = Client::with_identity(
            &Credentials {
                control_plane_url: self.url.clone(),
                operator_token: self.gateway_token.clone(),
            },
            &gateway,
        )
        .expect("client");
        let watch = RoutingWatch::start(client, unique("gw"));
        assert!(watch.ready(Duration::from_secs(10)).await, "routing table");
        let upstream = bulkhead_gateway::Upstream::new(
            &gateway,
            bulkhead_worker_api::context::SigningKey::generate(),
        )
        .expect("upstream");
        app(AppState::new(watch, jwt, limiter, upstream))
    }

    /// A memory limiter with generous limits.
    pub fn limiter() -> Limiter {
        Limiter::memory(Limits {
            requests_per_minute: 10_000,
            tokens_per_minute: 10_000_000,
            concurrency: 100,
        })
    }

    /// An admin API call on the control plane's socket (the only port this
    /// test platform serves is the internal one, so the admin's token
    /// rides on a connection with the gateway's certificate).
    pub async fn admin(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let client = Client::with_identity(
            &Credentials {
                control_plane_url: self.url.clone(),
                operator_token: self.admin.clone(),
            },
            &identity(CertRole::Gateway),
        )
        .expect("client");
        match (method, body) {
            ("GET", _) => client.get(path).await.expect("GET"),
            ("DELETE", _) => client.delete(path).await.expect("DELETE"),
            ("PUT", body) => client
                .put(path, &body.unwrap_or(Value::Null))
                .await
                .expect("PUT"),
            (_, body) => client
                .post(path, &body.unwrap_or(Value::Null))
                .await
                .expect("POST"),
        }
    }
}

/// One request through a router: status, headers of interest, body text.
pub struct Reply {
    pub status: StatusCode,
    pub retry_after: Option<String>,
    pub content_type: String,
    /// The `x-ratelimit-*` headers, without the prefix.
    pub ratelimit: std::collections::BTreeMap<String, String>,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::String(self.body.clone()))
    }
}

/// A raw connection to `addr` that has sent `request` (HTTP/1.1 as written).
pub fn send_raw(addr: std::net::SocketAddr, request: &str) -> std::net::TcpStream {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.write_all(request.as_bytes()).expect("write");
    s
}

/// `GET path` with `auth` as the authorization header.
pub async fn get(app: &Router, path: &str, auth: &str) -> Reply {
    call(app, "GET", path, Some(auth), None).await
}

/// `POST path` of a JSON `body` with `auth` as the authorization header.
pub async fn post(app: &Router, path: &str, auth: &str, body: &str) -> Reply {
    call(app, "POST", path, Some(auth), Some(body)).await
}

pub async fn call(
    app: &Router,
    method: &str,
    path: &str,
    auth: Option<&str>,
    body: Option<&str>,
) -> Reply {
    let mut req = Request::builder().method(method).uri(path);
    if let Some(a) = auth {
        req = req.header("authorization", a);
    }
    let body = match body {
        Some(b) => {
            req = req.header("content-type", "application/json");
            Body::from(b.to_owned())
        }
        None => Body::empty(),
    };
    let resp = app
        .clone()
        .oneshot(req.body(body).expect("request"))
        .await
        .expect("router");
    let status = resp.status();
    let header = |h: &str| {
        resp.headers()
            .get(h)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let retry_after = header("retry-after");
    let content_type = header("content-type").unwrap_or_default();
    let ratelimit = resp
        .headers()
        .iter()
        .filter_map(|(k, v)| {
            let name = k.as_str().strip_prefix("x-ratelimit-")?;
            Some((name.to_owned(), v.to_str().ok()?.to_owned()))
        })
        .collect();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    Reply {
        status,
        retry_after,
        content_type,
        ratelimit,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

pub fn bearer(t: &str) -> String {
    format!("Bearer {t}")
}

/// Serves `router` on a loopback port within `limits` (until the test
/// ends) and returns the address.
pub async fn serve_on_loopback(
    router: axum::Router,
    limits: bulkhead_gateway::ConnLimits,
) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(bulkhead_gateway::serve(
        listener,
        router,
        limits,
        std::future::pending(),
    ));
    addr
}

/// Uploads `text` as a batch file (`POST /v1/files`, multipart) with the
/// token `token`: status and JSON answer.
#[allow(dead_code)] // Not every test binary uploads.
pub async fn upload_batch_file(app: &Router, token: &str, text: &str) -> (u16, Value) {
    let body = format!(
        "--X\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
         --X\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\
         Content-Type: application/jsonl\r\n\r\n{text}\r\n--X--\r\n"
    );
    let req = Request::post("/v1/files")
        .header("authorization", bearer(token))
        .header("content-type", "multipart/form-data; boundary=X")
        .body(Body::from(body))
        .expect("request");
    let resp = app.clone().oneshot(req).await.expect("router");
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}
