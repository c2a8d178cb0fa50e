//! OpenAI's Files API, for batch input: `POST /v1/files` (multipart, a
//! `file` and `purpose=batch`), `GET /v1/files`, `GET /v1/files/{id}`,
//! `GET /v1/files/{id}/content` and `DELETE /v1/files/{id}`. Files are the
//! authenticated account's: the control plane keeps them in its database
//! and finds one only by its account and id together, so another account's
//! id gets exactly the answer an unknown id gets.
//!
//! An upload is checked here as the batch runner will read it: JSON Lines,
//! each line `{"custom_id", "method": "POST", "url", "body"}` with a
//! `custom_id` unique in the file and a `url` of `/v1/chat/completions` or
//! `/v1/completions`; at most [`MAX_FILE_BYTES`] bytes and
//! [`MAX_FILE_LINES`] lines.

use crate::errors::{ApiError, Flavor, GatewayError};
use crate::pipeline::Ctx;
use crate::state::AppState;
use axum::Extension;
use axum::Json;
use axum::extract::multipart::{Multipart, MultipartRejection};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bulkhead_control_api::{
    ClientError, FileContent, FileUpload, FileView, MAX_FILE_BYTES, MAX_FILE_LINES,
};
use serde_json::{Value, json};
use std::collections::HashSet;

const O: Flavor = Flavor::OpenAi;

/// The endpoints a batch line may call.
pub(crate) const BATCH_URLS: &[&str] = &["/v1/chat/completions", "/v1/completions"];
/// The longest `custom_id`, in bytes.
pub(crate) const MAX_CUSTOM_ID: usize = 512;

fn bad(m: impl Into<String>) -> GatewayError {
    GatewayError::BadInput(m.into())
}

/// A file as OpenAI's API shows one.
fn file_json(f: &FileView) -> Value {
    json!({
        "id": f.id,
        "object": "file",
        "bytes": f.bytes,
        "created_at": f.created_at.millis() / 1000,
        "filename": f.filename,
        "purpose": f.purpose,
        "status": "processed",
        "status_details": null,
        "expires_at": null
    })
}

/// Counts a file call against the account's request limits (files reach
/// the control plane's database: an account cannot call them faster than
/// it may call a model), holding its concurrency slot while it runs.
pub(crate) async fn admitted(
    s: &AppState,
    ctx: &Ctx,
) -> Result<crate::limits::Permit, GatewayError> {
    crate::pipeline::admit(s, ctx, 0).await
}

/// A control-plane answer as the tenant sees it: not found is the
/// object's own 404 (`what` it is), a refusal is bad input, a conflict is
/// the object's state, anything else is unavailability (never the control
/// plane's words).
pub(crate) fn cp_error_on(e: &ClientError, what: &'static str, id: &str) -> GatewayError {
    match e {
        ClientError::Api { status: 404, .. } => GatewayError::NoSuchObject {
            what,
            id: id.to_owned(),
        },
        ClientError::Api {
            status: 409,
            message,
            ..
        } => GatewayError::Conflict(message.clone()),
        ClientError::Api {
            status: 400,
            message,
            ..
        } => bad(message.clone()),
        other => {
            tracing::warn!(error = %bulkhead_control_api::error_chain(other), "files at the control plane");
            GatewayError::Unavailable("files and batches cannot be reached now")
        }
    }
}

/// Checks a batch input file, line by line; its number of lines.
pub(crate) fn check_batch_lines(text: &str) -> Result<usize, GatewayError> {
    let mut ids = HashSet::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = n + 1;
        let v: Value =
            serde_json::from_str(line).map_err(|e| bad(format!("line {at} is not JSON: {e}")))?;
        let id = v
            .get("custom_id")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty() && s.len() <= MAX_CUSTOM_ID)
            .ok_or_else(|| {
                bad(format!(
                    "line {at}: custom_id must be a string of 1 to {MAX_CUSTOM_ID} bytes"
                ))
            })?;
        if !ids.insert(id.to_owned()) {
            return Err(bad(format!(
                "line {at}: custom_id {:?} is used twice",
                id.chars().take(64).collect::<String>()
            )));
        }
        if v.get("method").and_then(Value::as_str) != Some("POST") {
            return Err(bad(format!("line {at}: method must be POST")));
        }
        let url = v.get("url").and_then(Value::as_str).unwrap_or_default();
        if !BATCH_URLS.contains(&url) {
            return Err(bad(format!(
                "line {at}: url must be one of {}",
                BATCH_URLS.join(", ")
            )));
        }
        if !v.get("body").is_some_and(Value::is_object) {
            return Err(bad(format!("line {at}: body must be an object")));
        }
    }
    match ids.len() {
        0 => Err(bad("the file holds no requests")),
        n if n > MAX_FILE_LINES => Err(bad(format!(
            "a file holds at most {MAX_FILE_LINES} requests, not {n}"
        ))),
        n => Ok(n),
    }
}

fn cp_error(e: &ClientError, id: &str) -> GatewayError {
    cp_error_on(e, "File", id)
}

/// `POST /v1/files`.
pub(crate) async fn upload(
    State(s): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    form: Result<Multipart, MultipartRejection>,
) -> Result<Response, ApiError> {
    upload_for(&s, &ctx, form).await.map_err(|e| e.in_(O))
}

async fn upload_for(
    s: &AppState,
    ctx: &Ctx,
    form: Result<Multipart, MultipartRejection>,
) -> Result<Response, GatewayError> {
    let _permit = admitted(s, ctx).await?;
    let mut form =
        form.map_err(|_| bad("the body must be multipart/form-data with a file and a purpose"))?;
    let (mut purpose, mut file) = (None, None);
    while let Some(field) = form.next_field().await.map_err(|e| multipart_error(&e))? {
        match field.name() {
            Some("purpose") => {
                purpose = Some(field.text().await.map_err(|e| multipart_error(&e))?);
            }
            Some("file") => {
                let name = field.file_name().unwrap_or("upload.jsonl").to_owned();
                let bytes = field.bytes().await.map_err(|e| multipart_error(&e))?;
                file = Some((name, bytes));
            }
            Some(other) => {
                return Err(GatewayError::Unsupported(other.chars().take(64).collect()));
            }
            None => return Err(bad("a multipart field has no name")),
        }
    }
    let purpose = purpose.ok_or_else(|| bad("purpose is required"))?;
    if purpose != "batch" {
        return Err(GatewayError::UnsupportedValue {
            param: "purpose".to_owned(),
            detail: "files are served for batch only".to_owned(),
        });
    }
    let (filename, bytes) = file.ok_or_else(|| bad("file is required"))?;
    if bytes.len() > MAX_FILE_BYTES {
        return Err(bad(format!(
            "a file is at most {MAX_FILE_BYTES} bytes, not {}",
            bytes.len()
        )));
    }
    let content = String::from_utf8(bytes.to_vec())
        .map_err(|_| bad("the file must be UTF-8 text (JSON Lines)"))?;
    check_batch_lines(&content)?;
    let upload = FileUpload {
        account_id: ctx.principal.account_id.clone(),
        purpose,
        filename,
        content,
    };
    let f: FileView = s
        .control_plane()
        .post("/admin/v1/files", &upload)
        .await
        .map_err(|e| cp_error(&e, ""))?;
    Ok(Json(file_json(&f)).into_response())
}

/// A multipart body that cannot be read: past the body bound is too large
/// (413), anything else malformed.
fn multipart_error(e: &axum::extract::multipart::MultipartError) -> GatewayError {
    if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
        GatewayError::TooLarge
    } else {
        bad(format!(
            "the multipart body is malformed: {}",
            e.body_text()
        ))
    }
}

/// `GET /v1/files`: every file of the account, newest first. Its query
/// options (`purpose`, `limit`, `after`, `order`) are not served, and are
/// refused by name rather than ignored.
pub(crate) async fn list(
    State(s): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Result<Response, ApiError> {
    if let Some(q) = query.filter(|q| !q.is_empty()) {
        let name = q.split(['=', '&']).next().unwrap_or_default();
        return Err(GatewayError::Unsupported(name.chars().take(64).collect()).in_(O));
    }
    let _permit = admitted(&s, &ctx).await.map_err(|e| e.in_(O))?;
    let path = format!("/admin/v1/files?account={}", ctx.principal.account_id);
    let files: Vec<FileView> = s
        .control_plane()
        .get(&path)
        .await
        .map_err(|e| cp_error(&e, "").in_(O))?;
    let data: Vec<Value> = files.iter().map(file_json).collect();
    Ok(Json(json!({"object": "list", "data": data, "has_more": false})).into_response())
}

/// The id in a file route's path: what OpenAI's ids look like, or it is
/// not found (no other text reaches the control plane's URL).
fn file_id(path: Result<Path<String>, PathRejection>) -> Result<String, GatewayError> {
    let Path(id) = path.map_err(|_| GatewayError::NoRoute)?;
    let ok = id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if ok {
        Ok(id)
    } else {
        Err(GatewayError::NoSuchObject { what: "File", id })
    }
}

/// The control plane's answer on one of the account's files: `rest` is
/// what follows its id in the route (`""` or `/content`).
async fn for_file<T: serde::de::DeserializeOwned>(
    s: &AppState,
    ctx: &Ctx,
    path: Result<Path<String>, PathRejection>,
    rest: &str,
    delete: bool,
) -> Result<T, ApiError> {
    let id = file_id(path).map_err(|e| e.in_(O))?;
    let _permit = admitted(s, ctx).await.map_err(|e| e.in_(O))?;
    let url = format!(
        "/admin/v1/files/{id}{rest}?account={}",
        ctx.principal.account_id
    );
    let cp = s.control_plane();
    let answer = if delete {
        cp.delete(&url).await
    } else {
        cp.get(&url).await
    };
    answer.map_err(|e| cp_error(&e, &id).in_(O))
}

/// `GET /v1/files/{id}`.
pub(crate) async fn one(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    Extension(ctx): Extension<Ctx>,
) -> Result<Response, ApiError> {
    let f: FileView = for_file(&s, &ctx, path, "", false).await?;
    Ok(Json(file_json(&f)).into_response())
}

/// `GET /v1/files/{id}/content`: the file's bytes as uploaded.
pub(crate) async fn content(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    Extension(ctx): Extension<Ctx>,
) -> Result<Response, ApiError> {
    let c: FileContent = for_file(&s, &ctx, path, "/content", false).await?;
    Ok(([(header::CONTENT_TYPE, "application/jsonl")], c.content).into_response())
}

/// `DELETE /v1/files/{id}`.
pub(crate) async fn delete(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    Extension(ctx): Extension<Ctx>,
) -> Result<Response, ApiError> {
    let f: FileView = for_file(&s, &ctx, path, "", true).await?;
    Ok(Json(json!({"id": f.id, "object": "file", "deleted": true})).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(id: &str) -> String {
        json!({"custom_id": id, "method": "POST", "url": "/v1/chat/completions",
               "body": {"model": "m", "messages": []}})
        .to_string()
    }

    #[test]
    fn batch_lines_are_checked_as_the_runner_reads_them() {
        let good = format!("{}\n\n{}\n", line("a"), line("b"));
        assert_eq!(check_batch_lines(&good).unwrap(), 2);
        let refusals = [
            (format!("{}\n{}", line("a"), line("a")), "used twice"),
            ("{\"custom_id\": \"x\"".to_owned(), "line 1 is not JSON"),
            (line(""), "custom_id"),
            (line("a").replace("POST", "GET"), "method"),
            (
                line("a").replace("/v1/chat/completions", "/v1/embeddings"),
                "url",
            ),
            (
                line("a").replace("{\"messages\":[],\"model\":\"m\"}", "[]"),
                "body",
            ),
            ("\n \n".to_owned(), "no requests"),
        ];
        for (text, want) in refusals {
            match check_batch_lines(&text) {
                Err(GatewayError::BadInput(m)) => assert!(m.contains(want), "{m} lacks {want}"),
                other => panic!("{text}: {other:?}"),
            }
        }
    }
}
