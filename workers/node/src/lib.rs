//! Bulkhead worker processes: the colocated, prefill and decode roles and
//! the HTTP API they serve.
//!
//! - [`prefill`]: accepts decode workers, admits at its own door, sends
//!   pages into granted slots.
//! - [`decode`]: admits against the pair's limits, lands and verifies
//!   transfers, generates.
//! - [`hello`]: what workers tell each other, and compatibility.
//! - [`http`]: `fn app(role, contexts) -> Router`.
//! - [`metrics`]: the worker's instruments.
//! - [`prefix`]: the prefix-cache scope of a call, from its signed context.
//! - [`usage`]: metering every call at the source.

pub mod decode;
pub mod hello;
pub mod http;
pub mod metrics;
pub mod prefill;
pub mod prefix;
#[cfg(feature = "rdma")]
mod rdma;
pub mod usage;

pub use decode::{DecodeOptions, DecodeWorker, SubmitError};
pub use hello::{TransportKind, hello};
pub use http::{ContextCheck, Role, app};
pub use prefill::{AdminCommand, LinkFault, PrefillOptions, PrefillWorker};
