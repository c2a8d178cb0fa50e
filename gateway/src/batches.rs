//! OpenAI's Batch API: `POST /v1/batches`, `GET /v1/batches` (newest
//! first, `after` and `limit`), `GET /v1/batches/{id}` and
//! `POST /v1/batches/{id}/cancel`. Batches are the authenticated account's:
//! the control plane keeps them in its database beside their input and
//! answers, and finds one only by its account and id together, so another
//! account's id gets exactly the answer an unknown id gets. The batch
//! runner takes them from there and calls this gateway's public API for
//! each line, as the account.

use crate::errors::{ApiError, Flavor, GatewayError};
use crate::files::{admitted, cp_error_on};
use crate::pipeline::Ctx;
use crate::state::AppState;
use axum::Extension;
use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use bulkhead_control_api::{BatchCreate, BatchList, BatchView, Timestamp};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

const O: Flavor = Flavor::OpenAi;

fn bad(m: impl Into<String>) -> GatewayError {
    GatewayError::BadInput(m.into())
}

fn secs(t: Timestamp) -> i64 {
    t.millis() / 1000
}

/// A batch as OpenAI's API shows one.
fn batch_json(b: &BatchView) -> Value {
    let errors = (!b.errors.is_empty()).then(|| {
        let data: Vec<Value> = b
            .errors
            .iter()
            .map(|e| json!({"code": e.code, "message": e.message, "param": null, "line": e.line}))
            .collect();
        json!({"object": "list", "data": data})
    });
    json!({
        "id": b.id,
        "object": "batch",
        "endpoint": b.endpoint,
        "errors": errors,
        "input_file_id": b.input_file_id,
        "completion_window": b.completion_window,
        "status": b.status,
        "output_file_id": b.output_file_id,
        "error_file_id": b.error_file_id,
        "created_at": secs(b.created_at),
        "in_progress_at": b.in_progress_at.map(secs),
        "expires_at": secs(b.expires_at),
        "finalizing_at": b.finalizing_at.map(secs),
        "completed_at": b.completed_at.map(secs),
        "failed_at": b.failed_at.map(secs),
        "expired_at": b.expired_at.map(secs),
        "cancelling_at": b.cancelling_at.map(secs),
        "cancelled_at": b.cancelled_at.map(secs),
        "request_counts": b.request_counts,
        "metadata": b.metadata,
    })
}

/// The body of `POST /v1/batches`, read field by field so that a field
/// not served is refused by name.
fn create_body(
    account: &str,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<BatchCreate, GatewayError> {
    let Json(v) = body.map_err(|e| bad(format!("the body must be a JSON object: {e}")))?;
    let Value::Object(mut m) = v else {
        return Err(bad("the body must be a JSON object"));
    };
    let text = |m: &mut Map<String, Value>, name: &str| -> Result<String, GatewayError> {
        match m.remove(name) {
            Some(Value::String(s)) => Ok(s),
            Some(_) => Err(bad(format!("{name} must be a string"))),
            None => Err(bad(format!("{name} is required"))),
        }
    };
    let input_file_id = text(&mut m, "input_file_id")?;
    let endpoint = text(&mut m, "endpoint")?;
    if !["/v1/chat/completions", "/v1/completions"].contains(&endpoint.as_str()) {
        return Err(bad(
            "endpoint must be /v1/chat/completions or /v1/completions",
        ));
    }
    let completion_window = text(&mut m, "completion_window")?;
    let metadata = match m.remove("metadata") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            serde_json::from_value::<BTreeMap<String, String>>(v)
                .map_err(|_| bad("metadata must be an object of strings"))?,
        ),
    };
    if let Some(name) = m.keys().next() {
        return Err(GatewayError::Unsupported(name.chars().take(64).collect()));
    }
    Ok(BatchCreate {
        account_id: account.to_owned(),
        input_file_id,
        endpoint,
        completion_window,
        metadata,
    })
}

/// `POST /v1/batches`.
pub(crate) async fn create(
    State(s): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    let req = create_body(&ctx.principal.account_id, body).map_err(|e| e.in_(O))?;
    let _permit = admitted(&s, &ctx).await.map_err(|e| e.in_(O))?;
    let b: BatchView = s
        .control_plane()
        .post("/admin/v1/batches", &req)
        .await
        // Not found here is the input file's.
        .map_err(|e| cp_error_on(&e, "File", &req.input_file_id).in_(O))?;
    Ok(Json(batch_json(&b)).into_response())
}

/// `GET /v1/batches`: a page of the account's batches, newest first
/// (`limit` 1 to 100, default 20; `after` a batch id).
pub(crate) async fn list(
    State(s): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let (mut after, mut limit) = (None, 20usize);
    for pair in query.as_deref().unwrap_or_default().split('&') {
        if pair.is_empty() {
            continue;
        }
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "after" => after = Some(batch_id(v.to_owned()).map_err(|e| e.in_(O))?),
            "limit" => {
                limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=100).contains(n))
                    .ok_or_else(|| bad("limit must be 1 to 100").in_(O))?;
            }
            other => {
                return Err(GatewayError::Unsupported(other.chars().take(64).collect()).in_(O));
            }
        }
    }
    let _permit = admitted(&s, &ctx).await.map_err(|e| e.in_(O))?;
    let mut path = format!(
        "/admin/v1/batches?account={}&limit={limit}",
        ctx.principal.account_id
    );
    if let Some(a) = &after {
        path.push_str(&format!("&after={a}"));
    }
    let page: BatchList = s
        .control_plane()
        .get(&path)
        .await
        .map_err(|e| cp_error_on(&e, "Batch", after.as_deref().unwrap_or("")).in_(O))?;
    let data: Vec<Value> = page.data.iter().map(batch_json).collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "first_id": page.data.first().map(|b| &b.id),
        "last_id": page.data.last().map(|b| &b.id),
        "has_more": page.has_more,
    }))
    .into_response())
}

/// The id in a batch route: what a batch id looks like, or it is not found
/// (no other text reaches the control plane's URL).
pub(crate) fn batch_id(id: String) -> Result<String, GatewayError> {
    let ok = id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if ok {
        Ok(id)
    } else {
        Err(GatewayError::NoSuchObject { what: "Batch", id })
    }
}

/// The control plane's answer on one of the account's batches.
async fn for_batch(
    s: &AppState,
    ctx: &Ctx,
    path: Result<Path<String>, PathRejection>,
    cancel: bool,
) -> Result<Response, ApiError> {
    let Path(id) = path.map_err(|_| GatewayError::NoRoute.in_(O))?;
    let id = batch_id(id).map_err(|e| e.in_(O))?;
    let _permit = admitted(s, ctx).await.map_err(|e| e.in_(O))?;
    let account = &ctx.principal.account_id;
    let cp = s.control_plane();
    let answer: Result<BatchView, _> = if cancel {
        let url = format!("/admin/v1/batches/{id}/cancel?account={account}");
        cp.post(&url, &json!({})).await
    } else {
        cp.get(&format!("/admin/v1/batches/{id}?account={account}"))
            .await
    };
    let b = answer.map_err(|e| cp_error_on(&e, "Batch", &id).in_(O))?;
    Ok(Json(batch_json(&b)).into_response())
}

/// `GET /v1/batches/{id}`.
pub(crate) async fn one(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    Extension(ctx): Extension<Ctx>,
) -> Result<Response, ApiError> {
    for_batch(&s, &ctx, path, false).await
}

/// `POST /v1/batches/{id}/cancel`.
pub(crate) async fn cancel(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    Extension(ctx): Extension<Ctx>,
) -> Result<Response, ApiError> {
    for_batch(&s, &ctx, path, true).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_create_body_is_read_field_by_field() {
        let ok = json!({"input_file_id": "file-1", "endpoint": "/v1/chat/completions",
                        "completion_window": "24h", "metadata": {"k": "v"}});
        let req = create_body("acct", Ok(Json(ok.clone()))).expect("valid");
        assert_eq!(req.account_id, "acct");
        assert_eq!(req.metadata.map(|m| m["k"].clone()).as_deref(), Some("v"));
        let mut extra = ok.clone();
        extra["output_expires_after"] = json!({"anchor": "created_at", "seconds": 3600});
        assert!(matches!(
            create_body("acct", Ok(Json(extra))),
            Err(GatewayError::Unsupported(p)) if p == "output_expires_after"
        ));
        let mut missing = ok;
        missing.as_object_mut().map(|m| m.remove("endpoint"));
        assert!(matches!(
            create_body("acct", Ok(Json(missing))),
            Err(GatewayError::BadInput(m)) if m.contains("endpoint")
        ));
        assert!(matches!(
            batch_id("batch_../x".to_owned()),
            Err(GatewayError::NoSuchObject { .. })
        ));
    }
}
