//! Gateway errors, classified once near their cause and rendered once, here,
//! in the shape of the API the request came in on: the Workers AI v4
//! envelope or OpenAI's `{"error": {...}}`. No internal detail reaches a
//! client, and a model the account may not see is reported exactly like a
//! model that does not exist.
//!
//! A context-window refusal is worded as Workers AI or OpenAI words it, from
//! the lengths the worker sends in its `Overflow`.

use crate::limits::LimiterError;
use crate::upstream::UpstreamError;
use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bulkhead_worker_api::Overflow;
use serde_json::json;

/// Which API's error shape to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flavor {
    /// `/client/v4/accounts/{id}/ai/run/...`, `models/search`.
    WorkersAi,
    /// `/v1/...` and `/client/v4/accounts/{id}/ai/v1/...`.
    OpenAi,
}

/// What went wrong, as a client may be told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GatewayError {
    /// No valid credential.
    Unauthenticated,
    /// A valid credential used on another account's URL.
    WrongAccount,
    /// No such model, or not one this account may call.
    ModelNotFound(String),
    /// An object (a file, a batch) the account has no such one of: an
    /// unknown id and another account's are the same answer.
    NoSuchObject { what: &'static str, id: String },
    /// The request is malformed or out of range.
    BadInput(String),
    /// The request conflicts with the object's state (cancelling a
    /// finished batch).
    Conflict(String),
    /// The request asks for something this platform does not do (the
    /// parameter's name): refused rather than silently ignored.
    Unsupported(String),
    /// A parameter whose value asks for something this platform does not
    /// do (a schema keyword it cannot enforce): the parameter and why.
    UnsupportedValue { param: String, detail: String },
    /// Prompt plus output exceed the model's limit: the Workers AI message,
    /// and the lengths (when the worker sent them) that OpenAI's wording
    /// names.
    ContextTooLong {
        message: String,
        overflow: Option<Overflow>,
    },
    /// Over a per-account limit.
    RateLimited {
        what: &'static str,
        retry_after_secs: u64,
    },
    /// A request that could cost more than what is left of the account's
    /// budget for the period.
    OverBudget {
        period: crate::budget::Period,
        limit_neurons: u64,
        retry_after_secs: u64,
    },
    /// Every worker that serves the model has more prompt work queued than
    /// it could finish in time with this one: refused at once, to retry.
    Busy { retry_after_secs: u64 },
    /// No routable worker, or the gateway lost its routing table.
    Unavailable(&'static str),
    /// The worker failed the request.
    Upstream,
    /// The model was made private while the request ran: its answer ends
    /// here, incomplete.
    Withdrawn,
    /// No such route.
    NoRoute,
    /// The route does not take this method.
    MethodNotAllowed,
    /// The request body is over the gateway's limit.
    TooLarge,
    /// The request's headers are over the gateway's limit.
    HeadersTooLarge,
    /// The request's head could not be parsed.
    BadHead,
}

impl From<UpstreamError> for GatewayError {
    fn from(e: UpstreamError) -> Self {
        match e {
            UpstreamError::Worker {
                code,
                message,
                overflow,
                retry_after_ms,
                ..
            } => match code.as_str() {
                // Workers AI's own wording; OpenAI's names the lengths.
                "context_length_exceeded" => GatewayError::ContextTooLong {
                    message: "The estimated number of input and maximum output tokens exceeded this model's context window limit."
                        .to_owned(),
                    overflow,
                },
                // Names only the prompt's length and the deployment's limit.
                "prefill_too_long" => GatewayError::ContextTooLong { message, overflow },
                // An embedding call over the worker's limits: the message
                // names the limit.
                "invalid_request" | "too_many_inputs" | "too_many_tokens" => {
                    GatewayError::BadInput(message)
                }
                "unavailable" => GatewayError::Unavailable("no worker can take the request now"),
                // Every worker tried had too much prefill queued: when the
                // last one expects room, never the queue's contents.
                "prefill_queue_full" => GatewayError::Busy {
                    retry_after_secs: retry_after_ms.unwrap_or(1000).div_ceil(1000).max(1),
                },
                _ => GatewayError::Upstream,
            },
            UpstreamError::Unreachable | UpstreamError::Protocol => GatewayError::Upstream,
            UpstreamError::Withdrawn => GatewayError::Withdrawn,
        }
    }
}

impl From<LimiterError> for GatewayError {
    fn from(e: LimiterError) -> Self {
        match e {
            LimiterError::Limited {
                what,
                retry_after_secs,
                ..
            } => GatewayError::RateLimited {
                what,
                retry_after_secs,
            },
            LimiterError::TooLarge { .. } => GatewayError::BadInput(e.to_string()),
            LimiterError::Unavailable(why) => {
                tracing::error!(target: "bulkhead::gateway", %why, "rate limiting is unavailable");
                GatewayError::Unavailable("rate limiting is unavailable")
            }
        }
    }
}

impl From<crate::budget::BudgetError> for GatewayError {
    fn from(e: crate::budget::BudgetError) -> Self {
        match e {
            crate::budget::BudgetError::Over {
                period,
                limit_neurons,
                retry_after_secs,
            } => GatewayError::OverBudget {
                period,
                limit_neurons,
                retry_after_secs,
            },
            crate::budget::BudgetError::Unavailable(why) => {
                tracing::error!(target: "bulkhead::gateway", %why, "budgets are unavailable");
                GatewayError::Unavailable("budgets are unavailable")
            }
        }
    }
}

impl GatewayError {
    /// A short, stable name of the error (`error.type` on metrics and
    /// spans): never the message.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            GatewayError::Unauthenticated => "unauthenticated",
            GatewayError::WrongAccount => "wrong_account",
            GatewayError::ModelNotFound(_) => "model_not_found",
            GatewayError::NoSuchObject { .. } => "not_found",
            GatewayError::BadInput(_) => "invalid_request",
            GatewayError::Conflict(_) => "conflict",
            GatewayError::Unsupported(_) | GatewayError::UnsupportedValue { .. } => {
                "unsupported_parameter"
            }
            GatewayError::ContextTooLong { .. } => "context_length_exceeded",
            GatewayError::RateLimited { .. } => "rate_limited",
            GatewayError::OverBudget { .. } => "over_budget",
            GatewayError::Busy { .. } => "capacity_exceeded",
            GatewayError::Unavailable(_) => "unavailable",
            GatewayError::Upstream => "upstream",
            GatewayError::Withdrawn => "model_withdrawn",
            GatewayError::NoRoute => "no_route",
            GatewayError::MethodNotAllowed => "method_not_allowed",
            GatewayError::TooLarge => "request_too_large",
            GatewayError::HeadersTooLarge => "headers_too_large",
            GatewayError::BadHead => "bad_request_head",
        }
    }
}

/// An error bound to the API it is answered in.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) error: GatewayError,
    pub(crate) flavor: Flavor,
}

impl GatewayError {
    pub(crate) fn in_(self, flavor: Flavor) -> ApiError {
        ApiError {
            error: self,
            flavor,
        }
    }

    fn status(&self, flavor: Flavor) -> StatusCode {
        match self {
            GatewayError::Unauthenticated => StatusCode::UNAUTHORIZED,
            GatewayError::WrongAccount => StatusCode::FORBIDDEN,
            GatewayError::ModelNotFound(_) => match flavor {
                Flavor::WorkersAi => StatusCode::BAD_REQUEST,
                Flavor::OpenAi => StatusCode::NOT_FOUND,
            },
            GatewayError::NoSuchObject { .. } => StatusCode::NOT_FOUND,
            GatewayError::Conflict(_) => StatusCode::CONFLICT,
            GatewayError::BadInput(_)
            | GatewayError::Unsupported(_)
            | GatewayError::UnsupportedValue { .. } => StatusCode::BAD_REQUEST,
            GatewayError::ContextTooLong { .. } => match flavor {
                Flavor::WorkersAi => StatusCode::PAYLOAD_TOO_LARGE,
                Flavor::OpenAi => StatusCode::BAD_REQUEST,
            },
            GatewayError::RateLimited { .. } | GatewayError::OverBudget { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
            // Workers AI's capacity refusal is a 429 (code 3040); OpenAI's
            // clients know an overloaded server as a 503.
            GatewayError::Busy { .. } => match flavor {
                Flavor::WorkersAi => StatusCode::TOO_MANY_REQUESTS,
                Flavor::OpenAi => StatusCode::SERVICE_UNAVAILABLE,
            },
            GatewayError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            GatewayError::Upstream => StatusCode::BAD_GATEWAY,
            GatewayError::Withdrawn => StatusCode::SERVICE_UNAVAILABLE,
            GatewayError::NoRoute => StatusCode::NOT_FOUND,
            GatewayError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            GatewayError::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            GatewayError::HeadersTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            GatewayError::BadHead => StatusCode::BAD_REQUEST,
        }
    }

    fn message(&self) -> String {
        match self {
            GatewayError::Unauthenticated => "Authentication error".to_owned(),
            GatewayError::WrongAccount => "the token is not valid for this account".to_owned(),
            GatewayError::ModelNotFound(m) => format!("No such model {m} or task"),
            GatewayError::NoSuchObject { what, id } => format!(
                "No such {what} object: {}",
                id.chars().take(64).collect::<String>()
            ),
            GatewayError::BadInput(m) => format!("Bad input: {m}"),
            GatewayError::Conflict(m) => m.clone(),
            GatewayError::Unsupported(p) => format!(
                "Unsupported parameter: '{p}' is not supported by Bulkhead; remove it (the README lists what is supported)"
            ),
            GatewayError::UnsupportedValue { param, detail } => {
                format!(
                    "Unsupported value of '{param}': {detail} (the README lists what is supported)"
                )
            }
            GatewayError::ContextTooLong { message, .. } => message.clone(),
            GatewayError::RateLimited {
                what,
                retry_after_secs,
            } => format!("Rate limit exceeded ({what}); retry in {retry_after_secs} s"),
            GatewayError::OverBudget {
                period,
                limit_neurons,
                retry_after_secs,
            } => {
                let reset = match period {
                    crate::budget::Period::Daily => "00:00 UTC",
                    crate::budget::Period::Monthly => "the first of the month, 00:00 UTC",
                };
                let period = period.as_str();
                format!(
                    "Budget exceeded: the account's {period} budget of {limit_neurons} neurons does not cover this request; it resets in {retry_after_secs} s ({reset})"
                )
            }
            GatewayError::Busy { retry_after_secs } => {
                format!("Capacity temporarily exceeded, please try again in {retry_after_secs} s")
            }
            GatewayError::Unavailable(m) => format!("Capacity temporarily unavailable: {m}"),
            GatewayError::Upstream => "the inference worker failed the request; retry".to_owned(),
            GatewayError::Withdrawn => {
                "the model was withdrawn while this request ran; the answer is incomplete"
                    .to_owned()
            }
            GatewayError::NoRoute => "no such route".to_owned(),
            GatewayError::MethodNotAllowed => "this route does not take that method".to_owned(),
            GatewayError::TooLarge => format!(
                "the request body is larger than {} bytes",
                crate::bounds::MAX_BODY_BYTES
            ),
            GatewayError::HeadersTooLarge => format!(
                "the request's headers are larger than {} bytes",
                crate::bounds::MAX_HEADER_BYTES
            ),
            GatewayError::BadHead => "the request line or a header is malformed".to_owned(),
        }
    }

    /// The Workers AI error code.
    fn code(&self) -> u32 {
        match self {
            GatewayError::Unauthenticated | GatewayError::WrongAccount => 10000,
            GatewayError::ModelNotFound(_) => 5007,
            GatewayError::NoSuchObject { .. } => 7003,
            GatewayError::BadInput(_)
            | GatewayError::Conflict(_)
            | GatewayError::Unsupported(_)
            | GatewayError::UnsupportedValue { .. } => 5006,
            GatewayError::ContextTooLong { .. } => 5021,
            GatewayError::RateLimited { .. } | GatewayError::OverBudget { .. } => 3036,
            GatewayError::Busy { .. } | GatewayError::Unavailable(_) => 3040,
            GatewayError::Upstream => 3043,
            GatewayError::Withdrawn => 3040,
            GatewayError::NoRoute => 7000,
            GatewayError::MethodNotAllowed => 7001,
            GatewayError::TooLarge => 3006,
            GatewayError::HeadersTooLarge => 3006,
            GatewayError::BadHead => 5006,
        }
    }

    /// OpenAI `type` and `code`.
    fn openai_kind(&self) -> (&'static str, Option<&'static str>) {
        match self {
            GatewayError::Unauthenticated => ("authentication_error", Some("invalid_api_key")),
            GatewayError::WrongAccount => ("permission_error", None),
            GatewayError::ModelNotFound(_) => ("invalid_request_error", Some("model_not_found")),
            GatewayError::NoSuchObject { .. }
            | GatewayError::BadInput(_)
            | GatewayError::Conflict(_) => ("invalid_request_error", None),
            GatewayError::Unsupported(_) | GatewayError::UnsupportedValue { .. } => {
                ("invalid_request_error", Some("unsupported_parameter"))
            }
            GatewayError::ContextTooLong { .. } => {
                ("invalid_request_error", Some("context_length_exceeded"))
            }
            GatewayError::RateLimited { .. } => ("rate_limit_error", Some("rate_limit_exceeded")),
            // OpenAI's answer to a spent quota, which SDKs and LiteLLM
            // recognise (and do not retry).
            GatewayError::OverBudget { .. } => ("insufficient_quota", Some("insufficient_quota")),
            GatewayError::Busy { .. } => ("service_unavailable", Some("capacity_exceeded")),
            GatewayError::Unavailable(_) => ("service_unavailable", None),
            GatewayError::Upstream => ("api_error", None),
            GatewayError::Withdrawn => ("service_unavailable", Some("model_withdrawn")),
            GatewayError::NoRoute => ("invalid_request_error", Some("unknown_url")),
            GatewayError::MethodNotAllowed => ("invalid_request_error", Some("method_not_allowed")),
            GatewayError::TooLarge => ("invalid_request_error", Some("request_too_large")),
            GatewayError::HeadersTooLarge => ("invalid_request_error", Some("headers_too_large")),
            GatewayError::BadHead => ("invalid_request_error", Some("bad_request")),
        }
    }

    /// The body of an error sent mid-stream (the status is already 200).
    pub(crate) fn stream_event(&self, flavor: Flavor) -> serde_json::Value {
        match flavor {
            Flavor::WorkersAi => {
                json!({"errors": [{"code": self.code(), "message": self.wa_message()}]})
            }
            Flavor::OpenAi => {
                let (kind, code) = self.openai_kind();
                json!({"error": {"message": self.openai_message(), "type": kind, "code": code}})
            }
        }
    }

    /// OpenAI's wording, which client libraries match to recognise a
    /// context-window error (LiteLLM's fallbacks look for "maximum context
    /// length"); everything else reads as in Workers AI.
    fn openai_message(&self) -> String {
        match self {
            GatewayError::ContextTooLong {
                overflow: Some(o), ..
            } if o.max_tokens > 0 => format!(
                "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the messages, {} in the completion). Please reduce the length of the messages or completion.",
                o.limit,
                o.prompt_tokens + o.max_tokens,
                o.prompt_tokens,
                o.max_tokens
            ),
            // Too long to prefill, whatever the output.
            GatewayError::ContextTooLong {
                overflow: Some(o), ..
            } => format!(
                "This model's maximum context length is {} tokens. However, your messages resulted in {} tokens. Please reduce the length of the messages.",
                o.limit, o.prompt_tokens
            ),
            GatewayError::OverBudget { .. } => {
                format!("You exceeded your current quota. {}", self.message())
            }
            _ => self.message(),
        }
    }

    fn wa_message(&self) -> String {
        match self {
            GatewayError::Unauthenticated
            | GatewayError::WrongAccount
            | GatewayError::NoRoute
            | GatewayError::MethodNotAllowed => self.message(),
            _ => format!("AiError: {}", self.message()),
        }
    }
}

impl ApiError {
    /// The status and JSON body of the answer.
    pub(crate) fn status_and_body(&self) -> (StatusCode, serde_json::Value) {
        let e = &self.error;
        let body = match self.flavor {
            Flavor::WorkersAi => json!({
                "result": null,
                "success": false,
                "errors": [{"code": e.code(), "message": e.wa_message()}],
                "messages": []
            }),
            Flavor::OpenAi => {
                let (kind, code) = e.openai_kind();
                let param = match e {
                    GatewayError::ContextTooLong { .. } => Some("messages"),
                    GatewayError::Unsupported(p)
                    | GatewayError::UnsupportedValue { param: p, .. } => Some(p.as_str()),
                    _ => None,
                };
                json!({"error": {"message": e.openai_message(), "type": kind, "param": param, "code": code}})
            }
        };
        (e.status(self.flavor), body)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let e = &self.error;
        let (status, body) = self.status_and_body();
        let mut resp = (status, Json(body)).into_response();
        if let GatewayError::RateLimited {
            retry_after_secs, ..
        }
        | GatewayError::OverBudget {
            retry_after_secs, ..
        }
        | GatewayError::Busy { retry_after_secs } = e
            && let Ok(v) = HeaderValue::from_str(&retry_after_secs.to_string())
        {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        if let GatewayError::OverBudget { .. } = e {
            // Hours away, often: the official SDKs would otherwise retry.
            resp.headers_mut()
                .insert("x-should-retry", HeaderValue::from_static("false"));
        }
        if status == StatusCode::UNAUTHORIZED {
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn rendered(e: GatewayError, flavor: Flavor) -> (u16, Option<String>, serde_json::Value) {
        let resp = e.in_(flavor).into_response();
        let status = resp.status().as_u16();
        let retry = resp
            .headers()
            .get(header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        (status, retry, serde_json::from_slice(&bytes).expect("JSON"))
    }

    /// A worker's queue refusal, passed on once every worker was tried:
    /// Workers AI's capacity error (429, 3040) and OpenAI's overloaded
    /// server (503), each with when to retry and nothing of the queue.
    #[tokio::test]
    async fn a_full_prefill_queue_is_a_capacity_error_in_each_apis_shape() {
        let worker = UpstreamError::Worker {
            status: 503,
            code: "prefill_queue_full".to_owned(),
            message: "the prefill queue is full: 61500 ms queued".to_owned(),
            overflow: None,
            retry_after_ms: Some(2_300),
        };
        assert!(worker.retryable(), "another worker may have room");
        let e = GatewayError::from(worker);
        assert_eq!(
            e,
            GatewayError::Busy {
                retry_after_secs: 3
            }
        );
        let (status, retry, v) = rendered(e.clone(), Flavor::WorkersAi).await;
        assert_eq!((status, retry.as_deref()), (429, Some("3")), "{v}");
        assert_eq!(v["success"], false);
        assert_eq!(v["errors"][0]["code"], 3040, "{v}");
        let message = v["errors"][0]["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("AiError: Capacity temporarily exceeded, please try again"),
            "{message}"
        );
        let (status, retry, v) = rendered(e, Flavor::OpenAi).await;
        assert_eq!((status, retry.as_deref()), (503, Some("3")), "{v}");
        assert_eq!(v["error"]["type"], "service_unavailable", "{v}");
        assert_eq!(v["error"]["code"], "capacity_exceeded", "{v}");
        assert!(
            !v.to_string().contains("61500"),
            "the queue's size stays inside: {v}"
        );
        // A worker that sent no time still gets a retry-after.
        let e = GatewayError::from(UpstreamError::Worker {
            status: 503,
            code: "prefill_queue_full".to_owned(),
            message: String::new(),
            overflow: None,
            retry_after_ms: None,
        });
        assert_eq!(
            e,
            GatewayError::Busy {
                retry_after_secs: 1
            }
        );
    }
}
