//! The tenant-tagged paged KV pool of a Bulkhead worker, and admission.
//!
//! A worker's KV memory is one pool of fixed-size physical pages. Pages are
//! not zeroed between requests (unless `scrub_on_free` is set), so the pool
//! enforces ownership instead of assuming it:
//!
//! - every physical page carries a [`PageTag`]: its owner (tenant and request)
//!   and a [`Generation`] that changes on every allocation;
//! - a sequence reaches page memory only through [`KvPool::reader`] /
//!   [`KvPool::write_token`] / [`KvPool::lend_source`], which take the
//!   sequence's own [`PageTable`] and an index into it, and compare the
//!   page's tag with the table's entry and owner before handing out a slice;
//! - on a mismatch the data is not returned, the caller gets an
//!   [`OwnerViolation`], and the page can be [`KvPool::quarantine`]d;
//! - no byte a page's previous owner left is ever readable, lent or sent:
//!   see the `pool` module's doc.
//!
//! Pages are allocated only for an [`Admitted`] request, and only all at once.
//! [`Admitted`] can only be built by [`Limits::admit`], [`Limits`] only by
//! [`KvPool::limits`], and [`Owner`] only inside this crate, so a rejected
//! request has no value that could reach allocation or transfer, and no
//! code outside this crate can present another sequence's identity.
//!
//! This crate knows nothing about models, tokio, HTTP, CUDA or databases.

mod admission;
mod ids;
mod pool;

pub use admission::{AdmissionError, Admitted, Capacity, Limits};
pub use ids::{CacheScope, Generation, Namespace, Owner, PageId, RequestId, TenantId, TransferId};
#[cfg(feature = "test-hooks")]
pub use pool::OwnerChecks;
pub use pool::{
    AllocError, Home, KvData, KvDtype, KvGeometry, KvPool, LentPage, OwnerViolation, PageReader,
    PageTable, PageTag, PageView, PoolCounters, PoolExhausted, PrefixHit,
};
