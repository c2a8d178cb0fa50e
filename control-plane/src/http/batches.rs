//! `/admin/v1/batches`: tenants' batches, for the gateway alone, which
//! names the account it authenticated on every call; and
//! `/admin/v1/batch-runs`: the batch runner's side, for the runner's
//! certificate alone (over the internal port), which no operator token
//! replaces. Taking and finishing a batch make and revoke its API token,
//! so both publish a routing version.

use super::AppState;
use super::auth::{GatewayAgent, RunnerAgent};
use super::error::{ApiError, AppJson, AppPath, AppQuery};
use crate::store::batches::{self, run};
use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use bulkhead_control_api::{
    BatchAnswers, BatchCreate, BatchLease, BatchList, BatchRecorded, BatchView, Timestamp,
};
use serde::Deserialize;

/// How long a taken batch stays the runner's without a renewal.
pub(crate) const LEASE_MS: i64 = 30_000;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/batches", get(list).post(create))
        .route("/batches/{id}", get(one))
        .route("/batches/{id}/cancel", post(cancel))
        .route("/batch-runs/take", post(take))
        .route("/batch-runs/{id}/renew", post(renew))
        .route("/batch-runs/{id}/answers", post(answers))
        .route("/batch-runs/{id}/finish", post(finish))
}

type ApiResult<T> = Result<Json<T>, ApiError>;

/// The account a gateway call is for, and a list's page.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ForAccount {
    account: String,
    #[serde(default)]
    after: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
}

impl ForAccount {
    /// The account id, checked to be one.
    fn id(&self) -> Result<&str, ApiError> {
        super::files::account_id(&self.account)
    }
}

async fn create(
    State(s): State<AppState>,
    _: GatewayAgent,
    AppJson(req): AppJson<BatchCreate>,
) -> ApiResult<BatchView> {
    let mut tx = s.db.begin().await?;
    let made = batches::create(&mut tx, &req, Timestamp::now()).await?;
    tx.commit().await?;
    Ok(Json(made))
}

async fn list(
    State(s): State<AppState>,
    _: GatewayAgent,
    AppQuery(q): AppQuery<ForAccount>,
) -> ApiResult<BatchList> {
    let mut conn = s.db.pool().acquire().await?;
    let limit = q.limit.unwrap_or(20);
    let (data, has_more) = batches::list(&mut conn, q.id()?, q.after.as_deref(), limit).await?;
    Ok(Json(BatchList { data, has_more }))
}

async fn one(
    State(s): State<AppState>,
    _: GatewayAgent,
    AppPath(id): AppPath<String>,
    AppQuery(q): AppQuery<ForAccount>,
) -> ApiResult<BatchView> {
    let mut conn = s.db.pool().acquire().await?;
    Ok(Json(batches::get(&mut conn, q.id()?, &id).await?))
}

async fn cancel(
    State(s): State<AppState>,
    _: GatewayAgent,
    AppPath(id): AppPath<String>,
    AppQuery(q): AppQuery<ForAccount>,
) -> ApiResult<BatchView> {
    let mut tx = s.db.begin().await?;
    let batch = batches::cancel(&mut tx, q.id()?, &id, Timestamp::now()).await?;
    tx.commit().await?;
    Ok(Json(batch))
}

async fn take(State(s): State<AppState>, _: RunnerAgent) -> ApiResult<Option<BatchLease>> {
    let mut tx = s.db.begin().await?;
    let lease = run::take(&mut tx, Timestamp::now(), LEASE_MS).await?;
    tx.commit().await?;
    if lease.is_some() {
        s.hub.publish().await;
    }
    Ok(Json(lease))
}

async fn renew(
    State(s): State<AppState>,
    _: RunnerAgent,
    AppPath(id): AppPath<String>,
) -> ApiResult<BatchView> {
    let mut tx = s.db.begin().await?;
    run::renew(&mut tx, &id, Timestamp::now(), LEASE_MS).await?;
    let batch = run::view(&mut tx, &id).await?;
    tx.commit().await?;
    Ok(Json(batch))
}

async fn answers(
    State(s): State<AppState>,
    _: RunnerAgent,
    AppPath(id): AppPath<String>,
    AppJson(body): AppJson<BatchAnswers>,
) -> ApiResult<BatchRecorded> {
    let mut tx = s.db.begin().await?;
    let done = run::record(&mut tx, &id, &body.answers).await?;
    tx.commit().await?;
    Ok(Json(done))
}

async fn finish(
    State(s): State<AppState>,
    _: RunnerAgent,
    AppPath(id): AppPath<String>,
) -> ApiResult<BatchView> {
    let mut tx = s.db.begin().await?;
    let batch = run::finish(&mut tx, &id, Timestamp::now()).await?;
    tx.commit().await?;
    s.hub.publish().await;
    Ok(Json(batch))
}
