//! The Workers AI API under `/client/v4/accounts/{account_id}/ai`:
//! `POST run/{model}` (the slug with raw slashes or percent-encoded, as the
//! official Python SDK sends it) and `GET models/search`. Answers use the v4
//! envelope `{"result", "success", "errors", "messages"}`.
//!
//! `GET usage` serves the authenticated account's own usage, read from the
//! control plane's ledger, and no other account's.

use crate::errors::{ApiError, Flavor, GatewayError};
use crate::pipeline::{self, Ctx, StreamEvent};
use crate::state::AppState;
use axum::Extension;
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use bulkhead_worker_api::{GenerateBody, Message};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::HashMap;

const W: Flavor = Flavor::WorkersAi;

/// `POST run/{model}` body: a prompt or messages, and sampling settings.
/// `response_format` and `tools` are enforced; any other field that asks
/// for something (`lora`, …) is refused, not ignored.
#[derive(Debug, Deserialize)]
struct RunBody {
    prompt: Option<String>,
    messages: Option<Vec<RunMessage>>,
    tools: Option<Value>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<Value>,
    #[serde(default)]
    raw: bool,
    #[serde(default)]
    stream: bool,
    max_tokens: Option<i64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
    seed: Option<i64>,
    repetition_penalty: Option<f64>,
    /// JSON mode or a JSON schema, enforced by constrained sampling.
    response_format: Option<Value>,
    /// Everything else the body holds.
    #[serde(flatten)]
    other: serde_json::Map<String, Value>,
}

/// A message of `ai/run`: `tool_calls` in Workers AI's flat
/// `{name, arguments}` shape (the id is optional) or OpenAI's.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunMessage {
    role: String,
    /// Text; an assistant message that only calls may leave it null.
    #[serde(default)]
    content: Option<String>,
    tool_calls: Option<Value>,
    tool_call_id: Option<String>,
    /// A `tool` message's function name (Workers AI's examples send it):
    /// accepted, not used; a result names its function through the call
    /// its `tool_call_id` answers.
    #[serde(rename = "name")]
    _name: Option<String>,
}

impl RunMessage {
    fn to_worker(&self) -> Result<Message, GatewayError> {
        let tool_calls = match &self.tool_calls {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(calls)) => {
                let openai: Vec<Value> = calls
                    .iter()
                    .map(|c| match c.get("function") {
                        Some(_) => c.clone(),
                        None => json!({
                            "id": c.get("id").cloned().unwrap_or_else(|| json!(crate::tools::call_id())),
                            "function": {"name": c.get("name"), "arguments": c.get("arguments")}
                        }),
                    })
                    .collect();
                crate::tools::history_calls(&Value::Array(openai))?
            }
            Some(_) => return Err(bad("tool_calls must be an array")),
        };
        Ok(Message {
            role: self.role.clone(),
            content: self.content.clone().unwrap_or_default(),
            tool_calls,
            tool_call_id: self.tool_call_id.clone(),
        })
    }
}

fn bad(m: &str) -> GatewayError {
    GatewayError::BadInput(m.to_owned())
}

impl RunBody {
    /// The worker request, with Workers AI's ranges and defaults checked.
    fn to_worker(&self) -> Result<GenerateBody, GatewayError> {
        crate::params::refuse_unsupported(&self.other)?;
        let mut b = GenerateBody {
            max_tokens: 256,
            temperature: 0.6,
            response_format: crate::params::response_format(self.response_format.as_ref())?,
            ..GenerateBody::default()
        };
        match (&self.prompt, &self.messages) {
            (Some(p), None) => {
                if p.is_empty() || p.len() > 131_072 {
                    return Err(bad("prompt must be 1 to 131072 characters"));
                }
                if self.raw {
                    b.raw = Some(p.clone());
                } else {
                    b.prompt = Some(p.clone());
                }
            }
            (None, Some(m)) => {
                if m.is_empty() {
                    return Err(bad("messages must not be empty"));
                }
                for msg in m {
                    if !["system", "user", "assistant", "tool"].contains(&msg.role.as_str()) {
                        return Err(bad("message role must be system, user, assistant or tool"));
                    }
                    if msg.content.as_ref().is_some_and(|c| c.len() > 131_072) {
                        return Err(bad("message content must be at most 131072 characters"));
                    }
                }
                b.messages = Some(
                    m.iter()
                        .map(RunMessage::to_worker)
                        .collect::<Result<_, _>>()?,
                );
            }
            _ => return Err(bad("exactly one of prompt and messages is required")),
        }
        if let Some(n) = self.max_tokens {
            b.max_tokens = usize::try_from(n)
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| bad("max_tokens must be at least 1"))?;
        }
        if let Some(t) = self.temperature {
            if !(0.0..=5.0).contains(&t) {
                return Err(bad("temperature must be between 0 and 5"));
            }
            b.temperature = t as f32;
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 2.0) {
                return Err(bad("top_p must be above 0 and at most 2"));
            }
            b.top_p = p.min(1.0) as f32;
        }
        if let Some(k) = self.top_k {
            b.top_k = usize::try_from(k)
                .ok()
                .filter(|k| (1..=50).contains(k))
                .ok_or_else(|| bad("top_k must be between 1 and 50"))?;
        }
        // Without a seed every request samples differently, as users expect.
        b.seed = crate::pipeline::random_seed();
        if let Some(s) = self.seed {
            b.seed = u64::try_from(s)
                .ok()
                .filter(|s| (1..=9_999_999_999).contains(s))
                .ok_or_else(|| bad("seed must be between 1 and 9999999999"))?;
        }
        b.tools = crate::tools::offer(
            self.tools.as_ref(),
            self.tool_choice.as_ref(),
            self.parallel_tool_calls.as_ref(),
        )?;
        if b.tools.is_some() {
            if b.messages.is_none() {
                // A prompt is one user message: with tools, a chat of one.
                b.messages = b.prompt.take().map(|p| {
                    vec![Message {
                        role: "user".to_owned(),
                        content: p,
                        tool_calls: Vec::new(),
                        tool_call_id: None,
                    }]
                });
            }
            if b.messages.is_none() || b.response_format.is_some() {
                return Err(GatewayError::UnsupportedValue {
                    param: "tools".to_owned(),
                    detail: "served with messages or a prompt, and without raw or response_format"
                        .to_owned(),
                });
            }
        }
        if let Some(r) = self.repetition_penalty {
            if !(r > 0.0 && r <= 2.0) {
                return Err(bad("repetition_penalty must be above 0 and at most 2"));
            }
            b.repetition_penalty = r as f32;
        }
        Ok(b)
    }
}

/// `POST /client/v4/accounts/{account_id}/ai/run/{model}`.
pub(crate) async fn run(
    State(s): State<AppState>,
    path: Result<Path<(String, String)>, PathRejection>,
    Extension(ctx): Extension<Ctx>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let Path((account, slug)) = path.map_err(|_| GatewayError::NoRoute.in_(W))?;
    ctx.for_account(&account).map_err(|e| e.in_(W))?;
    let model = pipeline::model(&ctx, &slug).map_err(|e| e.in_(W))?;
    let body = body.map_err(|e| crate::edge::body_refused(&e, W))?;
    if pipeline::embeds(model) {
        if crate::queue::asked(query.as_deref()) {
            return Err(GatewayError::Unsupported("queueRequest".to_owned()).in_(W));
        }
        return crate::embeddings::run(&s, &ctx, model, &body)
            .await
            .map_err(|e| e.in_(W));
    }
    if crate::queue::asked(query.as_deref()) {
        return crate::queue::run(&s, &ctx, model.slug.as_str(), &body)
            .await
            .map_err(|e| e.in_(W));
    }
    let req: RunBody = pipeline::parse_json(&body).map_err(|e| e.in_(W))?;
    let worker = req.to_worker().map_err(|e| e.in_(W))?;
    let json_mode = worker.response_format.is_some();
    let calls = crate::tools::may_call(&worker);
    let g = pipeline::start(&s, &ctx, model, worker)
        .await
        .map_err(|e| e.in_(W))?;
    if req.stream {
        let mut splitter = calls.then(bulkhead_grammar::tools::Splitter::new);
        return Ok(pipeline::sse(g, move |ev| match ev {
            StreamEvent::Text(t, _) => match &mut splitter {
                None => vec![json!({"response": t}).to_string()],
                Some(s) => s.push(t).iter().map(run_piece).collect(),
            },
            StreamEvent::Finished { usage, .. } => {
                let mut out: Vec<String> = splitter
                    .take()
                    .and_then(bulkhead_grammar::tools::Splitter::finish)
                    .iter()
                    .map(run_piece)
                    .collect();
                out.push(json!({"response": "", "usage": pipeline::usage_json(usage)}).to_string());
                out
            }
            StreamEvent::Failed(e) => vec![e.stream_event(W).to_string()],
        }));
    }
    let done = pipeline::collect(g).await.map_err(|e| e.in_(W))?;
    let mut result = json!({"usage": pipeline::usage_json(done.usage)});
    if calls {
        // Calls as Workers AI gives them: arguments as an object.
        let (text, made) = bulkhead_grammar::tools::split(&done.text);
        result["response"] = Value::String(text);
        if !made.is_empty() {
            result["tool_calls"] = made
                .iter()
                .map(|c| json!({"name": c.name, "arguments": crate::tools::arguments_object(c)}))
                .collect();
        }
    } else {
        // In JSON mode Workers AI answers with the value itself; output cut
        // short by max_tokens stays text.
        result["response"] = match serde_json::from_str::<Value>(&done.text) {
            Ok(v) if json_mode => v,
            _ => Value::String(done.text),
        };
    }
    Ok(Json(json!({
        "result": result,
        "success": true,
        "errors": [],
        "messages": []
    }))
    .into_response())
}

/// A streamed piece of an answer with tools: text as `response`, a whole
/// call as `tool_calls`.
fn run_piece(p: &bulkhead_grammar::tools::Piece) -> String {
    use bulkhead_grammar::tools::Piece;
    match p {
        Piece::Text(t) => json!({"response": t}).to_string(),
        Piece::Call(c) => {
            json!({"response": "", "tool_calls": [{"name": c.name, "arguments": crate::tools::arguments_object(c)}]})
                .to_string()
        }
    }
}

/// An account route's query string, as axum extracted it.
pub(crate) type AccountQuery =
    Result<Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>;

/// The query of a route under `/accounts/{account_id}`, once the path names
/// the caller's own account (another account's URL is refused like every
/// route's).
fn own_query(
    path: Result<Path<String>, PathRejection>,
    query: AccountQuery,
    ctx: &Ctx,
) -> Result<HashMap<String, String>, ApiError> {
    ctx.owns(path, W)?;
    let Query(q) = query.map_err(|_| bad("invalid query string").in_(W))?;
    Ok(q)
}

/// `GET /client/v4/accounts/{account_id}/ai/usage`: the account's own
/// usage by UTC day and model, from the control plane's ledger (`since`
/// and `until` as `YYYY-MM-DD`; the last 30 days by default), in Workers
/// AI's envelope. Another account's URL is refused like every route's.
pub(crate) async fn usage(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    query: AccountQuery,
    Extension(ctx): Extension<Ctx>,
) -> Result<Response, ApiError> {
    let q = own_query(path, query, &ctx)?;
    let mut url = format!("/admin/v1/usage?account={}", ctx.principal.account_id);
    for key in ["since", "until"] {
        if let Some(v) = q.get(key) {
            let day_like = v.len() == 10 && v.bytes().all(|b| b.is_ascii_digit() || b == b'-');
            if !day_like {
                return Err(bad(&format!("{key} is a UTC day, YYYY-MM-DD")).in_(W));
            }
            url.push_str(&format!("&{key}={v}"));
        }
    }
    if let Some(k) = q.keys().find(|k| !matches!(k.as_str(), "since" | "until")) {
        return Err(bad(&format!("unknown query parameter {k}")).in_(W));
    }
    let rows: Vec<bulkhead_control_api::UsageRow> = match s.control_plane().get(&url).await {
        Ok(rows) => rows,
        Err(bulkhead_control_api::ClientError::Api {
            status: 400,
            message,
            ..
        }) => {
            return Err(bad(&message).in_(W));
        }
        Err(e) => {
            tracing::warn!(error = %bulkhead_control_api::error_chain(&e), "reading usage from the control plane");
            return Err(GatewayError::Unavailable("usage cannot be read now").in_(W));
        }
    };
    let result: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({"date": r.date, "model": r.model, "requests": r.requests,
                   "prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
                   "total_tokens": r.prompt_tokens + r.completion_tokens,
                   "neurons": neurons(r.micro_neurons)})
        })
        .collect();
    let free = ctx
        .snap
        .table
        .account(&ctx.principal.account_id)
        .map_or(0, |a| a.budget.free_neurons_per_day);
    Ok(Json(
        json!({"result": result, "result_info": {"days": billing(&rows, free)},
                   "success": true, "errors": [], "messages": []}),
    )
    .into_response())
}

/// Micro-neurons as neurons.
fn neurons(micro: u64) -> f64 {
    micro as f64 / bulkhead_control_api::MICRO as f64
}

/// Each day's neurons over all models, the part the free allowance covers
/// and the part billed.
fn billing(rows: &[bulkhead_control_api::UsageRow], free_per_day: u64) -> Vec<Value> {
    let mut days: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
    for r in rows {
        *days.entry(r.date.as_str()).or_default() += r.micro_neurons;
    }
    let free = free_per_day.saturating_mul(bulkhead_control_api::MICRO);
    days.into_iter()
        .map(|(date, micro)| {
            json!({"date": date, "neurons": neurons(micro),
                   "free_neurons": neurons(micro.min(free)),
                   "billable_neurons": neurons(micro.saturating_sub(free))})
        })
        .collect()
}

/// `GET /client/v4/accounts/{account_id}/ai/models/search`: the models this
/// account may call, filtered by `search` (in the name or description) and
/// `task`, paged by `page` and `per_page`; a page past the end has an empty
/// `result` (the SDK pages until it sees one).
pub(crate) async fn search(
    path: Result<Path<String>, PathRejection>,
    query: AccountQuery,
    Extension(ctx): Extension<Ctx>,
) -> Result<Response, ApiError> {
    let q = own_query(path, query, &ctx)?;
    let number = |key: &str, default: usize, max: usize| -> Result<usize, ApiError> {
        match q.get(key) {
            None => Ok(default),
            Some(v) => v
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=max).contains(n))
                .ok_or_else(|| bad(&format!("{key} must be a number from 1 to {max}")).in_(W)),
        }
    };
    let page = number("page", 1, 1_000_000)?;
    let per_page = number("per_page", 20, 100)?;
    let search = q.get("search").map(|s| s.to_lowercase());
    let task = q.get("task").map(|t| t.to_lowercase());
    let all: Vec<Value> = ctx
        .snap
        .table
        .visible_models(&ctx.principal.account_id)
        .into_iter()
        .filter(|m| {
            search.as_ref().is_none_or(|s| {
                m.slug.as_str().contains(s.as_str()) || m.description.to_lowercase().contains(s.as_str())
            })
        })
        .filter(|m| task.as_ref().is_none_or(|t| m.task.to_lowercase() == *t))
        .map(|m| {
            let mut properties = Vec::new();
            if let Some(p) = m.properties {
                properties.push(json!({"property_id": "context_window", "value": p.context_window.to_string()}));
                properties.push(json!({"property_id": "max_total_tokens", "value": p.required_tokens().to_string()}));
            }
            let created = m.created_at.to_string().replace('T', " ").trim_end_matches('Z').to_owned();
            json!({
                "id": uuid_of(m.slug.as_str()),
                "source": 1,
                "name": m.slug.as_str(),
                "description": m.description,
                "task": {"id": uuid_of(&m.task), "name": m.task, "description": ""},
                "created_at": created,
                "tags": [],
                "properties": properties
            })
        })
        .collect();
    let total = all.len();
    let result: Vec<Value> = all
        .into_iter()
        .skip((page - 1).saturating_mul(per_page))
        .take(per_page)
        .collect();
    Ok(Json(json!({
        "result_info": {"page": page, "per_page": per_page, "count": result.len(), "total_count": total},
        "result": result,
        "success": true,
        "errors": [],
        "messages": []
    }))
    .into_response())
}

/// A stable id for a name: the RFC 9562 name-based UUID (version 5) of
/// the name in the URL namespace.
fn uuid_of(name: &str) -> String {
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_URL, name.as_bytes()).to_string()
}
