//! The control plane's HTTP surface: `fn app(state) -> Router`, tested with
//! `oneshot`. Two parts share one listener:
//!
//! - `/admin/v1/...`: the admin API, bearer operator tokens with roles
//!   (`http::admin`, `http::auth`);
//! - `/`, `/incidents/{id}`, `/api/v2/*.json`, `/history.atom`,
//!   `/history.rss`: the public, read-only status page and feeds
//!   (`http::public`, rendered by `crate::status`).
//!
//! Unknown routes and methods answer in the API's error format (`not_found`,
//! `method_not_allowed`).

mod admin;
mod auth;
mod batches;
mod error;
mod files;
mod public;

use crate::{Db, Hub};
use axum::Router;
use axum::extract::{Request, State};
use axum::http::Method;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use std::sync::Arc;
use std::time::Duration;

/// What the HTTP surface needs besides the database; parsed once at start.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Status page title, e.g. "Bulkhead".
    pub page_name: String,
    /// The URL the status page is reachable at, without a trailing slash;
    /// links in the feeds and `page.url` use it.
    pub public_url: String,
    /// A node not heard from for this long is unroutable and does not count
    /// in config activation checks.
    pub node_ttl: Duration,
    /// How often nodes are told to send heartbeats.
    pub heartbeat_interval: Duration,
    /// How long the public status routes may serve one database read
    /// (bounds the load anonymous readers put on the database; zero: none).
    pub status_cache: Duration,
    /// A gateway that has not heard from the control plane for this long
    /// stops admitting requests; a visibility flip waits at most this long
    /// for gateways that do not acknowledge it.
    pub gateway_lease: Duration,
    /// The gateway's tenant-context verifying keys: a usage event is
    /// accepted only for the account, model and call id of the signed
    /// context it carries (none: every usage report is refused).
    pub contexts: bulkhead_worker_api::context::VerifyingKeys,
}

/// Shared state of every handler; cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState {
    db: Db,
    settings: Arc<Settings>,
    status: public::StatusCache,
    hub: Hub,
}

impl AppState {
    /// State over an open database; starts the routing hub task on the
    /// current runtime.
    pub fn new(db: Db, settings: Settings) -> AppState {
        let hub = Hub::start(settings.gateway_lease);
        crate::metrics::register(&hub);
        AppState {
            db,
            hub,
            settings: Arc::new(settings),
            status: public::StatusCache::default(),
        }
    }
}

/// Every successful admin write publishes a new routing version, so
/// gateways refetch; no handler can forget to.
async fn publish_writes(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let write = req.method() != Method::GET;
    let resp = next.run(req).await;
    if write && resp.status().is_success() {
        s.hub.publish().await;
    }
    resp
}

/// The whole router.
pub fn app(state: AppState) -> Router {
    let router = Router::new()
        .nest(
            "/admin/v1",
            admin::routes()
                .layer(middleware::from_fn_with_state(
                    state.clone(),
                    publish_writes,
                ))
                .merge(files::routes())
                .merge(batches::routes()),
        )
        .merge(public::routes())
        .fallback(|| async {
            error::ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
        })
        .method_not_allowed_fallback(|| async {
            error::ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this route does not accept that method",
            )
        })
        .with_state(state);
    // The admin API is called by gateways, workers and the CLI (their
    // trace context is honoured); the status page by anyone (it is not).
    // Quiet: the polls every component makes whether or not anything
    // happens (the routing long-poll, heartbeats, the batch runner asking
    // for work and renewing its hold).
    bulkhead_telemetry::instrument(
        router,
        bulkhead_telemetry::Hop::InternalUnder("/admin/"),
        &[
            "/admin/v1/routing",
            "/admin/v1/nodes/{id}/heartbeat",
            "/admin/v1/batch-runs/take",
            "/admin/v1/batch-runs/{id}/renew",
        ],
    )
}
