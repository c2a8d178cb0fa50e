//! Bulkhead worker processes: the colocated, prefill and decode roles and
//! the HTTP API they serve.
//!
//! - [`prefill`]: accepts decode workers, admits at its own door, sends
//!   pages into granted slots.
//! - [`decode`]: admits against the pair's limits, lands and verifies
//!   transfers, generates.
//! - [`hello`]: what workers tell each other, and compatibility.
//! - [`http`]: `fn app(role, contexts) -> Router`.
//! - [`embed`]: `fn embed_app(service, contexts) -> Router`, the
//!   embedding worker's API.
//! - [`metrics`]: the worker's counters, moved where the work happens.
//! - [`gauges`]: the instruments read from the engine and the transfer
//!   owners when a reader collects, registered for the worker's role.
//! - [`prefix`]: the prefix-cache scope of a call, from its signed context.
//! - [`usage`]: metering every call at the source.

pub mod decode;
pub mod embed;
pub mod gauges;
pub mod hello;
pub mod http;
pub mod metrics;
pub mod prefill;
pub mod prefix;
#[cfg(feature = "rdma")]
mod rdma;
mod role;
mod tools;
pub mod usage;

pub use decode::{DecodeOptions, DecodeWorker, SubmitError};
pub use embed::{embed_app, embed_app_crossing};
pub use hello::{TransportKind, hello};
pub use http::{ContextCheck, app};
pub use prefill::{AdminCommand, LinkFault, PrefillOptions, PrefillWorker};
pub use role::Role;

/// The engine's work class for a signed context's.
pub(crate) fn engine_class(
    c: bulkhead_worker_api::context::WorkClass,
) -> bulkhead_engine::WorkClass {
    match c {
        bulkhead_worker_api::context::WorkClass::Interactive => {
            bulkhead_engine::WorkClass::Interactive
        }
        bulkhead_worker_api::context::WorkClass::Batch => bulkhead_engine::WorkClass::Batch,
    }
}
