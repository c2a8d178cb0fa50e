//! Embeddings in both APIs: OpenAI's `POST /v1/embeddings` (also under
//! `/client/v4/accounts/{account_id}/ai/v1/`) and Workers AI's `ai/run`
//! for an embedding model (`{"text": ...}` in, `{shape, data, pooling}`
//! out, in the v4 envelope). Both read their body here and compute through
//! [`pipeline::embed`]; nothing here talks to a worker.
//!
//! OpenAI's `input` is a string, a list of strings, a list of token ids or
//! a list of those; `encoding_format` is `float` or `base64` (little-endian
//! `f32`s, as the SDKs decode them); `dimensions` is refused unless it is
//! the model's own width (the worker checks it before computing).

use crate::errors::{ApiError, Flavor, GatewayError};
use crate::pipeline::{self, Ctx};
use crate::state::AppState;
use axum::Extension;
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use bulkhead_control_api::RoutedModel;
use bulkhead_worker_api::embed::EmbedInput;
use serde::Deserialize;
use serde_json::{Value, json};

const O: Flavor = Flavor::OpenAi;

/// `POST /v1/embeddings` body. Unknown fields are refused, not ignored,
/// except `user` (an end-user id the platform does not use).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EmbeddingsBody {
    model: String,
    input: Value,
    encoding_format: Option<String>,
    dimensions: Option<Value>,
    #[serde(rename = "user")]
    _user: Option<String>,
}

/// How the vectors are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Float,
    Base64,
}

fn bad(m: impl Into<String>) -> GatewayError {
    GatewayError::BadInput(m.into())
}

/// OpenAI's `input`, as the worker's inputs.
fn openai_inputs(input: &Value) -> Result<Vec<EmbedInput>, GatewayError> {
    const SHAPE: &str = "input must be a string, an array of strings, an array of token ids, or an array of arrays of token ids";
    let ids = |v: &[Value]| -> Result<Vec<u32>, GatewayError> {
        v.iter()
            .map(|t| {
                t.as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .ok_or_else(|| bad(SHAPE))
            })
            .collect()
    };
    match input {
        Value::String(s) => Ok(vec![EmbedInput::Text(s.clone())]),
        Value::Array(items) if items.is_empty() => Err(bad("input must not be empty")),
        Value::Array(items) => match &items[0] {
            Value::String(_) => items
                .iter()
                .map(|i| match i {
                    Value::String(s) => Ok(EmbedInput::Text(s.clone())),
                    _ => Err(bad(SHAPE)),
                })
                .collect(),
            Value::Number(_) => Ok(vec![EmbedInput::Tokens(ids(items)?)]),
            Value::Array(_) => items
                .iter()
                .map(|i| match i {
                    Value::Array(t) if !t.is_empty() => Ok(EmbedInput::Tokens(ids(t)?)),
                    Value::Array(_) => Err(bad("a token array of input must not be empty")),
                    _ => Err(bad(SHAPE)),
                })
                .collect(),
            _ => Err(bad(SHAPE)),
        },
        _ => Err(bad(SHAPE)),
    }
}

impl EmbeddingsBody {
    fn encoding(&self) -> Result<Encoding, GatewayError> {
        match self.encoding_format.as_deref() {
            None | Some("float") => Ok(Encoding::Float),
            Some("base64") => Ok(Encoding::Base64),
            Some(_) => Err(bad("encoding_format must be float or base64")),
        }
    }

    fn dimensions(&self) -> Result<Option<u64>, GatewayError> {
        match &self.dimensions {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .filter(|d| *d >= 1)
                .map(Some)
                .ok_or_else(|| bad("dimensions must be a positive integer")),
        }
    }
}

/// `POST /v1/embeddings`.
pub(crate) async fn create(
    State(s): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(|e| crate::edge::body_refused(&e, O))?;
    create_for(&s, &ctx, &body).await.map_err(|e| e.in_(O))
}

/// `POST /client/v4/accounts/{account_id}/ai/v1/embeddings`.
pub(crate) async fn account_create(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    Extension(ctx): Extension<Ctx>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    ctx.owns(path, O)?;
    let body = body.map_err(|e| crate::edge::body_refused(&e, O))?;
    create_for(&s, &ctx, &body).await.map_err(|e| e.in_(O))
}

async fn create_for(s: &AppState, ctx: &Ctx, body: &[u8]) -> Result<Response, GatewayError> {
    let req: EmbeddingsBody = pipeline::parse_json(body)?;
    let model = pipeline::model(ctx, &req.model)?;
    let inputs = openai_inputs(&req.input)?;
    let encoding = req.encoding()?;
    let answer = pipeline::embed(s, ctx, model, inputs, req.dimensions()?).await?;
    let data: Vec<Value> = answer
        .vectors
        .iter()
        .enumerate()
        .map(|(index, v)| {
            let embedding = match encoding {
                Encoding::Float => json!(v),
                Encoding::Base64 => Value::String(base64_f32(v)),
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": model.slug.as_str(),
        "usage": {"prompt_tokens": answer.prompt_tokens, "total_tokens": answer.prompt_tokens},
    }))
    .into_response())
}

/// A vector as OpenAI's base64 encoding writes it: its `f32`s, little
/// endian.
fn base64_f32(v: &[f32]) -> String {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Workers AI's body for an embedding model.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunBody {
    text: Value,
    pooling: Option<String>,
}

/// Most texts one Workers AI call may send (as Workers AI documents for
/// its embedding models).
const MAX_RUN_TEXTS: usize = 100;

/// `ai/run` for an embedding model: `{"text": "..."}` or `{"text":
/// [...]}`, answered `{shape: [n, width], data, pooling}` in the envelope.
pub(crate) async fn run(
    s: &AppState,
    ctx: &Ctx,
    model: &RoutedModel,
    body: &[u8],
) -> Result<Response, GatewayError> {
    let req: RunBody = pipeline::parse_json(body)?;
    match req.pooling.as_deref() {
        None | Some("mean") => {}
        Some("cls") => {
            return Err(GatewayError::UnsupportedValue {
                param: "pooling".to_owned(),
                detail: "this model's vectors are mean-pooled; cls pooling is not served"
                    .to_owned(),
            });
        }
        Some(_) => return Err(bad("pooling must be mean or cls")),
    }
    let inputs: Vec<EmbedInput> = match &req.text {
        Value::String(t) => vec![EmbedInput::Text(t.clone())],
        Value::Array(items) if items.is_empty() => return Err(bad("text must not be empty")),
        Value::Array(items) if items.len() > MAX_RUN_TEXTS => {
            return Err(bad(format!(
                "{} texts; a call takes at most {MAX_RUN_TEXTS}",
                items.len()
            )));
        }
        Value::Array(items) => items
            .iter()
            .map(|t| match t {
                Value::String(t) => Ok(EmbedInput::Text(t.clone())),
                _ => Err(bad("text must be a string or an array of strings")),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(bad("text must be a string or an array of strings")),
    };
    let answer = pipeline::embed(s, ctx, model, inputs, None).await?;
    let width = answer.vectors.first().map_or(0, Vec::len);
    Ok(Json(json!({
        "result": {
            "shape": [answer.vectors.len(), width],
            "data": answer.vectors,
            "pooling": "mean",
        },
        "success": true,
        "errors": [],
        "messages": [],
    }))
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_input_shape_openai_documents_is_read_and_others_refused() {
        let text = |t: &str| EmbedInput::Text(t.to_owned());
        let cases = [
            (json!("a"), vec![text("a")]),
            (json!(["a", "b"]), vec![text("a"), text("b")]),
            (json!([1, 2]), vec![EmbedInput::Tokens(vec![1, 2])]),
            (
                json!([[1], [2, 3]]),
                vec![EmbedInput::Tokens(vec![1]), EmbedInput::Tokens(vec![2, 3])],
            ),
            (json!(""), vec![text("")]),
        ];
        for (input, want) in cases {
            assert_eq!(openai_inputs(&input).expect("valid"), want, "{input}");
        }
        for input in [
            json!([]),
            json!(["a", 1]),
            json!([1, "a"]),
            json!([[1], "a"]),
            json!([[]]),
            json!([-1]),
            json!([1.5]),
            json!([4_294_967_296u64]),
            json!({"a": 1}),
            json!(null),
            json!(7),
        ] {
            assert!(openai_inputs(&input).is_err(), "{input}");
        }
    }

    #[test]
    fn base64_is_the_little_endian_floats() {
        let b = base64_f32(&[1.0, -2.5]);
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b)
            .expect("base64");
        let back: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(back, vec![1.0, -2.5]);
    }
}
