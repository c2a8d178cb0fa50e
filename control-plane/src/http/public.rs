//! Public, unauthenticated, read-only routes: the status page, one page per
//! incident, the Statuspage v2 JSON and the Atom and RSS feeds. Nothing here
//! writes, and nothing here names a model that was never public.
//!
//! The status page and feeds serve one database read for up to
//! `status_cache` (`--status-cache-ms`, 1 s by default); one reader refreshes
//! it while the others wait, so anonymous readers cannot starve the admin API
//! of the database.

use super::AppState;
use super::error::ApiError;
use crate::IncidentId;
use crate::status::{Snapshot, feeds, html, statuspage};
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;

/// How a JSON document is written from the status snapshot.
type Render = fn(&Snapshot) -> Value;

/// Statuspage's v2 JSON documents: each path under `/api/v2/` and what it
/// renders.
const DOCUMENTS: [(&str, Render); 8] = [
    ("summary.json", statuspage::summary),
    ("status.json", statuspage::status_json),
    ("components.json", statuspage::components_json),
    ("incidents.json", |s| statuspage::incidents_json(s, false)),
    ("incidents/unresolved.json", |s| {
        statuspage::incidents_json(s, true)
    }),
    ("scheduled-maintenances.json", statuspage::maintenances_json),
    (
        "scheduled-maintenances/upcoming.json",
        statuspage::maintenances_json,
    ),
    (
        "scheduled-maintenances/active.json",
        statuspage::maintenances_json,
    ),
];

pub(crate) fn routes() -> Router<AppState> {
    let mut r = Router::new()
        .route("/", get(index))
        .route("/health", get(health))
        .route("/incidents/{id}", get(incident_page))
        .route("/history.atom", get(|s| text(s, ATOM, feeds::atom)))
        .route("/history.rss", get(|s| text(s, RSS, feeds::rss)));
    for (path, render) in DOCUMENTS {
        r = r.route(&format!("/api/v2/{path}"), get(move |s| json(s, render)));
    }
    r
}

const ATOM: &str = "application/atom+xml; charset=utf-8";
const RSS: &str = "application/rss+xml; charset=utf-8";

/// Liveness and readiness: 200 once the database answers, else 503 in the
/// API's error shape (for load balancers and Kubernetes probes).
async fn health(State(s): State<AppState>) -> Result<&'static str, ApiError> {
    let mut conn = s.db.pool().acquire().await?;
    sqlx::query("SELECT 1").execute(&mut *conn).await?;
    Ok("ok")
}

/// The last status snapshot and when it was read. One reader at a time
/// refreshes it; the others wait for that read instead of issuing their own.
#[derive(Debug, Clone, Default)]
pub(crate) struct StatusCache(Arc<tokio::sync::Mutex<Option<Cached>>>);

type Cached = (Instant, Arc<Snapshot>);

async fn snapshot(s: &AppState) -> Result<Arc<Snapshot>, ApiError> {
    let mut slot = s.status.0.lock().await;
    if let Some((at, snap)) = slot.as_ref()
        && at.elapsed() < s.settings.status_cache
    {
        return Ok(Arc::clone(snap));
    }
    let mut conn = s.db.pool().acquire().await?;
    let snap =
        Arc::new(Snapshot::load(&mut conn, &s.settings.page_name, &s.settings.public_url).await?);
    *slot = Some((Instant::now(), Arc::clone(&snap)));
    Ok(snap)
}

async fn json(State(s): State<AppState>, render: Render) -> Result<Response, ApiError> {
    let snap = snapshot(&s).await?;
    let mut resp = axum::Json(render(&snap)).into_response();
    // Status widgets on other sites fetch these from the browser.
    resp.headers_mut().insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    Ok(resp)
}

async fn text(
    State(s): State<AppState>,
    content_type: &'static str,
    render: fn(&Snapshot) -> String,
) -> Result<Response, ApiError> {
    let snap = snapshot(&s).await?;
    Ok(([(header::CONTENT_TYPE, content_type)], render(&snap)).into_response())
}

async fn index(State(s): State<AppState>) -> Result<Response, ApiError> {
    let snap = snapshot(&s).await?;
    Ok((
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        html::page(&snap),
    )
        .into_response())
}

/// `GET /incidents/{id}`: the incident's page, or a 404 page (a browser
/// asked) for an id that is unknown or not a number.
async fn incident_page(
    State(s): State<AppState>,
    Path(raw): Path<String>,
) -> Result<Response, ApiError> {
    let snap = snapshot(&s).await?;
    let found = raw
        .parse::<i64>()
        .ok()
        .map(|id| IncidentId::from_db(id).get())
        .and_then(|id| snap.incidents.iter().find(|i| i.id == id));
    let html_type = [(header::CONTENT_TYPE, "text/html; charset=utf-8")];
    Ok(match found {
        Some(i) => (html_type, html::incident(&snap, i)).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            html_type,
            html::not_found(&snap, "There is no incident with this number."),
        )
            .into_response(),
    })
}
