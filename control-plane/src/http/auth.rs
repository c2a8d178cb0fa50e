//! Operator authentication: `Authorization: Bearer bho_…`, looked up by its
//! sha256. A missing or unknown token is 401; a known token whose role does
//! not allow the route is 403.
//!
//! Node and gateway routes need more than a token: the call must come over
//! the internal port, whose mutual TLS put the caller's certificate role in
//! the connection ([`Peer`]), and that role must be a worker's (node routes)
//! or the gateway's (the routing table). A stolen token alone registers
//! nothing and reads no routing table.

use super::AppState;
use super::error::ApiError;
use crate::store::operators::{self, Operator};
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use bulkhead_control_api::Role;
use bulkhead_trust::Role as CertRole;

/// The role of the certificate the caller presented, when it came over the
/// internal (mutual TLS) port.
pub(crate) fn cert_role(parts: &Parts) -> Option<CertRole> {
    bulkhead_trust::CallerRole::of(&parts.extensions).0
}

fn needs_cert(what: &str) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        format!(
            "{what} must come over the control plane's internal port (mutual TLS) with {}",
            match what {
                "the routing table and usage voids" => "the gateway's certificate",
                _ => "a prefill, decode or colocated worker's certificate",
            }
        ),
    )
}

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
    /// A caller whose token allows registering workers (node or admin).
    NodeToken,
    Role::Node
);
role_extractor!(
    /// A caller whose token allows reading the routing table (gateway or
    /// admin).
    GatewayToken,
    Role::Gateway
);

/// A worker: a node token, over the internal port, with a worker's
/// certificate (whose role and scope it carries).
#[derive(Debug, Clone)]
pub(crate) struct NodeAgent(
    pub(crate) Operator,
    pub(crate) CertRole,
    pub(crate) bulkhead_trust::Scope,
);

impl FromRequestParts<AppState> for NodeAgent {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let worker = |r| {
            matches!(
                r,
                CertRole::Prefill | CertRole::Decode | CertRole::Colocated
            )
        };
        let (NodeToken(op), role) = agent(parts, state, worker, "node calls").await?;
        let scope = bulkhead_trust::listen::caller_scope(&parts.extensions);
        Ok(NodeAgent(op, role, scope))
    }
}

/// A gateway: a gateway token, over the internal port, with the gateway's
/// certificate.
#[derive(Debug, Clone)]
pub(crate) struct GatewayAgent(pub(crate) Operator);

impl FromRequestParts<AppState> for GatewayAgent {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let gateway = |r| r == CertRole::Gateway;
        let (GatewayToken(op), _) = agent(
            parts,
            state,
            gateway,
            "the routing table, usage voids and tenants' files",
        )
        .await?;
        Ok(GatewayAgent(op))
    }
}

/// What the token extractor `T` found, with the role of the certificate the
/// call came with when `allowed` accepts it; else refused, naming `what`.
async fn agent<T>(
    parts: &mut Parts,
    state: &AppState,
    allowed: impl Fn(CertRole) -> bool,
    what: &'static str,
) -> Result<(T, CertRole), ApiError>
where
    T: FromRequestParts<AppState, Rejection = ApiError>,
{
    let token = T::from_request_parts(parts, state).await?;
    match cert_role(parts) {
        Some(r) if allowed(r) => Ok((token, r)),
        _ => Err(needs_cert(what)),
    }
}

/// The batch runner: its certificate, over the internal port. No operator
/// token stands in for it, and it grants nothing beyond the runner's routes.
#[derive(Debug, Clone)]
pub(crate) struct RunnerAgent;

impl FromRequestParts<AppState> for RunnerAgent {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &AppState) -> Result<Self, ApiError> {
        match cert_role(parts) {
            Some(CertRole::BatchRunner) => Ok(RunnerAgent),
            _ => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "batch runs must come over the control plane's internal port (mutual TLS) \
                 with the batch runner's certificate",
            )),
        }
    }
}
