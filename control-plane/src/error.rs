//! The control plane's typed errors. The HTTP edge (`http::error`) is the one
//! place they become status codes; database details never reach a client.

use crate::db::DbError;

/// Why a control-plane operation did not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The named thing does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// The request is malformed or out of range.
    #[error("{0}")]
    Invalid(String),
    /// It conflicts with the current state (duplicate name, closed incident).
    #[error("{0}")]
    Conflict(String),
    /// A config's limits do not fit a node's measured KV pool.
    #[error(
        "config {version} of {model} needs context window {context_window} + max output {max_output} \
         = {required} tokens of KV pool, but node `{node}` ({role}) measured {pool} tokens"
    )]
    ConfigDoesNotFit {
        /// The model.
        model: String,
        /// The refused version.
        version: crate::ConfigVersion,
        /// The first node it does not fit.
        node: String,
        /// That node's role.
        role: bulkhead_control_api::NodeRole,
        /// That node's measured pool, in tokens.
        pool: u64,
        /// Context window of the config.
        context_window: u64,
        /// Max output of the config.
        max_output: u64,
        /// Their sum.
        required: u64,
    },
    /// A config's context window cannot be prefilled in time on a node.
    #[error("config {version} of {model} cannot be served by node `{node}` ({role}): {why}")]
    ConfigTooSlow {
        /// The model.
        model: String,
        /// The refused version.
        version: crate::ConfigVersion,
        /// The first node too slow for it.
        node: String,
        /// That node's role.
        role: bulkhead_control_api::NodeRole,
        /// The numbers.
        why: String,
    },
    /// The host failed us (no randomness for a token); logged, never shown.
    #[error("{0}")]
    Internal(String),
    /// The database failed.
    #[error(transparent)]
    Db(#[from] DbError),
}

impl From<sqlx::Error> for Error {
    /// A unique-constraint violation is a conflict with a concurrent change
    /// (two admins adding the same name or config version at once), not a
    /// server fault.
    fn from(e: sqlx::Error) -> Self {
        match &e {
            sqlx::Error::Database(d) if d.is_unique_violation() => {
                Error::Conflict("a concurrent change got there first; retry".to_owned())
            }
            _ => Error::Db(DbError::Query(e)),
        }
    }
}
