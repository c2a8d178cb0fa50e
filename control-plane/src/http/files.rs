//! `/admin/v1/files`: tenants' uploaded files, for the gateway alone, which
//! names the account it authenticated on every call. No route here
//! changes routing, so none publishes a routing version.

use super::AppState;
use super::auth::GatewayAgent;
use super::error::{ApiError, AppJson, AppPath, AppQuery};
use crate::store::files;
use axum::extract::{DefaultBodyLimit, State};
use axum::routing::get;
use axum::{Json, Router};
use bulkhead_control_api::{FileContent, FileUpload, FileView, MAX_FILE_BYTES, Timestamp};
use serde::Deserialize;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/files",
            get(list).post(create).layer(
                // A file's text, escaped into JSON: every byte at most
                // twice, plus the envelope.
                DefaultBodyLimit::max(2 * MAX_FILE_BYTES + 4096),
            ),
        )
        .route("/files/{id}", get(one).delete(remove))
        .route("/files/{id}/content", get(content))
}

type ApiResult<T> = Result<Json<T>, ApiError>;

/// The account a gateway call is for.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ForAccount {
    account: String,
}

impl ForAccount {
    /// The account id, checked to be one.
    fn id(&self) -> Result<&str, ApiError> {
        account_id(&self.account)
    }
}

/// `account`, checked to be an account id (the gateway names the account
/// it authenticated on every call about a tenant's objects).
pub(crate) fn account_id(account: &str) -> Result<&str, ApiError> {
    crate::AccountId::parse(account)
        .map(|_| account)
        .ok_or_else(|| ApiError::bad_request("account is 32 hex digits"))
}

async fn create(
    State(s): State<AppState>,
    _: GatewayAgent,
    AppJson(upload): AppJson<FileUpload>,
) -> ApiResult<FileView> {
    let mut tx = s.db.begin().await?;
    let made = files::create(&mut tx, &upload, Timestamp::now()).await?;
    tx.commit().await?;
    Ok(Json(made))
}

async fn list(
    State(s): State<AppState>,
    _: GatewayAgent,
    AppQuery(q): AppQuery<ForAccount>,
) -> ApiResult<Vec<FileView>> {
    let mut conn = s.db.pool().acquire().await?;
    Ok(Json(files::list(&mut conn, q.id()?).await?))
}

async fn one(
    State(s): State<AppState>,
    _: GatewayAgent,
    AppPath(id): AppPath<String>,
    AppQuery(q): AppQuery<ForAccount>,
) -> ApiResult<FileView> {
    let mut conn = s.db.pool().acquire().await?;
    Ok(Json(files::get(&mut conn, q.id()?, &id).await?))
}

async fn content(
    State(s): State<AppState>,
    _: GatewayAgent,
    AppPath(id): AppPath<String>,
    AppQuery(q): AppQuery<ForAccount>,
) -> ApiResult<FileContent> {
    let mut conn = s.db.pool().acquire().await?;
    let content = files::content(&mut conn, q.id()?, &id).await?;
    Ok(Json(FileContent { content }))
}

async fn remove(
    State(s): State<AppState>,
    _: GatewayAgent,
    AppPath(id): AppPath<String>,
    AppQuery(q): AppQuery<ForAccount>,
) -> ApiResult<FileView> {
    let mut tx = s.db.begin().await?;
    let gone = files::get(&mut tx, q.id()?, &id).await?;
    files::delete(&mut tx, q.id()?, &id).await?;
    tx.commit().await?;
    Ok(Json(gone))
}
