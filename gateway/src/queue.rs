//! Workers AI's asynchronous batch API, over the platform's batches:
//! `POST .../ai/run/{model}?queueRequest=true` with `{"requests": [...]}`
//! queues the requests (each an `ai/run` body, with an optional
//! `external_reference`) and answers at once with a `request_id`; the
//! same route with `{"request_id": ...}` answers `queued` or `running`
//! until every request has an answer, then the answers (`responses`, by
//! `id`, the request's place in `requests`) and their summed `usage`.
//!
//! A queue is a batch of the account's (endpoint `/ai/run`, its model in
//! the batch's metadata), run by the batch runner through this gateway's
//! own `ai/run` route, in the batch class: so the same authentication,
//! limits, budgets and metering as any call, and it survives a restart of
//! any component. Its `request_id` is the batch's id; another account's,
//! or one queued for another model, is not found.

use crate::batches::batch_id;
use crate::errors::GatewayError;
use crate::files::{admitted, cp_error_on};
use crate::pipeline::{self, Ctx};
use crate::state::AppState;
use axum::Json;
use axum::response::{IntoResponse, Response};
use bulkhead_control_api::{BatchCreate, BatchView, FileContent, FileUpload};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

/// The batch endpoint of queued Workers AI requests.
pub(crate) const QUEUE_ENDPOINT: &str = "/ai/run";
/// The most requests one queue holds.
const MAX_REQUESTS: usize = 10_000;

fn bad(m: impl Into<String>) -> GatewayError {
    GatewayError::BadInput(m.into())
}

/// Whether a query string asks for the queue (`queueRequest=true`).
pub(crate) fn asked(query: Option<&str>) -> bool {
    query
        .unwrap_or_default()
        .split('&')
        .any(|p| p == "queueRequest=true")
}

/// `POST .../ai/run/{slug}?queueRequest=true`: queue requests, or poll.
pub(crate) async fn run(
    s: &AppState,
    ctx: &Ctx,
    slug: &str,
    body: &[u8],
) -> Result<Response, GatewayError> {
    let v: Map<String, Value> = pipeline::parse_json(body)?;
    if let Some(id) = v.get("request_id") {
        if let Some(other) = v.keys().find(|k| *k != "request_id") {
            return Err(GatewayError::Unsupported(other.chars().take(64).collect()));
        }
        let id = id
            .as_str()
            .ok_or_else(|| bad("request_id must be a string"))?;
        return poll(s, ctx, slug, id).await;
    }
    if let Some(other) = v.keys().find(|k| *k != "requests") {
        return Err(GatewayError::Unsupported(other.chars().take(64).collect()));
    }
    let requests = v
        .get("requests")
        .and_then(Value::as_array)
        .filter(|r| !r.is_empty() && r.len() <= MAX_REQUESTS)
        .ok_or_else(|| {
            bad(format!(
                "a queued call has `requests` (an array of 1 to {MAX_REQUESTS} ai/run bodies) or a `request_id`"
            ))
        })?;
    let account = &ctx.principal.account_id;
    let url = format!("/client/v4/accounts/{account}/ai/run/{slug}");
    let mut lines = String::new();
    for (i, r) in requests.iter().enumerate() {
        let Value::Object(mut r) = r.clone() else {
            return Err(bad(format!("requests[{i}] must be an object")));
        };
        let reference = match r.remove("external_reference") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) if s.len() <= 256 => s,
            Some(_) => {
                return Err(bad(format!(
                    "requests[{i}].external_reference must be a string of at most 256 bytes"
                )));
            }
        };
        if r.get("stream").is_some_and(|s| s != &Value::Bool(false)) {
            return Err(bad(format!(
                "requests[{i}]: queued requests are not streamed"
            )));
        }
        let line = json!({"custom_id": format!("{i}:{reference}"), "method": "POST",
                          "url": url, "body": r});
        lines.push_str(&line.to_string());
        lines.push('\n');
    }
    let _permit = admitted(s, ctx).await?;
    let cp = s.control_plane();
    let upload = FileUpload {
        account_id: account.clone(),
        purpose: "batch".to_owned(),
        filename: "queued-requests.jsonl".to_owned(),
        content: lines,
    };
    let file: bulkhead_control_api::FileView = cp
        .post("/admin/v1/files", &upload)
        .await
        .map_err(|e| cp_error_on(&e, "File", ""))?;
    let create = BatchCreate {
        account_id: account.clone(),
        input_file_id: file.id,
        endpoint: QUEUE_ENDPOINT.to_owned(),
        completion_window: "24h".to_owned(),
        metadata: Some(BTreeMap::from([("model".to_owned(), slug.to_owned())])),
    };
    let b: BatchView = cp
        .post("/admin/v1/batches", &create)
        .await
        .map_err(|e| cp_error_on(&e, "Batch", ""))?;
    Ok(envelope(
        &json!({"status": "queued", "request_id": b.id, "model": slug}),
    ))
}

/// The state of queue `id` of model `slug`, or its answers once done.
async fn poll(s: &AppState, ctx: &Ctx, slug: &str, id: &str) -> Result<Response, GatewayError> {
    let id = batch_id(id.to_owned())?;
    let _permit = admitted(s, ctx).await?;
    let account = &ctx.principal.account_id;
    let cp = s.control_plane();
    let b: BatchView = cp
        .get(&format!("/admin/v1/batches/{id}?account={account}"))
        .await
        .map_err(|e| cp_error_on(&e, "Batch", &id))?;
    let model = b.metadata.as_ref().and_then(|m| m.get("model"));
    if b.endpoint != QUEUE_ENDPOINT || model.map(String::as_str) != Some(slug) {
        // Another kind of batch, or another model's queue: not this one.
        return Err(GatewayError::NoSuchObject { what: "Batch", id });
    }
    let status = match b.status.as_str() {
        "validating" => "queued",
        "in_progress" | "finalizing" | "cancelling" => "running",
        "completed" => "",
        other => {
            return Err(bad(format!(
                "queued request {id} ended {other} without its answers"
            )));
        }
    };
    if !status.is_empty() {
        return Ok(envelope(
            &json!({"status": status, "request_id": id, "model": slug}),
        ));
    }
    let mut answers = Vec::new();
    for file in [&b.output_file_id, &b.error_file_id].into_iter().flatten() {
        let c: FileContent = cp
            .get(&format!("/admin/v1/files/{file}/content?account={account}"))
            .await
            .map_err(|e| cp_error_on(&e, "File", file))?;
        answers.extend(c.content.lines().filter_map(|l| answer(l).ok()));
    }
    answers.sort_by_key(|(i, _)| *i);
    let mut usage = [0u64; 3];
    for (_, a) in &answers {
        for (u, key) in usage
            .iter_mut()
            .zip(["prompt_tokens", "completion_tokens", "total_tokens"])
        {
            *u += a["result"]["usage"][key].as_u64().unwrap_or(0);
        }
    }
    let responses: Vec<Value> = answers.into_iter().map(|(_, a)| a).collect();
    Ok(envelope(&json!({
        "responses": responses,
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": usage[2]},
    })))
}

/// One line of a queue's output as a Workers AI response: its place and
/// the answer (`result` on success, `errors` otherwise).
fn answer(line: &str) -> Result<(u64, Value), serde_json::Error> {
    let v: Value = serde_json::from_str(line)?;
    let custom = v["custom_id"].as_str().unwrap_or_default();
    let (place, reference) = custom.split_once(':').unwrap_or((custom, ""));
    let id = place.parse::<u64>().unwrap_or(u64::MAX);
    let body = &v["response"]["body"];
    let ok = v["response"]["status_code"].as_u64() == Some(200);
    let mut a = json!({"id": id, "success": ok,
                       "external_reference": (!reference.is_empty()).then_some(reference)});
    if ok {
        a["result"] = body["result"].clone();
    } else {
        a["errors"] = body["errors"].clone();
    }
    Ok((id, a))
}

/// Workers AI's envelope around a result.
fn envelope(result: &Value) -> Response {
    Json(json!({"result": result, "success": true, "errors": [], "messages": []})).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_line_is_a_workers_ai_response_by_place() {
        let line = json!({"custom_id": "3:ref-a", "response": {"status_code": 200,
                          "body": {"result": {"response": "hi", "usage": {"total_tokens": 5}}}}});
        let (id, a) = answer(&line.to_string()).expect("parsed");
        assert_eq!(id, 3);
        assert_eq!(a["result"]["response"], "hi");
        assert_eq!(
            (a["success"].as_bool(), a["external_reference"].as_str()),
            (Some(true), Some("ref-a"))
        );
        let failed = json!({"custom_id": "0:", "response": {"status_code": 400,
                            "body": {"errors": [{"code": 5006, "message": "Bad input"}]}}});
        let (id, a) = answer(&failed.to_string()).expect("parsed");
        assert_eq!((id, a["success"].as_bool()), (0, Some(false)));
        assert!(a["external_reference"].is_null() && a["errors"][0]["code"] == 5006);
        assert!(
            asked(Some("queueRequest=true")) && !asked(Some("queueRequest=false")) && !asked(None)
        );
    }
}
