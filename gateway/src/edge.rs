//! The gateway's door, before any handler (and so before a byte of a
//! request body is read): the bearer credential must be one the current
//! routing table accepts, and a declared body must fit the limit. A
//! stranger costs a header parse, never a buffered body. Bodies that turn
//! out larger than declared are refused by the handlers' extractor, in the
//! API's own shape too.
//!
//! The credential is checked once, here: handlers get the resulting `Ctx` as a
//! request extension and check only that the URL's account is its account
//! (`Ctx::owns`). A declared body over 2 MiB is refused from its
//! `Content-Length`. On the way out the door adds the `x-ratelimit-*` headers
//! of whatever the limiter decided.

use crate::bounds::MAX_BODY_BYTES;
use crate::errors::{ApiError, Flavor, GatewayError};
use crate::limits::Quota;
use crate::pipeline::authenticate;
use crate::state::AppState;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// Which API's shape a path answers in.
pub(crate) fn flavor_of(path: &str) -> Flavor {
    if path.starts_with("/client/v4/") && !path.contains("/ai/v1/") {
        Flavor::WorkersAi
    } else {
        Flavor::OpenAi
    }
}

/// Refuses strangers and declared over-large bodies before the handler runs.
/// The request's [`crate::pipeline::Ctx`] goes to the handler as an extension.
pub(crate) async fn guard(State(s): State<AppState>, mut req: Request, next: Next) -> Response {
    let path = req.uri().path();
    if path == "/health" {
        return next.run(req).await;
    }
    let flavor = flavor_of(path);
    let ctx = match authenticate(&s, req.headers()) {
        Ok(ctx) => ctx,
        Err(e) => return e.in_(flavor).into_response(),
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return GatewayError::TooLarge.in_(flavor).into_response();
    }
    let quota = ctx.quota.clone();
    req.extensions_mut().insert(ctx);
    let mut response = next.run(req).await;
    if let Some(q) = quota.get() {
        rate_limit_headers(q, response.headers_mut());
    }
    response
}

/// OpenAI's `x-ratelimit-*` headers, on every answer the limiter decided
/// (admitted or refused). Both windows are the same calendar minute, so
/// both resets are when it ends, in OpenAI's duration format (`12s`, `1m0s`).
pub(crate) fn rate_limit_headers(q: &Quota, headers: &mut HeaderMap) {
    let reset = if q.reset_secs >= 60 {
        format!("{}m{}s", q.reset_secs / 60, q.reset_secs % 60)
    } else {
        format!("{}s", q.reset_secs)
    };
    let values = [
        (
            "x-ratelimit-limit-requests",
            q.limits.requests_per_minute.to_string(),
        ),
        (
            "x-ratelimit-remaining-requests",
            q.remaining_requests().to_string(),
        ),
        ("x-ratelimit-reset-requests", reset.clone()),
        (
            "x-ratelimit-limit-tokens",
            q.limits.tokens_per_minute.to_string(),
        ),
        (
            "x-ratelimit-remaining-tokens",
            q.remaining_tokens().to_string(),
        ),
        ("x-ratelimit-reset-tokens", reset),
    ];
    for (name, value) in values {
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert(HeaderName::from_static(name), v);
        }
    }
}

/// A method the route does not take, in the API's shape.
pub(crate) async fn method_not_allowed(req: Request) -> Response {
    GatewayError::MethodNotAllowed
        .in_(flavor_of(req.uri().path()))
        .into_response()
}

/// A body the extractor refused: too large (413) or unreadable (400).
pub(crate) fn body_refused(e: &BytesRejection, flavor: Flavor) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        GatewayError::TooLarge.in_(flavor)
    } else {
        GatewayError::BadInput("the request body could not be read".to_owned()).in_(flavor)
    }
}
