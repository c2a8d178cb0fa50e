//! Wire types of the control plane's admin API and a small HTTP client for it.
//!
//! This crate is what the control plane, the `bulkhead` responder commands,
//! the workers (registration and heartbeats) and the gateway share. It knows
//! nothing about the database, the model engine or KV pages: it holds only
//! the enumerations and JSON shapes that cross the wire, so the gateway can
//! depend on it without compiling either.

mod batches;
mod client;
mod enums;
mod slug;
mod task;
mod time;
mod types;

pub use batches::*;
pub use client::{Answer, Client, ClientError, Credentials, CredentialsError, error_chain};
pub use enums::{
    ComponentStatus, Impact, IncidentStatus, NodeRole, Role, UnknownVariant, Visibility,
};
pub use slug::{ModelSlug, SlugError};
pub use task::{EMBEDDING_TASK, GENERATION_TASK, is_embedding};
pub use types::*;
