//! Who may talk to whom inside Bulkhead.
//!
//! Every component holds a certificate issued by the platform's CA that
//! names its [`Role`] (a DNS name `ROLE.bulkhead.internal` in its subject
//! alternative names). Every internal connection is mutual TLS: the server
//! refuses, during the handshake and so before any request is read, a peer
//! without a certificate, with one from another CA, or with a role that may
//! not use that port; the client refuses a server whose certificate does not
//! name the role it meant to reach.
//!
//! - [`Identity`]: a component's CA, certificate chain and key, loaded once
//!   at start-up; it builds the rustls configurations.
//! - [`authority`]: creating the CA and role certificates (`up`,
//!   `bulkhead tls init`).
//! - [`Scope`]: what a worker certificate limits its holder to beyond its
//!   role (the models it may serve, the largest pool it may claim).
//! - [`listen`]: a TLS listener for `axum::serve` whose connections carry
//!   the peer's verified role ([`Peer`]).
//! - [`connect`]: a connector for hyper clients that dials with this
//!   identity and checks the server's role.
//! - [`wire`](mod@wire): the buffered TCP stream every TLS connection runs over.
//!
//! Who is admitted where, and what a caller needs besides its certificate:
//!
//! | Port | Serves | Admits (certificate) | Then also needs |
//! |---|---|---|---|
//! | gateway `--listen` | tenants | none (the operator's TLS edge in front) | an API token or a JWT |
//! | control plane `--listen` | operators, status page | none (plain HTTP behind the operator's edge) | an operator token; node and routing calls are refused here |
//! | control plane `--internal-listen` | workers, gateways, the batch runner | gateway, prefill, decode, colocated, batch-runner | node calls: a node token and a worker certificate of the registered role; the routing table, files and batches: a gateway token and the gateway certificate; batch runs: the batch runner's certificate (no token) |
//! | worker `--http` (decode, colocated) | the gateway, operators' tools | gateway, operator | generate: the gateway certificate and a signed tenant context; `/stats`, `/metrics`: either |
//! | prefill `--http` | operators' tools | gateway, operator | `/admin/abort`: the operator certificate |
//! | prefill `--listen` (transfer) | decode workers | decode | every page and end tagged under the transfer's key |
//! | `--metrics-listen` | Prometheus, probes | none (plain HTTP) | nothing: `/metrics` only (a worker's also `/health`), no tenant data |
//!
//! What each check stops: a stolen node token without a worker certificate
//! registers nothing, so the gateway never routes to it; a certificate of one
//! role cannot register another role's node, nor one scoped to a model another
//! model's node or a larger pool than it names; a process on a worker's host
//! cannot generate as any tenant (no gateway certificate, no context), nor can
//! one holding a gateway certificate replay a call, raise its limits, aim it at
//! another model or change its tenant (the context is signed, single-use and
//! expires in 30 s); a peer on the transfer path that rewrites a page cannot
//! make its tag.

pub mod authority;
pub mod connect;
mod identity;
pub mod listen;
mod scope;
mod verify;
pub mod wire;

pub use identity::{Identity, TlsFiles};
pub use listen::{CallerRole, Peer, TlsListener};
pub use scope::Scope;
pub use wire::{Wire, wire};

use std::fmt;

/// The role a certificate names. A role is what a component is, not which
/// instance: every decode worker holds a `decode` certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// The tenant-facing gateway: calls workers and the control plane.
    Gateway,
    /// The control plane: answers gateways and workers.
    ControlPlane,
    /// A prefill worker: answers decode workers' transfer connections.
    Prefill,
    /// A decode worker: answers the gateway, calls prefill workers.
    Decode,
    /// A worker that prefills and decodes itself: answers the gateway.
    Colocated,
    /// An operator's tool (`up`'s readiness checks, tests): may read a
    /// worker's `/stats`, never generate.
    Operator,
    /// The batch runner: takes batches from the control plane and records
    /// their answers; calls the gateway's public API as the batch's
    /// account, like any client.
    BatchRunner,
}

impl Role {
    /// Every role, in a fixed order.
    pub const ALL: [Role; 7] = [
        Role::Gateway,
        Role::ControlPlane,
        Role::Prefill,
        Role::Decode,
        Role::Colocated,
        Role::Operator,
        Role::BatchRunner,
    ];

    /// The name used in flags, file names and errors.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Gateway => "gateway",
            Role::ControlPlane => "control-plane",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Colocated => "colocated",
            Role::Operator => "operator",
            Role::BatchRunner => "batch-runner",
        }
    }

    /// The DNS name a certificate of this role carries (what a client
    /// sends as SNI; it names no role by itself).
    pub fn dns_name(self) -> String {
        format!("{}.{DOMAIN}", self.as_str())
    }

    /// The URI a certificate of this role carries in its subject
    /// alternative names: the one thing that makes it this role's (a
    /// wildcard or stray DNS name never does).
    pub fn urn(self) -> String {
        format!("{ROLE_URN}{}", self.as_str())
    }

    /// The role named `s`, if any.
    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The domain under which role names live.
pub const DOMAIN: &str = "bulkhead.internal";

/// The URI prefix of the role a certificate names.
pub const ROLE_URN: &str = "urn:bulkhead:role:";

/// Why an identity could not be loaded or created.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What went wrong.
        source: std::io::Error,
    },
    /// A file holds no usable certificate or key.
    #[error("{path}: {what}")]
    Pem {
        /// The file.
        path: String,
        /// What is missing or wrong.
        what: String,
    },
    /// The certificate is not one this component may use.
    #[error("{0}")]
    Certificate(String),
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    /// Generating a certificate failed.
    #[error("certificate generation: {0}")]
    Generate(#[from] rcgen::Error),
}
pub use tokio_rustls;
