//! The tenant-tagged paged KV pool of a Bulkhead worker, and admission.
//!
//! A worker's KV memory is one pool of fixed-size physical pages. Pages are
//! never zeroed between requests (unless `scrub_on_free` is set), so the pool
//! enforces ownership instead of assuming it:
//!
//! - every physical page carries a [`PageTag`]: its owner (tenant and request)
//!   and a [`Generation`] that changes on every allocation;
//! - a sequence reaches page memory only through [`KvPool::reader`] /
//!   [`KvPool::write_token`], which compare the page's tag with the reading
//!   sequence's [`PageTable`] entry and owner before handing out a slice;
//! - on a mismatch the data is not returned, the caller gets an
//!   [`OwnerViolation`], and the page can be [`KvPool::quarantine`]d.
//!
//! Pages are allocated only for an [`Admitted`] request, and only all at once.
//! [`Admitted`] can only be built by [`Limits::admit`], so a rejected request
//! has no value that could reach allocation or transfer.
//!
//! This crate knows nothing about models, tokio, HTTP, CUDA or databases.

mod admission;
mod ids;
mod pool;

pub use admission::{AdmissionError, Admitted, Limits};
pub use ids::{Generation, Owner, PageId, RequestId, TenantId, TransferId};
pub use pool::{
    Home, KvData, KvDtype, KvGeometry, KvPool, LentPage, OwnerChecks, OwnerViolation, PageReader,
    PageRef, PageTable, PageTag, PageView, PoolCounters, PoolExhausted,
};
