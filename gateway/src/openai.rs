//! The OpenAI-compatible API: `/v1/chat/completions`, `/v1/completions`,
//! `/v1/models` (the account comes from the token), and the same chat and
//! models routes under `/client/v4/accounts/{account_id}/ai/v1`. Answers
//! and errors in OpenAI's shapes, streaming as `chat.completion.chunk`s with
//! `stream_options.include_usage` honoured.

use crate::errors::{ApiError, Flavor, GatewayError};
use crate::pipeline::{self, Ctx, StreamEvent};
use crate::state::AppState;
use axum::Extension;
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use bulkhead_control_api::RoutedModel;
use bulkhead_worker_api::context::WorkClass;
use bulkhead_worker_api::{GenerateBody, Message, TokenLogprobs, Usage};
use serde::Deserialize;
use serde_json::{Value, json};

const O: Flavor = Flavor::OpenAi;

/// The most choices one request may ask for.
const MAX_N: usize = 8;

fn bad(m: &str) -> GatewayError {
    GatewayError::BadInput(m.to_owned())
}

#[derive(Debug, Default, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// Sampling settings both endpoints share. Every other field is refused
/// unless it asks for nothing (`unsupported`): a client is never answered
/// as if a setting it sent had been applied.
#[derive(Debug, Deserialize)]
struct Common {
    model: Option<String>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    seed: Option<i64>,
    stop: Option<Value>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    n: Option<i64>,
    response_format: Option<Value>,
    logprobs: Option<Value>,
    top_logprobs: Option<Value>,
    service_tier: Option<Value>,
    /// Everything else the body holds.
    #[serde(flatten)]
    other: serde_json::Map<String, Value>,
}

#[derive(Debug, Deserialize)]
struct ChatBody {
    messages: Option<Vec<ChatMessage>>,
    tools: Option<Value>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<Value>,
    #[serde(flatten)]
    common: Common,
}

#[derive(Debug, Deserialize)]
struct ChatMessage {
    role: String,
    content: Option<Value>,
    /// An assistant message's calls.
    tool_calls: Option<Value>,
    /// A `tool` message: the call it answers.
    tool_call_id: Option<String>,
}

#[derive(Debug, Deserialize)]
struct CompletionBody {
    prompt: Option<Value>,
    #[serde(flatten)]
    common: Common,
}

impl Common {
    fn model(&self) -> Result<&str, GatewayError> {
        self.model
            .as_deref()
            .filter(|m| !m.is_empty())
            .ok_or_else(|| bad("you must provide a model parameter"))
    }

    /// How many choices: 1 to [`MAX_N`], more than one without streaming.
    fn n(&self) -> Result<usize, GatewayError> {
        let n = match self.n {
            None => 1,
            Some(n) => usize::try_from(n)
                .ok()
                .filter(|n| (1..=MAX_N).contains(n))
                .ok_or_else(|| bad("n must be between 1 and 8"))?,
        };
        if n > 1 && self.stream {
            return Err(GatewayError::UnsupportedValue {
                param: "n".to_owned(),
                detail: "more than one choice is served without streaming only".to_owned(),
            });
        }
        Ok(n)
    }

    /// Chat's `logprobs` (a boolean) and `top_logprobs` (0 to 20, only
    /// with `logprobs`): the alternatives to report per token, if any.
    fn chat_logprobs(&self) -> Result<Option<u8>, GatewayError> {
        let top = match &self.top_logprobs {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                v.as_u64()
                    .and_then(|n| u8::try_from(n).ok())
                    .filter(|n| *n <= 20)
                    .ok_or_else(|| bad("top_logprobs must be an integer between 0 and 20"))?,
            ),
        };
        match &self.logprobs {
            Some(Value::Bool(true)) => Ok(Some(top.unwrap_or(0))),
            None | Some(Value::Null | Value::Bool(false)) => match top {
                Some(n) if n > 0 => Err(bad("top_logprobs requires logprobs to be true")),
                _ => Ok(None),
            },
            Some(_) => Err(bad("logprobs must be a boolean")),
        }
    }

    /// The legacy completions API's `logprobs` (an integer) is not served.
    fn refuse_completion_logprobs(&self) -> Result<(), GatewayError> {
        match &self.logprobs {
            None | Some(Value::Null | Value::Bool(false)) => {}
            Some(v) if v.as_u64() == Some(0) => {}
            Some(_) => return Err(GatewayError::Unsupported("logprobs".to_owned())),
        }
        match &self.top_logprobs {
            None | Some(Value::Null) => Ok(()),
            Some(_) => Err(GatewayError::Unsupported("top_logprobs".to_owned())),
        }
    }

    fn apply(&self, b: &mut GenerateBody, default_max: usize) -> Result<(), GatewayError> {
        crate::params::refuse_unsupported(&self.other)?;
        b.response_format = crate::params::response_format(self.response_format.as_ref())?;
        b.max_tokens = match self.max_completion_tokens.or(self.max_tokens) {
            Some(n) => usize::try_from(n)
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| bad("max_tokens must be at least 1"))?,
            None => default_max,
        };
        b.temperature = match self.temperature {
            Some(t) if (0.0..=2.0).contains(&t) => t as f32,
            Some(_) => return Err(bad("temperature must be between 0 and 2")),
            None => 1.0,
        };
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return Err(bad("top_p must be above 0 and at most 1"));
            }
            b.top_p = p as f32;
        }
        b.seed = match self.seed {
            Some(s) => s as u64,
            None => crate::pipeline::random_seed(),
        };
        b.stop = match &self.stop {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(a)) if a.len() <= 4 => a
                .iter()
                .map(|s| {
                    s.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| bad("stop must be strings"))
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(bad("stop must be a string or up to 4 strings")),
        };
        bulkhead_worker_api::check_stops(&b.stop).map_err(|m| bad(&m))?;
        Ok(())
    }

    /// `service_tier`: `flex` is served after every interactive request's
    /// prompt work (of any tenant), from what it leaves of each step;
    /// `auto` and `default` (or none) are interactive.
    fn class(&self) -> Result<WorkClass, GatewayError> {
        match self.service_tier.as_ref().and_then(Value::as_str) {
            _ if self.service_tier.as_ref().is_none_or(Value::is_null) => {
                Ok(WorkClass::Interactive)
            }
            Some("auto" | "default") => Ok(WorkClass::Interactive),
            Some("flex") => Ok(WorkClass::Batch),
            _ => Err(GatewayError::UnsupportedValue {
                param: "service_tier".to_owned(),
                detail: "auto, default and flex are served".to_owned(),
            }),
        }
    }

    fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }
}

fn text_of(content: &Option<Value>) -> Result<String, GatewayError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut out = String::new();
            for p in parts {
                match (
                    p.get("type").and_then(Value::as_str),
                    p.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    _ => return Err(bad("only text content parts are supported")),
                }
            }
            Ok(out)
        }
        Some(_) => Err(bad(
            "message content must be a string or an array of text parts",
        )),
    }
}

fn default_max(model: &RoutedModel) -> usize {
    model.properties.map_or(256, |p| {
        usize::try_from(p.max_output.min(1024)).unwrap_or(256)
    })
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn request_id(prefix: &str) -> String {
    let mut b = [0u8; 12];
    let _ = getrandom::fill(&mut b);
    format!("{prefix}-{}", hex::encode(b))
}

/// OpenAI's `logprobs` object of a chat choice.
fn logprobs_json(l: &[TokenLogprobs]) -> Value {
    let entry = |bytes: &[u8], logprob: f32| {
        json!({
            "token": String::from_utf8_lossy(bytes),
            "logprob": logprob,
            "bytes": bytes,
        })
    };
    let content: Vec<Value> = l
        .iter()
        .map(|t| {
            let mut e = entry(&t.bytes, t.logprob);
            e["top_logprobs"] = t.top.iter().map(|a| entry(&a.bytes, a.logprob)).collect();
            e
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// Seeds of `n` choices: the client's seed and the ones after it, or fresh.
fn seeds(first: u64, fixed: bool, n: usize) -> Vec<u64> {
    (0..n as u64)
        .map(|i| {
            if fixed || i == 0 {
                first.wrapping_add(i)
            } else {
                crate::pipeline::random_seed()
            }
        })
        .collect()
}

/// Runs `n` choices of one request at once (not streamed): their answers in
/// order, or the first error, and the others are dropped at once (their
/// workers cancel them) and every call of the request is voided in the
/// ledger: the client was told only of the error, so nothing is billed.
/// Choice `i` is signed as such: only choice 0's worker bills the prompt,
/// once for the request, as its `usage` says.
async fn collect_n(
    s: &AppState,
    ctx: &Ctx,
    model: &RoutedModel,
    worker: &GenerateBody,
    fixed_seed: bool,
    n: usize,
) -> Result<Vec<pipeline::Collected>, GatewayError> {
    let runs = seeds(worker.seed, fixed_seed, n)
        .into_iter()
        .enumerate()
        .map(|(i, seed)| {
            let body = GenerateBody {
                seed,
                ..worker.clone()
            };
            let choice = u32::try_from(i).unwrap_or(u32::MAX);
            async move {
                let g = pipeline::start_choice(s, ctx, model, body, choice).await?;
                pipeline::collect(g).await
            }
        });
    let done = futures_util::future::try_join_all(runs).await;
    if done.is_err() && n > 1 {
        pipeline::void_calls(s, ctx, model);
    }
    done
}

/// One request's usage over its choices: the prompt once, every choice's
/// output.
fn usage_of(choices: &[pipeline::Collected]) -> Usage {
    Usage {
        prompt_tokens: choices.first().map_or(0, |c| c.usage.prompt_tokens),
        completion_tokens: choices.iter().map(|c| c.usage.completion_tokens).sum(),
    }
}

/// `POST /v1/chat/completions`.
pub(crate) async fn chat(
    State(s): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(|e| crate::edge::body_refused(&e, O))?;
    chat_for(&s, &ctx, &body).await.map_err(|e| e.in_(O))
}

/// `POST /client/v4/accounts/{account_id}/ai/v1/chat/completions`.
pub(crate) async fn account_chat(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    Extension(ctx): Extension<Ctx>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    ctx.owns(path, O)?;
    let body = body.map_err(|e| crate::edge::body_refused(&e, O))?;
    chat_for(&s, &ctx, &body).await.map_err(|e| e.in_(O))
}

async fn chat_for(s: &AppState, ctx: &Ctx, body: &[u8]) -> Result<Response, GatewayError> {
    let req: ChatBody = pipeline::parse_json(body)?;
    let ctx = &Ctx {
        class: ctx.asks(req.common.class()?),
        ..ctx.clone()
    };
    let slug = req.common.model()?;
    let model = pipeline::model(ctx, slug)?;
    let messages = req
        .messages
        .as_ref()
        .filter(|m| !m.is_empty())
        .ok_or_else(|| bad("messages must not be empty"))?;
    let mut worker = GenerateBody {
        messages: Some(chat_messages(messages)?),
        ..GenerateBody::default()
    };
    req.common.apply(&mut worker, default_max(model))?;
    worker.logprobs = req.common.chat_logprobs()?;
    worker.tools = crate::tools::offer(
        req.tools.as_ref(),
        req.tool_choice.as_ref(),
        req.parallel_tool_calls.as_ref(),
    )?;
    // Calls are read out of the answer's text: they are not tokens of
    // content with log-probabilities, nor a value of a response format.
    if worker.tools.is_some() {
        for (param, set) in [
            ("logprobs", worker.logprobs.is_some()),
            ("response_format", worker.response_format.is_some()),
        ] {
            if set {
                return Err(GatewayError::UnsupportedValue {
                    param: param.to_owned(),
                    detail: "not served together with tools".to_owned(),
                });
            }
        }
    }
    let calls = crate::tools::may_call(&worker);
    let n = req.common.n()?;
    let id = request_id("chatcmpl");
    let created = now_secs();
    let name = model.slug.to_string();
    if req.common.stream {
        let g = pipeline::start(s, ctx, model, worker).await?;
        let mut chunks = ChatChunks {
            id,
            created,
            name,
            with_logprobs: req.common.chat_logprobs()?.is_some(),
            include_usage: req.common.include_usage(),
            first: true,
            calls: calls.then(|| (bulkhead_grammar::tools::Splitter::new(), 0)),
        };
        return Ok(pipeline::sse(g, move |ev| chunks.render(ev)));
    }
    let with_logprobs = worker.logprobs.is_some();
    let done = collect_n(s, ctx, model, &worker, req.common.seed.is_some(), n).await?;
    let choices: Vec<Value> = done
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (message, finish_reason) = chat_answer(c, calls);
            json!({
                "index": i,
                "message": message,
                "logprobs": if with_logprobs { logprobs_json(&c.logprobs) } else { Value::Null },
                "finish_reason": finish_reason
            })
        })
        .collect();
    Ok(Json(json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": name,
        "choices": choices,
        "usage": pipeline::usage_json(usage_of(&done))
    }))
    .into_response())
}

/// A chat answer's message and finish reason: with calls possible, the
/// calls its text makes are `tool_calls` (and a stop to make them is
/// `tool_calls`); the rest of the text is content.
fn chat_answer(c: &pipeline::Collected, calls: bool) -> (Value, Value) {
    if calls {
        let (text, made) = bulkhead_grammar::tools::split(&c.text);
        if !made.is_empty() {
            let list: Vec<Value> = made
                .iter()
                .map(|call| crate::tools::openai_call(&crate::tools::call_id(), call))
                .collect();
            let finish = if c.finish_reason == "stop" {
                "tool_calls"
            } else {
                c.finish_reason.as_str()
            };
            let content = if text.is_empty() {
                Value::Null
            } else {
                Value::String(text)
            };
            return (
                json!({"role": "assistant", "content": content, "refusal": null, "tool_calls": list}),
                json!(finish),
            );
        }
    }
    (
        json!({"role": "assistant", "content": c.text, "refusal": null}),
        json!(c.finish_reason),
    )
}

/// The worker's messages of a chat request (`developer` is `system`).
fn chat_messages(messages: &[ChatMessage]) -> Result<Vec<Message>, GatewayError> {
    messages
        .iter()
        .map(|m| {
            let role = match m.role.as_str() {
                "developer" => "system",
                r @ ("system" | "user" | "assistant" | "tool") => r,
                _ => {
                    return Err(bad(
                        "message role must be system, developer, user, assistant or tool",
                    ));
                }
            };
            let tool_calls = match &m.tool_calls {
                None | Some(Value::Null) => Vec::new(),
                Some(_) if role != "assistant" => {
                    return Err(bad("only assistant messages have tool_calls"));
                }
                Some(v) => crate::tools::history_calls(v)?,
            };
            if role == "tool" && m.tool_call_id.is_none() {
                return Err(bad("a tool message needs the tool_call_id it answers"));
            }
            Ok(Message {
                role: role.to_owned(),
                content: text_of(&m.content)?,
                tool_calls,
                tool_call_id: m.tool_call_id.clone(),
            })
        })
        .collect()
}

/// Renders a chat stream as OpenAI's `chat.completion.chunk`s: the role
/// first, content deltas, the finish chunk, and usage on the last event
/// whatever the client asked (on the finish chunk, or OpenAI's own usage
/// chunk when `stream_options.include_usage` asked for it).
#[derive(Debug)]
struct ChatChunks {
    id: String,
    created: u64,
    name: String,
    with_logprobs: bool,
    include_usage: bool,
    first: bool,
    /// With calls possible: the text's splitter and the calls sent so far.
    calls: Option<(bulkhead_grammar::tools::Splitter, usize)>,
}

impl ChatChunks {
    /// Chunks of content and calls: each call whole, in one delta with its
    /// index, id, name and arguments (the openai SDK assembles fragments,
    /// and a single one is a fragment).
    fn pieces(&mut self, pieces: Vec<bulkhead_grammar::tools::Piece>, out: &mut Vec<String>) {
        use bulkhead_grammar::tools::Piece;
        for p in pieces {
            let delta = match p {
                Piece::Text(t) => json!({"content": t}),
                Piece::Call(call) => {
                    let index = self.calls.as_ref().map_or(0, |(_, n)| *n);
                    if let Some((_, n)) = &mut self.calls {
                        *n += 1;
                    }
                    let mut c = crate::tools::openai_call(&crate::tools::call_id(), &call);
                    c["index"] = json!(index);
                    json!({"tool_calls": [c]})
                }
            };
            out.push(self.chunk(delta, Value::Null, Value::Null).to_string());
        }
    }

    fn chunk(&self, delta: Value, logprobs: Value, finish: Value) -> Value {
        let choice = serde_json::Map::from_iter([
            ("index".to_owned(), json!(0)),
            ("delta".to_owned(), delta),
            ("logprobs".to_owned(), logprobs),
            ("finish_reason".to_owned(), finish),
        ]);
        let mut c = json!({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.name, "choices": [choice]
        });
        if self.include_usage {
            c["usage"] = Value::Null;
        }
        c
    }

    fn render(&mut self, ev: StreamEvent<'_>) -> Vec<String> {
        let mut out = Vec::new();
        if self.first && !matches!(ev, StreamEvent::Failed(_)) {
            self.first = false;
            let role = json!({"role": "assistant", "content": ""});
            out.push(self.chunk(role, Value::Null, Value::Null).to_string());
        }
        match ev {
            StreamEvent::Text(t, l) => {
                if let Some((splitter, _)) = &mut self.calls {
                    let pieces = splitter.push(t);
                    self.pieces(pieces, &mut out);
                    return out;
                }
                let logprobs = if self.with_logprobs {
                    logprobs_json(l)
                } else {
                    Value::Null
                };
                out.push(
                    self.chunk(json!({"content": t}), logprobs, Value::Null)
                        .to_string(),
                );
            }
            StreamEvent::Finished {
                finish_reason,
                usage,
            } => {
                let mut finish_reason = finish_reason;
                if let Some((splitter, _)) = &mut self.calls {
                    let held = std::mem::take(splitter).finish();
                    self.pieces(held.into_iter().collect(), &mut out);
                    if self.calls.as_ref().is_some_and(|(_, n)| *n > 0) && finish_reason == "stop" {
                        finish_reason = "tool_calls".to_owned();
                    }
                }
                let mut end = self.chunk(json!({}), Value::Null, json!(finish_reason));
                if !self.include_usage {
                    end["usage"] = pipeline::usage_json(usage);
                }
                out.push(end.to_string());
                if self.include_usage {
                    out.push(
                        json!({"id": self.id, "object": "chat.completion.chunk",
                               "created": self.created, "model": self.name, "choices": [],
                               "usage": pipeline::usage_json(usage)})
                        .to_string(),
                    );
                }
            }
            StreamEvent::Failed(e) => out.push(e.stream_event(O).to_string()),
        }
        out
    }
}

/// `POST /v1/completions`: raw text in, no chat template.
pub(crate) async fn completions(
    State(s): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(|e| crate::edge::body_refused(&e, O))?;
    completions_for(&s, &ctx, &body).await.map_err(|e| e.in_(O))
}

async fn completions_for(s: &AppState, ctx: &Ctx, body: &[u8]) -> Result<Response, GatewayError> {
    let req: CompletionBody = pipeline::parse_json(body)?;
    let ctx = &Ctx {
        class: ctx.asks(req.common.class()?),
        ..ctx.clone()
    };
    let slug = req.common.model()?;
    let model = pipeline::model(ctx, slug)?;
    // One string, or (as OpenAI's API allows) one prompt's token ids.
    let ids = |a: &[Value]| -> Option<Vec<u32>> {
        a.iter()
            .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect()
    };
    let mut worker = match &req.prompt {
        Some(Value::String(p)) if !p.is_empty() => GenerateBody {
            raw: Some(p.clone()),
            ..GenerateBody::default()
        },
        Some(Value::Array(a)) if a.len() == 1 && a[0].as_str().is_some_and(|p| !p.is_empty()) => {
            GenerateBody {
                raw: Some(a[0].as_str().unwrap_or_default().to_owned()),
                ..GenerateBody::default()
            }
        }
        Some(Value::Array(a)) if !a.is_empty() && a[0].is_number() => GenerateBody {
            tokens: Some(ids(a).ok_or_else(|| bad("prompt token ids must be integers from 0"))?),
            ..GenerateBody::default()
        },
        _ => {
            return Err(bad(
                "prompt must be one non-empty string or one prompt's token ids",
            ));
        }
    };
    req.common.apply(&mut worker, 16)?;
    req.common.refuse_completion_logprobs()?;
    let n = req.common.n()?;
    let id = request_id("cmpl");
    let created = now_secs();
    let name = model.slug.to_string();
    if req.common.stream {
        let g = pipeline::start(s, ctx, model, worker).await?;
        let include_usage = req.common.include_usage();
        return Ok(pipeline::sse(g, move |ev| {
            let chunk = |text: &str, finish: Value| {
                json!({"id": id, "object": "text_completion", "created": created, "model": name,
                       "choices": [{"text": text, "index": 0, "logprobs": null, "finish_reason": finish}]})
            };
            match ev {
                StreamEvent::Text(t, _) => vec![chunk(t, Value::Null).to_string()],
                StreamEvent::Finished {
                    finish_reason,
                    usage,
                } => {
                    let mut end = chunk("", json!(finish_reason));
                    if !include_usage {
                        end["usage"] = pipeline::usage_json(usage);
                    }
                    let mut out = vec![end.to_string()];
                    if include_usage {
                        out.push(
                            json!({"id": id, "object": "text_completion", "created": created, "model": name,
                                   "choices": [], "usage": pipeline::usage_json(usage)})
                            .to_string(),
                        );
                    }
                    out
                }
                StreamEvent::Failed(e) => vec![e.stream_event(O).to_string()],
            }
        }));
    }
    let done = collect_n(s, ctx, model, &worker, req.common.seed.is_some(), n).await?;
    let choices: Vec<Value> = done
        .iter()
        .enumerate()
        .map(|(i, c)| json!({"text": c.text, "index": i, "logprobs": null, "finish_reason": c.finish_reason}))
        .collect();
    Ok(Json(json!({
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": name,
        "choices": choices,
        "usage": pipeline::usage_json(usage_of(&done))
    }))
    .into_response())
}

fn model_json(m: &RoutedModel) -> Value {
    let owner = m.slug.as_str().split('/').nth(1).unwrap_or("bulkhead");
    json!({
        "id": m.slug.as_str(),
        "object": "model",
        "created": u64::try_from(m.created_at.millis() / 1000).unwrap_or(0),
        "owned_by": owner
    })
}

fn list_models(ctx: &Ctx) -> Response {
    let data: Vec<Value> = ctx
        .snap
        .table
        .visible_models(&ctx.principal.account_id)
        .into_iter()
        .map(model_json)
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

/// `GET /v1/models`.
pub(crate) async fn models(Extension(ctx): Extension<Ctx>) -> Result<Response, ApiError> {
    Ok(list_models(&ctx))
}

/// `GET /client/v4/accounts/{account_id}/ai/v1/models`.
pub(crate) async fn account_models(
    path: Result<Path<String>, PathRejection>,
    Extension(ctx): Extension<Ctx>,
) -> Result<Response, ApiError> {
    ctx.owns(path, O)?;
    Ok(list_models(&ctx))
}

/// `GET /v1/models/{model}`.
pub(crate) async fn model(
    path: Result<Path<String>, PathRejection>,
    Extension(ctx): Extension<Ctx>,
) -> Result<Response, ApiError> {
    let Path(slug) = path.map_err(|_| GatewayError::NoRoute.in_(O))?;
    let m = pipeline::model(&ctx, &slug).map_err(|e| e.in_(O))?;
    Ok(Json(model_json(m)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(calls: bool) -> ChatChunks {
        ChatChunks {
            id: "chatcmpl-1".to_owned(),
            created: 1,
            name: "@cf/m/m".to_owned(),
            with_logprobs: false,
            include_usage: false,
            first: true,
            calls: calls.then(|| (bulkhead_grammar::tools::Splitter::new(), 0)),
        }
    }

    /// Every chunk's delta, in order, and the last one's finish reason.
    fn stream(c: &mut ChatChunks, pieces: &[&str], finish: &str) -> (Vec<Value>, Value) {
        let mut out = Vec::new();
        for p in pieces {
            out.extend(c.render(StreamEvent::Text(p, &[])));
        }
        out.extend(c.render(StreamEvent::Finished {
            finish_reason: finish.to_owned(),
            usage: Usage {
                prompt_tokens: 1,
                completion_tokens: 1,
            },
        }));
        let parsed: Vec<Value> = out
            .iter()
            .map(|s| serde_json::from_str(s).expect("JSON"))
            .collect();
        let last = parsed.last().expect("a chunk")["choices"][0]["finish_reason"].clone();
        let deltas = parsed
            .iter()
            .map(|c| c["choices"][0]["delta"].clone())
            .collect();
        (deltas, last)
    }

    #[test]
    fn streamed_calls_come_whole_after_their_text_however_the_text_is_cut() {
        let answer = "Checking.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"b\": 2, \"a\": 1}}\n</tool_call><tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>";
        for cut in [1, 4, answer.len()] {
            let pieces: Vec<&str> = answer
                .as_bytes()
                .chunks(cut)
                .map(|b| std::str::from_utf8(b).expect("ASCII"))
                .collect();
            let (deltas, finish) = stream(&mut chunks(true), &pieces, "stop");
            assert_eq!(finish, "tool_calls", "a stop to make calls");
            assert_eq!(deltas[0]["role"], "assistant");
            let text: String = deltas
                .iter()
                .filter_map(|d| d["content"].as_str())
                .collect();
            assert_eq!(text, "Checking.", "cut {cut}");
            let calls: Vec<&Value> = deltas
                .iter()
                .filter_map(|d| d.get("tool_calls"))
                .map(|c| &c[0])
                .collect();
            assert_eq!(calls.len(), 2, "cut {cut}: {deltas:?}");
            for (i, c) in calls.iter().enumerate() {
                assert_eq!(c["index"], i);
                assert_eq!(c["type"], "function");
                assert!(c["id"].as_str().is_some_and(|id| id.starts_with("call_")));
            }
            // Arguments as the model wrote them, key order included.
            assert_eq!(calls[0]["function"]["arguments"], "{\"b\": 2, \"a\": 1}");
            assert_eq!(calls[1]["function"]["name"], "g");
        }
    }

    #[test]
    fn without_calls_a_stream_is_text_and_its_own_finish() {
        let (deltas, finish) = stream(&mut chunks(true), &["<to", "ol"], "length");
        assert_eq!(finish, "length");
        let text: String = deltas
            .iter()
            .filter_map(|d| d["content"].as_str())
            .collect();
        assert_eq!(text, "<tool", "held text is given back at the end");
        let (_, finish) = stream(&mut chunks(false), &["<tool_call>\n"], "stop");
        assert_eq!(finish, "stop", "no tools: no calls read");
    }
}
