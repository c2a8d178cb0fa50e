//! The one place errors become HTTP responses: `{"error":{"code","message"}}`.
//! Database failures are logged here and reach the client only as
//! `internal_error`.

use crate::{DbError, Error};
use axum::Json;
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bulkhead_control_api::{ErrorBody, ErrorDetail};
use serde::de::DeserializeOwned;

/// An admin API failure.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    pub(crate) fn new(
        status: StatusCode,
        code: &'static str,
        message: impl Into<String>,
    ) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    pub(crate) fn unauthorized() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid operator token is required (Authorization: Bearer ...)",
        )
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> ApiError {
        match e {
            Error::NotFound(_) => ApiError::new(StatusCode::NOT_FOUND, "not_found", e.to_string()),
            Error::Invalid(_) => ApiError::bad_request(e.to_string()),
            Error::Conflict(_) => ApiError::new(StatusCode::CONFLICT, "conflict", e.to_string()),
            Error::ConfigDoesNotFit { .. } | Error::ConfigTooSlow { .. } => {
                ApiError::new(StatusCode::CONFLICT, "config_does_not_fit", e.to_string())
            }
            Error::Internal(why) => {
                tracing::error!(target: "bulkhead::control_plane", %why, "internal error");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal_error",
                    "internal error",
                )
            }
            Error::Db(db) => internal(&db),
        }
    }
}

impl From<DbError> for ApiError {
    fn from(e: DbError) -> ApiError {
        internal(&e)
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> ApiError {
        internal(&DbError::Query(e))
    }
}

fn internal(e: &DbError) -> ApiError {
    tracing::error!(target: "bulkhead::control_plane", error = %e, "database error");
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal_error",
        "internal error",
    )
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_owned(),
                message: self.message,
            },
        };
        let mut resp = (self.status, Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp
    }
}

/// `Json` whose rejections are [`ApiError`]s in the API's own shape.
#[derive(Debug)]
pub(crate) struct AppJson<T>(pub(crate) T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for AppJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        if !json_content_type(req.headers()) {
            // axum's own refusal, in our shape.
            return match axum::Json::<T>::from_request(req, state).await {
                Ok(axum::Json(v)) => Ok(AppJson(v)),
                Err(r) => Err(ApiError::bad_request(r.body_text())),
            };
        }
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|r| ApiError::bad_request(r.body_text()))?;
        refuse_nul(&bytes)?;
        match axum::Json::<T>::from_bytes(&bytes) {
            Ok(axum::Json(v)) => Ok(AppJson(v)),
            Err(r) => Err(ApiError::bad_request(r.body_text())),
        }
    }
}

/// Whether the request says its body is JSON (as axum's `Json` requires).
fn json_content_type(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase())
        .is_some_and(|m| {
            m == "application/json" || (m.starts_with("application/") && m.ends_with("+json"))
        })
}

/// Text may not hold NUL (`\u0000`): PostgreSQL cannot store it, and no
/// name, reason or field of ours means one. Refused here, for every body,
/// so it is a 400 rather than a database error.
fn refuse_nul(bytes: &[u8]) -> Result<(), ApiError> {
    fn has_nul(v: &serde_json::Value) -> bool {
        match v {
            serde_json::Value::String(s) => s.contains('\0'),
            serde_json::Value::Array(a) => a.iter().any(has_nul),
            serde_json::Value::Object(o) => o.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
            _ => false,
        }
    }
    match serde_json::from_slice::<serde_json::Value>(bytes) {
        Ok(v) if has_nul(&v) => Err(ApiError::bad_request(
            "text in the body may not contain NUL characters (\\u0000)",
        )),
        // Invalid JSON gets its own answer from the typed parse.
        _ => Ok(()),
    }
}

/// An optional JSON body: empty means `T::default()`.
#[derive(Debug)]
pub(crate) struct OptionalJson<T>(pub(crate) T);

impl<T: DeserializeOwned + Default, S: Send + Sync> FromRequest<S> for OptionalJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|r| ApiError::bad_request(r.body_text()))?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJson(T::default()));
        }
        serde_json::from_slice(&bytes)
            .map(OptionalJson)
            .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
    }
}

/// `Path` whose rejections are [`ApiError`]s.
#[derive(Debug)]
pub(crate) struct AppPath<T>(pub(crate) T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for AppPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(AppPath(v)),
            Err(r) => Err(ApiError::bad_request(r.body_text())),
        }
    }
}

/// `Query` whose rejections are [`ApiError`]s.
#[derive(Debug)]
pub(crate) struct AppQuery<T>(pub(crate) T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for AppQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        // As for bodies: no NUL in any text (`%00` decodes to one).
        let query = parts.uri.query().unwrap_or("");
        if query.contains("%00") {
            return Err(ApiError::bad_request(
                "the query may not contain NUL characters (%00)",
            ));
        }
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(AppQuery(v)),
            Err(r) => Err(ApiError::bad_request(r.body_text())),
        }
    }
}
