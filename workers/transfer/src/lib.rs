//! Bulkhead's KV transfer protocol between a prefill and a decode worker.
//!
//! One request, one transfer. The decode worker admits the request,
//! allocates its pages, and grants the prompt's pages as landing slots
//! (their generations, never their physical ids) in a
//! [`wire::PrefillRequest`]. The prefill worker admits it again against its
//! own limits, computes the prompt, and writes each page through a
//! [`Transport`] into a [`Slot`] of that [`Grant`], then sends a
//! [`wire::Done`] with the token count, a digest and the last logits. The
//! decode side's [`Ledger`] checks every frame (transfer, slot, generation,
//! length, checksum, and the tag under the transfer's own key) and the
//! whole (all slots, token count, digest and its tag) before anything
//! becomes readable.
//!
//! - [`wire`]: frames and their encoding.
//! - [`checksum`]: CRC-32C page checksums and the xxh3 transfer digest.
//! - [`mac`]: the per-transfer key and the tags that make frames
//!   unforgeable.
//! - [`transport`]: the [`Transport`] trait, grants and slots, TCP.
//! - [`ledger`]: the decode side's verification, aborts and tombstones.
//! - `rdma` (feature `rdma`): the ibverbs transport.
//!
//! This crate knows pools only through `bulkhead-kv` ids; it never touches
//! page memory and knows nothing about models.

pub mod chaos;
pub mod checksum;
pub mod ledger;
pub mod mac;
mod polyhash;
#[cfg(feature = "rdma")]
pub mod rdma;
pub mod transport;
pub mod wire;

pub use chaos::ChaosCounts;
#[cfg(feature = "test-hooks")]
pub use chaos::ChaosTransport;
pub use checksum::Checksums;
pub use ledger::{DoneVerdict, Fault, Ledger, PageVerdict, TransferCounters};
pub use mac::{FrameKey, LandedTag, PageTagger};
pub use polyhash::Width as TagWidth;
#[cfg(feature = "test-hooks")]
pub use transport::SlowTransport;
pub use transport::{Grant, Slot, TcpTransport, Transport, TransportError, Written};
pub use wire::{Done, Head, Hello, Message, PageHeader, PrefillRequest, WireError, read_payload};
