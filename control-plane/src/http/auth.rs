//! Operator authentication: `Authorization: Bearer bho_…`, looked up by its
//! sha256. A missing or unknown token is 401; a known token whose role does
//! not allow the route is 403.

use super::AppState;
use super::error::ApiError;
use crate::store::operators::{self, Operator};
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use bulkhead_control_api::Role;

/// The authenticated caller of an admin route.
#[derive(Debug, Clone)]
pub(crate) struct Caller(pub(crate) Operator);

impl Caller {
    /// Refuses with 403 unless the caller's role allows `needed`.
    pub(crate) fn require(&self, needed: Role) -> Result<&Operator, ApiError> {
        if self.0.role.allows(needed) {
            Ok(&self.0)
        } else {
            Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!(
                    "this needs the {needed} role; the token's role is {}",
                    self.0.role
                ),
            ))
        }
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Caller, ApiError> {
        let token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                let (scheme, token) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .ok_or_else(ApiError::unauthorized)?;
        let mut conn = state.db.pool().acquire().await?;
        match operators::authenticate(&mut conn, token).await? {
            Some(op) => Ok(Caller(op)),
            None => Err(ApiError::unauthorized()),
        }
    }
}
