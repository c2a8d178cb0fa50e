//! Newtype identifiers: no raw integer crosses a module boundary as an id.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// A tenant (account) whose requests own KV pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(u64);

/// One inference request, unique within a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(u64);

/// A physical page slot in a worker's pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageId(u32);

/// The allocation generation of a page: changes on every allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Generation(u64);

/// One KV handover from a prefill worker to a decode worker. Chosen by the
/// decode worker at random; never reused (finished ids are tombstoned).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TransferId(u64);

/// Who a sequence, and so each of its pages, belongs to.
///
/// Built only inside this crate, by [`crate::Limits::admit`], with a
/// request id no other owner in this process has: code outside the crate
/// can read an owner but never make one, so it cannot present another
/// sequence's identity to the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Owner {
    tenant: TenantId,
    request: RequestId,
}

impl Owner {
    /// A fresh owner for `tenant`: a request id never handed out before in
    /// this process.
    pub(crate) fn fresh(tenant: TenantId) -> Owner {
        Owner {
            tenant,
            request: RequestId::fresh(),
        }
    }

    /// The tenant.
    pub fn tenant(&self) -> TenantId {
        self.tenant
    }

    /// The request.
    pub fn request(&self) -> RequestId {
        self.request
    }
}

impl TenantId {
    /// Wraps a raw tenant number, as authenticated at the edge. Naming a
    /// tenant grants nothing: pages are reached through page tables, never
    /// by owner.
    pub const fn new(raw: u64) -> Self {
        TenantId(raw)
    }

    /// The raw number, for wire formats and logs.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl RequestId {
    /// A request id never handed out before in this process.
    fn fresh() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        RequestId(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// The raw number, for wire formats and logs.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl PageId {
    /// No page: what a refusal names when no real page was involved (an
    /// index past the table, a page not written yet), so that nothing is
    /// quarantined for it.
    pub(crate) const NONE: PageId = PageId(u32::MAX);

    pub(crate) fn index(self) -> usize {
        self.0 as usize
    }

    pub(crate) fn from_index(i: usize) -> Self {
        PageId(u32::try_from(i).expect("page count fits u32 (checked at pool creation)"))
    }

    /// The raw slot number, for wire formats, logs and fault-injection tests.
    pub const fn get(self) -> u32 {
        self.0
    }
}

impl Generation {
    pub(crate) const FIRST: Generation = Generation(1);

    pub(crate) fn next(self) -> Generation {
        Generation(self.0 + 1)
    }

    /// The raw number, for wire formats and logs.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// A generation read from the wire. Only comparisons with the pool's own
    /// generations give it meaning; it grants nothing by itself.
    pub const fn from_wire(raw: u64) -> Self {
        Generation(raw)
    }
}

impl TransferId {
    /// Wraps a raw transfer number.
    pub const fn new(raw: u64) -> Self {
        TransferId(raw)
    }

    /// The raw number, for wire formats and logs.
    pub const fn get(self) -> u64 {
        self.0
    }
}

/// `Display` for an id newtype: its number in `format`.
macro_rules! display {
    ($($id:ident => $format:literal),* $(,)?) => {
        $(impl fmt::Display for $id {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, $format, self.0)
            }
        })*
    };
}

display! {
    TransferId => "xfer-{:016x}",
    TenantId => "tenant-{}",
    RequestId => "req-{}",
    PageId => "page-{}",
}

/// A prefix-cache namespace: whose cached pages a sequence may share. The
/// platform derives it from what it authenticated (the account, the model
/// and its config version); nothing a client sends goes into it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Namespace([u8; 16]);

impl Namespace {
    /// Wraps a digest the platform computed.
    pub const fn from_digest(digest: [u8; 16]) -> Self {
        Namespace(digest)
    }

    /// The digest.
    pub const fn digest(&self) -> &[u8; 16] {
        &self.0
    }
}

impl fmt::Debug for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Namespace(")?;
        for b in &self.0[..4] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "..)")
    }
}

/// The prefix-cache namespaces a sequence may read and the one it adds to:
/// its own, and optionally the model's shared namespace, where an operator
/// published a prefix every tenant may reuse. A sequence publishes only
/// into its own namespace; reading a cached page of any other namespace is
/// an ownership violation, not a miss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheScope {
    own: Namespace,
    shared: Option<Namespace>,
}

impl CacheScope {
    /// A scope reading `own` (and `shared`, tried first, when given) and
    /// publishing into `own`.
    pub const fn new(own: Namespace, shared: Option<Namespace>) -> Self {
        CacheScope { own, shared }
    }

    /// The namespace it publishes into.
    pub const fn own(&self) -> Namespace {
        self.own
    }

    /// The shared namespace it may read.
    pub const fn shared(&self) -> Option<Namespace> {
        self.shared
    }

    /// Whether a cached page of `ns` is readable in this scope.
    pub fn may_read(&self, ns: Namespace) -> bool {
        ns == self.own || self.shared == Some(ns)
    }
}
