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

/// Extractors that authenticate and check the role before the handler (and
/// before its body is even parsed), so an under-privileged call cannot reach
/// a handler's code.
macro_rules! role_extractor {
    ($(#[$meta:meta])* $name:ident, $role:expr) => {
        $(#[$meta])*
        #[derive(Debug, Clone)]
        pub(crate) struct $name(pub(crate) Operator);

        impl FromRequestParts<AppState> for $name {
            type Rejection = ApiError;

            async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<$name, ApiError> {
                let Caller(op) = Caller::from_request_parts(parts, state).await?;
                if op.role.allows($role) {
                    Ok($name(op))
                } else {
                    Err(ApiError::new(
                        StatusCode::FORBIDDEN,
                        "forbidden",
                        format!("this needs the {} role; the token's role is {}", $role, op.role),
                    ))
                }
            }
        }
    };
}

role_extractor!(
    /// A caller with the admin role.
    Admin,
    Role::Admin
);
role_extractor!(
    /// A caller allowed responder work (responder or admin).
    Responder,
    Role::Responder
);
role_extractor!(
    /// A caller allowed to register workers (node or admin).
    NodeAgent,
    Role::Node
);
role_extractor!(
    /// A caller allowed to read the routing table (gateway or admin).
    GatewayAgent,
    Role::Gateway
);
