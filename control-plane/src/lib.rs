//! The Bulkhead control plane: the source of truth for which models exist,
//! which accounts may call them, which configs are safe to run on which
//! workers, and what the public is told during an incident.
//!
//! - [`Db`] owns the connection pool (SQLite embedded by default, PostgreSQL
//!   when the URL says so) and runs the dialect's migrations.
//! - [`store`] holds the queries; each takes a connection or transaction
//!   from its caller, so the caller decides what commits together.
//! - [`app`] is the HTTP surface: the admin API under `/admin/v1` (operator
//!   tokens with roles) and the public status page and Statuspage v2 feeds.
//!
//! Architecture invariant: nothing here knows about the model engine, KV
//! pages or the transfer protocol; workers are rows with measured numbers.

mod db;
mod error;
mod http;
mod hub;
mod ids;
mod metrics;
mod routability;
mod status;
pub mod store;

pub use db::{Backend, Db, DbError};
pub use error::Error;
pub use http::{AppState, Settings, app};
pub use hub::Hub;
pub use ids::{AccountId, ConfigVersion, IncidentId, ModelId, NodeId, OperatorId};
pub use routability::{Routability, check_fits};
