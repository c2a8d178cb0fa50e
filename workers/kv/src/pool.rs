//! The physical page pool: tags, free list, page memory and checked access.
//!
//! No byte of a previous owner is ever readable by the next one: a page
//! is *clean* when every byte in it was written by its current owner or
//! zeroed for it. Pages are lent to a sender or committed only when clean,
//! and a layer of a page is read only once no stale byte is left in it. An
//! ordinary page gets there as its owner writes it:
//! [`KvPool::begin_write`] zeroes only the slots a write run will not
//! cover (so pages the owner fills whole are never zeroed), and each layer
//! becomes readable once the run's slots in it are written. A landing page
//! is clean once its transfer has overwritten every byte of it.
//!
//! Page memory is f16 or f32 ([`KvDtype`]), one contiguous block per page,
//! `[layer][keys | values]`, keys dimension-major and values token-major. No
//! `Debug` output shows it.
//!
//! A read whose table entry does not match the page's tag gets an
//! [`OwnerViolation`], and the page can be quarantined
//! ([`KvPool::quarantine`]): a free page leaves service at once, one its
//! rightful owner still holds when that owner releases it (the refused sequence
//! neither read nor wrote it, so the owner is unharmed). A quarantined page
//! never returns to the free list, and a request admitted before a quarantine
//! that can no longer fit is refused ([`AllocError::NeverFits`]) instead of
//! blocking the queue. A refusal that involves no real page (an index past the
//! table, a layer not yet written) names `PageId::NONE`, so nothing is
//! quarantined for it.
//!
//! [`KvPool::release`] frees only the entries whose tag still matches, so a
//! page never returns to the free list while another table may name it; pages
//! still tagged with the owner but missing from its table (a corrupted table)
//! are found by a sweep of the tags, so none leaks.

use crate::admission::{Admitted, Limits, PoolId};
use crate::ids::{CacheScope, Generation, Namespace, Owner, PageId, TransferId};
use half::f16;
use std::sync::atomic::{AtomicU64, Ordering};

mod lend;
mod prefix;
mod read;
mod write;

pub use lend::{Home, LentPage};
pub use prefix::PrefixHit;

/// Shape of the KV memory: what one page holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvGeometry {
    /// Transformer layers.
    pub layers: usize,
    /// Key/value heads per layer.
    pub kv_heads: usize,
    /// Dimension of one head.
    pub head_dim: usize,
    /// Tokens per page.
    pub page_size: usize,
    /// How each key or value is stored.
    pub dtype: KvDtype,
}

/// The element type of page memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    /// IEEE half precision, as llama.cpp's default KV cache.
    F16,
    /// Single precision.
    F32,
}

/// One head's keys or values in a page, in the pool's element type.
#[derive(Debug, Clone, Copy)]
pub enum KvData<'a> {
    /// Half-precision elements.
    F16(&'a [f16]),
    /// Single-precision elements.
    F32(&'a [f32]),
}

/// Page memory: one contiguous block per page, `[layer][keys | values]`,
/// so a page moves in and out (and is lent) as a whole. A lent page's
/// block is out of the pool, held by its [`LentPage`].
enum Planes {
    F16(Vec<Box<[f16]>>),
    F32(Vec<Box<[f32]>>),
}

impl std::fmt::Debug for Planes {
    // Never the memory: a debug line of the pool (or of anything holding
    // it) must not become a way out for tenants' KV.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (kind, pages) = match self {
            Planes::F16(p) => ("f16", p.len()),
            Planes::F32(p) => ("f32", p.len()),
        };
        write!(f, "Planes({pages} {kind} pages)")
    }
}

/// What a page's memory holds, with respect to its current owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fill {
    /// Every byte was written by the owner or zeroed for it.
    Clean,
    /// May hold a previous owner's bytes.
    Stale,
    /// A write run was begun: every slot outside `lo..hi` is zeroed, and
    /// in `lo..hi` the layers below `layer` are written; in `layer`, the
    /// slots in `mask` are.
    Writing {
        lo: u16,
        hi: u16,
        layer: u16,
        mask: [u64; 4],
    },
}

/// Where a page's memory is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Whereabouts {
    Home,
    /// Lent out; on return it stays with its owner.
    Lent,
    /// Lent out and released meanwhile: freed (zeroed if `scrub`) on return.
    LentThenFree {
        scrub: bool,
    },
}

impl KvGeometry {
    /// Elements of one page in one layer, for keys or for values.
    fn floats_per_layer_page(&self) -> usize {
        self.kv_heads * self.head_dim * self.page_size
    }

    /// Bytes one page takes across all layers, keys and values.
    pub fn bytes_per_page(&self) -> usize {
        let elem = match self.dtype {
            KvDtype::F16 => 2,
            KvDtype::F32 => 4,
        };
        self.layers * 2 * self.floats_per_layer_page() * elem
    }

    /// Pages that fit in `bytes`.
    pub fn pages_for_budget(&self, bytes: usize) -> usize {
        bytes / self.bytes_per_page()
    }
}

/// Who holds a physical page now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageTag {
    /// In the free list.
    Free,
    /// Allocated to `owner` at `generation`.
    Owned {
        /// The owning sequence.
        owner: Owner,
        /// The allocation's generation.
        generation: Generation,
    },
    /// Allocated to `owner` at `generation` and granted to `transfer` as a
    /// landing slot: writable by that transfer only, readable by nobody
    /// until the transfer is verified and committed.
    Receiving {
        /// The sequence the transfer is for.
        owner: Owner,
        /// The allocation's generation.
        generation: Generation,
        /// The only transfer that may write it.
        transfer: TransferId,
    },
    /// In the prefix cache: immutable, shared by the tables of its
    /// namespace that reuse it (see the `prefix` module).
    Cached {
        /// Whose prefix it is.
        namespace: Namespace,
        /// The allocation's generation (kept from when it was computed).
        generation: Generation,
    },
    /// Taken out of service after an ownership violation.
    Quarantined,
}

/// Whether page accesses compare tags. Exists only in builds with the
/// `test-hooks` feature (tests and `bench engine`), never in the serving
/// build, where every access is checked.
#[cfg(feature = "test-hooks")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerChecks {
    /// Every read and write compares the page's tag with the sequence.
    Enforced,
    /// No comparison: so `bulkhead bench engine` can measure what the
    /// checks cost.
    OffForBenchmark,
}

/// One entry of a page table: a physical page and the generation it was
/// allocated at. Never leaves this crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PageRef {
    page: PageId,
    generation: Generation,
}

/// The pages of one sequence, in token order. Not `Clone`: one table per allocation.
#[derive(Debug)]
pub struct PageTable {
    owner: Owner,
    pages: Vec<PageRef>,
    /// The most pages its admission allows it to hold.
    limit: usize,
    /// Which cached pages it may read and where it publishes; `None`:
    /// it takes no part in the prefix cache.
    scope: Option<CacheScope>,
}

/// A page access that the page's tag does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("KV page {page} is not owned by {} of {}", .owner.request(), .owner.tenant())]
pub struct OwnerViolation {
    /// The page that was refused.
    pub page: PageId,
    /// The sequence that tried to access it.
    pub owner: Owner,
}

/// The pool has too few free pages now; the request waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{needed} KV pages needed, {free} free")]
pub struct PoolExhausted {
    /// Pages the request needs.
    pub needed: usize,
    /// Pages free now.
    pub free: usize,
}

/// Why [`KvPool::allocate`] gave no pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AllocError {
    /// Too few pages are free now; the request may wait.
    #[error(transparent)]
    Exhausted(#[from] PoolExhausted),
    /// More pages than the pool can ever give (pages were quarantined
    /// since admission): the request can never fit and must be refused.
    #[error("{needed} KV pages needed, the pool can hold {capacity}")]
    NeverFits {
        /// Pages the request needs.
        needed: usize,
        /// Pages the pool can still allocate at all.
        capacity: usize,
    },
    /// The admission was made for another pool (or page size).
    #[error("the admission was made for another KV pool")]
    OtherPool,
}

/// Allocation counters of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolCounters {
    /// Pages in the pool.
    pub total_pages: usize,
    /// Pages an allocation can take: the free list and the evictable
    /// cached pages.
    pub free_pages: usize,
    /// Pages owned by a sequence.
    pub allocated_pages: usize,
    /// Pages out of service.
    pub quarantined_pages: usize,
    /// Page tables handed out so far.
    pub allocations: u64,
    /// Page tables returned so far.
    pub releases: u64,
    /// Ownership violations detected so far.
    pub owner_violations: u64,
    /// Pages granted to a KV transfer and not yet committed (a subset of
    /// `allocated_pages`).
    pub receiving_pages: usize,
    /// Pages whose memory is lent to a transfer (a subset of
    /// `allocated_pages`: a lent page is never free).
    pub lent_pages: usize,
    /// Pages in the prefix cache, each counted once however many tables
    /// share it: the referenced ones are allocated, the evictable free.
    pub cached_pages: usize,
    /// Cached pages no table names (evictable, so counted in `free_pages`).
    pub evictable_pages: usize,
    /// Prompt tokens read from the cache instead of computed.
    pub prefix_hit_tokens: u64,
}

/// A worker's KV pool. Owned by one thread (the engine loop); shared
/// read-only with the attention threads through [`PageReader`].
#[derive(Debug)]
pub struct KvPool {
    id: PoolId,
    geometry: KvGeometry,
    tags: Vec<PageTag>,
    free: Vec<PageId>,
    next_generation: Generation,
    /// Owned pages to quarantine when their owner releases them.
    pending_quarantine: Vec<PageId>,
    /// Pages tagged `Quarantined` (they never come back).
    quarantined: usize,
    planes: Planes,
    whereabouts: Vec<Whereabouts>,
    /// Per page: which of its bytes are its owner's (see [`Fill`]).
    fill: Vec<Fill>,
    scrub_on_free: bool,
    #[cfg(feature = "test-hooks")]
    checks: OwnerChecks,
    allocations: u64,
    releases: u64,
    owner_violations: u64,
    prefix: prefix::PrefixCache,
}

/// Shared, read-only access to page memory, one tag check per page.
#[derive(Debug, Clone, Copy)]
pub struct PageReader<'a> {
    pool: &'a KvPool,
}

/// One layer's keys and values of one page, after its tag was checked.
#[derive(Debug, Clone, Copy)]
pub struct PageView<'a> {
    pool: &'a KvPool,
    page: usize,
    /// Offset of the layer's keys in the page; values follow after `n`.
    base: usize,
    n: usize,
    head_floats: usize,
}

impl KvPool {
    /// A pool of `pages` pages. Page memory is allocated lazily by the OS
    /// and is not zeroed between owners unless `scrub_on_free`.
    ///
    /// # Panics
    /// If `pages` does not fit a `u32` page id.
    pub fn new(geometry: KvGeometry, pages: usize, scrub_on_free: bool) -> Self {
        assert!(pages < u32::MAX as usize, "too many pages");
        assert!(geometry.page_size <= 256, "pages hold at most 256 tokens");
        static NEXT_POOL: AtomicU64 = AtomicU64::new(1);
        let floats = geometry.layers * 2 * geometry.floats_per_layer_page();
        KvPool {
            id: PoolId(NEXT_POOL.fetch_add(1, Ordering::Relaxed)),
            geometry,
            tags: vec![PageTag::Free; pages],
            // Pop from the end: lowest page ids are handed out first.
            free: (0..pages).rev().map(PageId::from_index).collect(),
            next_generation: Generation::FIRST,
            pending_quarantine: Vec::new(),
            quarantined: 0,
            planes: match geometry.dtype {
                KvDtype::F16 => Planes::F16(
                    (0..pages)
                        .map(|_| vec![f16::ZERO; floats].into_boxed_slice())
                        .collect(),
                ),
                KvDtype::F32 => Planes::F32(
                    (0..pages)
                        .map(|_| vec![0.0; floats].into_boxed_slice())
                        .collect(),
                ),
            },
            whereabouts: vec![Whereabouts::Home; pages],
            // Fresh memory is zeroed.
            fill: vec![Fill::Clean; pages],
            scrub_on_free,
            #[cfg(feature = "test-hooks")]
            checks: OwnerChecks::Enforced,
            allocations: 0,
            releases: 0,
            owner_violations: 0,
            prefix: prefix::PrefixCache::default(),
        }
    }

    /// Sets whether freed pages are zeroed.
    #[cfg(feature = "test-hooks")]
    pub fn set_scrub_on_free(&mut self, scrub: bool) {
        self.scrub_on_free = scrub;
    }

    /// Sets whether accesses check tags (see [`OwnerChecks`]).
    #[cfg(feature = "test-hooks")]
    pub fn set_owner_checks(&mut self, checks: OwnerChecks) {
        self.checks = checks;
    }

    /// The page shape.
    pub fn geometry(&self) -> KvGeometry {
        self.geometry
    }

    /// Tokens the pool can hold: every page not taken out of service.
    pub fn capacity_tokens(&self) -> usize {
        self.capacity_pages() * self.geometry.page_size
    }

    fn capacity_pages(&self) -> usize {
        self.tags.len() - self.quarantined - self.pending_quarantine.len()
    }

    /// This pool's admission limits for a model whose context window is
    /// `context_window`: the pool's real capacity and page size, and its
    /// identity, so that [`KvPool::allocate`] takes only what was admitted
    /// for it.
    pub fn limits(&self, context_window: usize) -> Limits {
        Limits::of_pool(
            context_window,
            self.capacity_tokens(),
            self.geometry.page_size,
            self.id,
        )
    }

    /// Allocates every page the admitted request needs, or none.
    pub fn allocate<T>(&mut self, admitted: &Admitted<T>) -> Result<PageTable, AllocError> {
        self.allocate_with(admitted, None)
    }

    /// Allocates every page like [`KvPool::allocate`], and tags the first
    /// [`Admitted::prompt_pages`] as landing slots of `transfer`: unreadable
    /// until [`KvPool::commit_received`].
    pub fn allocate_receiving<T>(
        &mut self,
        admitted: &Admitted<T>,
        transfer: TransferId,
    ) -> Result<PageTable, AllocError> {
        self.allocate_with(admitted, Some(transfer))
    }

    fn allocate_with<T>(
        &mut self,
        admitted: &Admitted<T>,
        transfer: Option<TransferId>,
    ) -> Result<PageTable, AllocError> {
        self.allocate_tail(admitted, Vec::new(), transfer)
    }

    /// Allocates the pages of `admitted` that `head` (cached pages the
    /// table starts with, already referenced) does not cover.
    fn allocate_after<T>(
        &mut self,
        admitted: &Admitted<T>,
        head: Vec<PageRef>,
    ) -> Result<PageTable, AllocError> {
        self.allocate_tail(admitted, head, None)
    }

    fn allocate_tail<T>(
        &mut self,
        admitted: &Admitted<T>,
        head: Vec<PageRef>,
        transfer: Option<TransferId>,
    ) -> Result<PageTable, AllocError> {
        if !admitted.made_for(self.id, self.geometry.page_size) {
            return Err(AllocError::OtherPool);
        }
        let capacity = self.capacity_pages();
        if admitted.pages() > capacity {
            return Err(AllocError::NeverFits {
                needed: admitted.pages(),
                capacity,
            });
        }
        let needed = admitted.reserve().saturating_sub(head.len());
        if needed > self.free_pages() {
            return Err(PoolExhausted {
                needed,
                free: self.free_pages(),
            }
            .into());
        }
        let owner = admitted.owner();
        let mut pages = head;
        pages.reserve(needed);
        for i in 0..needed {
            let page = self.take_free().expect("length checked above");
            let generation = self.next_generation;
            self.next_generation = generation.next();
            self.tags[page.index()] = match transfer {
                Some(transfer) if i < admitted.prompt_pages() => {
                    // Clean only once its transfer has written all of it.
                    self.fill[page.index()] = Fill::Stale;
                    PageTag::Receiving {
                        owner,
                        generation,
                        transfer,
                    }
                }
                _ => PageTag::Owned { owner, generation },
            };
            pages.push(PageRef { page, generation });
        }
        self.allocations += 1;
        Ok(PageTable {
            owner,
            pages,
            limit: admitted.pages(),
            scope: None,
        })
    }

    /// A free page, evicting an unreferenced cached one when the free
    /// list is empty.
    fn take_free(&mut self) -> Option<PageId> {
        if self.free.is_empty() {
            self.evict_one();
        }
        self.free.pop()
    }

    /// Adds pages to `table` until it holds `pages` pages, or none if too
    /// few are free; never past what its admission allowed
    /// ([`AllocError::NeverFits`]). New pages are owned, as allocated ones.
    pub fn grow(&mut self, table: &mut PageTable, pages: usize) -> Result<(), AllocError> {
        if pages <= table.pages.len() {
            return Ok(());
        }
        if pages > table.limit {
            return Err(AllocError::NeverFits {
                needed: pages,
                capacity: table.limit,
            });
        }
        let needed = pages - table.pages.len();
        if needed > self.free_pages() {
            return Err(PoolExhausted {
                needed,
                free: self.free_pages(),
            }
            .into());
        }
        for _ in 0..needed {
            let page = self.take_free().expect("length checked above");
            let generation = self.next_generation;
            self.next_generation = generation.next();
            self.tags[page.index()] = PageTag::Owned {
                owner: table.owner,
                generation,
            };
            table.pages.push(PageRef { page, generation });
        }
        Ok(())
    }

    /// Returns every page of `table` to the pool, as [`KvPool::release`]
    /// does, and leaves the table empty: a preempted sequence keeps its
    /// owner and limit and [`KvPool::grow`]s again when it resumes.
    pub fn release_pages(&mut self, table: &mut PageTable) {
        let emptied = PageTable {
            owner: table.owner,
            pages: Vec::new(),
            limit: table.limit,
            scope: table.scope,
        };
        let held = std::mem::replace(table, emptied);
        self.release(held);
    }

    /// Pages an allocation can take now: free ones and cached ones no
    /// table names.
    pub fn free_pages(&self) -> usize {
        self.free.len() + self.evictable()
    }

    /// Returns a table's pages to the free list. Entries whose tag no longer
    /// matches (quarantined, or not the table's own) are left alone; pages
    /// still tagged with the table's owner but missing from it (a corrupted
    /// table) are found by a sweep and freed too.
    pub fn release(&mut self, table: PageTable) {
        let scrub = self.scrub_on_free;
        self.release_with(table, scrub);
    }

    /// Releases like [`KvPool::release`] and zeroes every page returned,
    /// whatever `scrub_on_free` says: for pages a failed transfer may have
    /// partly written.
    pub fn release_scrubbed(&mut self, table: PageTable) {
        self.release_with(table, true);
    }

    #[allow(clippy::needless_pass_by_value)] // Taking the table is the point: it cannot be used after.
    fn release_with(&mut self, table: PageTable, scrub: bool) {
        let mut returned = 0;
        let mut cached = Vec::new();
        for r in &table.pages {
            if self.held_by(table.owner, *r) {
                self.free_page(r.page, scrub);
                returned += 1;
            } else if self.names_cached(*r) {
                cached.push(r.page);
                returned += 1;
            }
        }
        self.unref(cached.into_iter());
        if returned != table.pages.len() {
            for i in 0..self.tags.len() {
                if matches!(self.tags[i], PageTag::Owned { owner, .. } | PageTag::Receiving { owner, .. } if owner == table.owner)
                {
                    self.free_page(PageId::from_index(i), scrub);
                }
            }
        }
        self.releases += 1;
    }

    /// Records a violation and takes its page out of service: at once if
    /// it is free, else when its rightful owner releases it (the refused
    /// sequence neither read nor wrote it, so the owner is unharmed).
    pub fn quarantine(&mut self, violation: &OwnerViolation) {
        self.owner_violations += 1;
        let i = violation.page.index();
        match self.tags.get(i) {
            Some(PageTag::Free) => {
                self.free.retain(|p| *p != violation.page);
                self.tags[i] = PageTag::Quarantined;
                self.quarantined += 1;
            }
            Some(PageTag::Owned { .. } | PageTag::Receiving { .. }) => {
                if !self.pending_quarantine.contains(&violation.page) {
                    self.pending_quarantine.push(violation.page);
                }
            }
            Some(PageTag::Cached { .. }) => {
                if !self.pending_quarantine.contains(&violation.page) {
                    self.pending_quarantine.push(violation.page);
                }
                self.withdraw(violation.page);
            }
            Some(PageTag::Quarantined) | None => {}
        }
    }

    fn free_page(&mut self, page: PageId, scrub: bool) {
        if self.whereabouts[page.index()] != Whereabouts::Home {
            // The memory is out: the page is freed when it comes back.
            self.whereabouts[page.index()] = Whereabouts::LentThenFree { scrub };
            return;
        }
        if let Some(at) = self.pending_quarantine.iter().position(|p| *p == page) {
            self.pending_quarantine.swap_remove(at);
            self.tags[page.index()] = PageTag::Quarantined;
            self.quarantined += 1;
            return;
        }
        if scrub {
            self.scrub(page);
        }
        self.fill[page.index()] = if scrub { Fill::Clean } else { Fill::Stale };
        self.tags[page.index()] = PageTag::Free;
        self.free.push(page);
    }

    /// The tag of `page` (for tests and metrics).
    pub fn tag(&self, page: PageId) -> Option<PageTag> {
        self.tags.get(page.index()).copied()
    }

    /// Counters for metrics and tests.
    pub fn counters(&self) -> PoolCounters {
        let quarantined = self.quarantined;
        let receiving = self
            .tags
            .iter()
            .filter(|t| matches!(t, PageTag::Receiving { .. }))
            .count();
        let lent = self
            .whereabouts
            .iter()
            .filter(|w| **w != Whereabouts::Home)
            .count();

        PoolCounters {
            total_pages: self.tags.len(),
            free_pages: self.free_pages(),
            allocated_pages: self.tags.len() - self.free_pages() - quarantined,
            quarantined_pages: quarantined,
            allocations: self.allocations,
            releases: self.releases,
            owner_violations: self.owner_violations,
            receiving_pages: receiving,
            lent_pages: lent,
            cached_pages: self.cached_pages(),
            evictable_pages: self.evictable(),
            prefix_hit_tokens: self.prefix.hit_tokens,
        }
    }

    fn scrub(&mut self, page: PageId) {
        match &mut self.planes {
            Planes::F16(pages) => pages[page.index()].fill(f16::ZERO),
            Planes::F32(pages) => pages[page.index()].fill(0.0),
        }
    }
}

impl PageTable {
    /// The owning sequence.
    pub fn owner(&self) -> Owner {
        self.owner
    }

    /// Entries (pages) in the table.
    pub fn len(&self) -> usize {
        self.pages.len()
    }

    /// Whether the table has no page.
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// The generation of each entry, in token order (landing slots are
    /// granted by generation; a generation grants nothing by itself).
    pub fn generations(&self) -> impl Iterator<Item = Generation> + '_ {
        self.pages.iter().map(|r| r.generation)
    }

    /// The physical page of each entry, for tests that inspect tags.
    #[cfg(feature = "test-hooks")]
    pub fn page_ids(&self) -> Vec<PageId> {
        self.pages.iter().map(|r| r.page).collect()
    }

    /// Points entry `index` at what entry `source_index` of `source`
    /// names: simulates the index bugs of the 2026 incident so tests can
    /// show the tag check stops them.
    #[cfg(feature = "test-hooks")]
    pub fn redirect_for_fault_injection(
        &mut self,
        index: usize,
        source: &PageTable,
        source_index: usize,
    ) {
        self.pages[index] = source.pages[source_index];
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ids::TenantId;

    /// Two layers, one head of four, two tokens a page.
    pub(crate) const GEO: KvGeometry = KvGeometry {
        layers: 2,
        kv_heads: 1,
        head_dim: 4,
        page_size: 2,
        dtype: KvDtype::F32,
    };

    pub(crate) fn tenant(t: u64) -> TenantId {
        TenantId::new(t)
    }

    pub(crate) fn limits(pool: &KvPool) -> Limits {
        pool.limits(64)
    }

    /// A fresh table of `tokens` positions for tenant `t`.
    pub(crate) fn fresh_table(pool: &mut KvPool, t: u64, tokens: usize) -> PageTable {
        let a = limits(pool).admit(tenant(t), tokens, 1, ()).unwrap();
        pool.allocate(&a).unwrap()
    }

    /// A fresh table of `tokens` positions for tenant `t`, landing `transfer`.
    pub(crate) fn receiving(
        pool: &mut KvPool,
        t: u64,
        tokens: usize,
        transfer: TransferId,
    ) -> PageTable {
        let a = limits(pool).admit(tenant(t), tokens, 1, ()).unwrap();
        pool.allocate_receiving(&a, transfer).unwrap()
    }

    /// Writes positions `start..start + len` of `table` in every layer, as
    /// a step of the engine does.
    pub(crate) fn fill(pool: &mut KvPool, table: &PageTable, start: usize, len: usize, x: f32) {
        pool.begin_write(table, start, len).unwrap();
        for layer in 0..pool.geometry().layers {
            for pos in start..start + len {
                pool.write_token(table, layer, pos, &[x; 4], &[x; 4])
                    .unwrap();
            }
        }
    }

    /// Every element of the page behind entry `index` (all layers).
    pub(crate) fn page_floats(pool: &KvPool, table: &PageTable, index: usize) -> Vec<f32> {
        let r = table.pages[index];
        match &pool.planes {
            Planes::F32(p) => p[r.page.index()].to_vec(),
            Planes::F16(p) => p[r.page.index()].iter().map(|x| x.to_f32()).collect(),
        }
    }

    #[test]
    fn a_table_grows_within_its_admission_and_empties_for_a_resume() {
        let mut pool = KvPool::new(GEO, 8, false);
        // Prompt 3 (2 pages) + up to 9 output tokens: 6 pages at most.
        let a = limits(&pool)
            .admit(tenant(1), 3, 9, ())
            .unwrap()
            .first_slice(1);
        assert_eq!((a.reserve(), a.pages()), (2, 6));
        let mut table = pool.allocate(&a).unwrap();
        assert_eq!((table.len(), pool.free_pages()), (2, 6));
        fill(&mut pool, &table, 0, 4, 1.0);
        pool.grow(&mut table, 3).unwrap();
        assert_eq!(table.len(), 3);
        // The new page is owned and written like any other.
        fill(&mut pool, &table, 4, 1, 2.0);
        assert!(pool.reader().page(&table, 2, 1).is_ok());
        // Never past the admission.
        assert!(matches!(
            pool.grow(&mut table, 7),
            Err(AllocError::NeverFits {
                needed: 7,
                capacity: 6
            })
        ));
        // Not enough free pages: nothing is taken.
        let other = fresh_table(&mut pool, 2, 9);
        assert_eq!(pool.free_pages(), 0);
        assert!(matches!(
            pool.grow(&mut table, 4),
            Err(AllocError::Exhausted(_))
        ));
        assert_eq!(table.len(), 3);
        // Preempted: every page goes back; the table keeps its owner.
        let owner = table.owner();
        pool.release_pages(&mut table);
        assert_eq!((table.len(), pool.free_pages()), (0, 3));
        assert!(pool.reader().page(&table, 0, 0).is_err());
        pool.grow(&mut table, 3).unwrap();
        assert_eq!(table.owner(), owner);
        // Resumed pages are stale until written again.
        assert!(pool.reader().page(&table, 0, 0).is_err());
        pool.release(table);
        pool.release(other);
        assert_eq!(pool.free_pages(), 8);
    }

    #[test]
    fn foreign_and_stale_pages_are_refused() {
        let mut pool = KvPool::new(GEO, 4, false);
        let a = limits(&pool).admit(tenant(1), 3, 1, ()).unwrap();
        let table_a = pool.allocate(&a).unwrap();
        pool.write_token(&table_a, 0, 0, &[1.0; 4], &[2.0; 4])
            .unwrap();
        assert!(pool.reader().page(&table_a, 0, 0).is_ok());
        // B's table pointed at A's page (the incident's index bug) reads nothing.
        let mut table_b = fresh_table(&mut pool, 2, 1);
        let stolen = table_a.pages[0];
        table_b.pages[0] = stolen;
        let err = pool.reader().page(&table_b, 0, 0).unwrap_err();
        assert_eq!(err.page, stolen.page);
        assert!(
            pool.write_token(&table_b, 0, 0, &[0.0; 4], &[0.0; 4])
                .is_err()
        );
        assert!(pool.lend_source(&table_b, 0, None).is_err());
        // An index past the table is refused, not a panic.
        assert!(pool.reader().page(&table_a, 9, 0).is_err());

        // After release and reallocation the old generation is stale.
        let keep = table_a.pages[0];
        pool.release(table_a);
        pool.release(table_b);
        let mut table_a2 = fresh_table(&mut pool, 1, 7);
        fill(&mut pool, &table_a2, 0, 8, 5.0);
        let reused = table_a2
            .pages
            .iter()
            .position(|r| r.page == keep.page)
            .unwrap();
        assert_ne!(table_a2.pages[reused].generation, keep.generation);
        assert!(pool.reader().page(&table_a2, reused, 0).is_ok());
        table_a2.pages[reused] = keep;
        assert!(pool.reader().page(&table_a2, reused, 0).is_err());
    }

    #[test]
    fn allocation_is_all_or_nothing_and_quarantine_removes_pages() {
        let mut pool = KvPool::new(GEO, 3, true);
        let big = limits(&pool).admit(tenant(1), 5, 1, ()).unwrap();
        assert_eq!(big.pages(), 3);
        let t = pool.allocate(&big).unwrap();
        let again = limits(&pool).admit(tenant(1), 1, 1, ()).unwrap();
        assert_eq!(
            pool.allocate(&again).unwrap_err(),
            AllocError::Exhausted(PoolExhausted { needed: 1, free: 0 })
        );
        fill(&mut pool, &t, 0, 6, 1.0);
        let victim = t.pages[1];
        pool.quarantine(&OwnerViolation {
            page: victim.page,
            owner: Owner::fresh(tenant(2)),
        });
        // The rightful owner keeps its page until it releases it, but the
        // pool already counts it out of service.
        assert!(pool.reader().page(&t, 1, 0).is_ok());
        assert_eq!(pool.capacity_tokens(), 4);
        pool.release(t);
        let c = pool.counters();
        assert_eq!(
            (c.free_pages, c.quarantined_pages, c.allocated_pages),
            (2, 1, 0)
        );
        assert_eq!(c.owner_violations, 1);
        assert_eq!(pool.tag(victim.page), Some(PageTag::Quarantined));
        // A request admitted before the quarantine can never fit now.
        assert_eq!(
            pool.allocate(&big).unwrap_err(),
            AllocError::NeverFits {
                needed: 3,
                capacity: 2
            }
        );
        assert_eq!(pool.limits(64).pool_tokens(), 4);
    }

    #[test]
    fn an_admission_for_another_pool_allocates_nothing() {
        let mut a = KvPool::new(GEO, 4, false);
        let b = KvPool::new(GEO, 4, false);
        let for_b = limits(&b).admit(tenant(1), 1, 1, ()).unwrap();
        assert_eq!(a.allocate(&for_b).unwrap_err(), AllocError::OtherPool);
        assert_eq!(a.counters().allocations, 0);
    }

    #[test]
    fn no_byte_of_a_previous_owner_is_readable_by_the_next() {
        let mut pool = KvPool::new(GEO, 2, false);
        let ta = fresh_table(&mut pool, 1, 3);
        pool.begin_write(&ta, 0, 4).unwrap();
        for pos in 0..4 {
            for layer in 0..2 {
                pool.write_token(&ta, layer, pos, &[7.0; 4], &[7.0; 4])
                    .unwrap();
            }
        }
        pool.release(ta);
        // B gets A's pages back and writes one token of the first page.
        let b = limits(&pool).admit(tenant(2), 1, 2, ()).unwrap();
        let tb = pool.allocate(&b).unwrap();
        // Not yet written: not readable, not lendable.
        assert!(pool.reader().page(&tb, 0, 0).is_err());
        assert!(pool.lend_source(&tb, 0, None).is_err());
        pool.begin_write(&tb, 0, 1).unwrap();
        for layer in 0..2 {
            pool.write_token(&tb, layer, 0, &[1.0; 4], &[1.0; 4])
                .unwrap();
        }
        let floats = page_floats(&pool, &tb, 0);
        assert!(floats.iter().all(|x| *x == 0.0 || *x == 1.0), "{floats:?}");
        assert_eq!(floats.iter().filter(|x| **x == 1.0).count(), 16);
        // A write without begin_write zeroes the stale page whole first.
        pool.write_token(&tb, 0, 2, &[3.0; 4], &[3.0; 4]).unwrap();
        let floats = page_floats(&pool, &tb, 1);
        assert!(floats.iter().all(|x| *x == 0.0 || *x == 3.0), "{floats:?}");
        assert!(pool.reader().page(&tb, 1, 0).is_ok());
    }

    #[test]
    fn a_begun_run_is_readable_layer_by_layer_only_once_written() {
        let mut pool = KvPool::new(GEO, 1, false);
        let ta = fresh_table(&mut pool, 1, 1);
        fill(&mut pool, &ta, 0, 2, 7.0);
        pool.release(ta);
        let tb = fresh_table(&mut pool, 2, 1);
        // Promising to write is not writing: nothing is readable or lendable yet.
        pool.begin_write(&tb, 0, 2).unwrap();
        assert!(pool.reader().page(&tb, 0, 0).is_err());
        assert!(pool.lend_source(&tb, 0, None).is_err());
        // Layer 0 written in both slots: layer 0 readable, layer 1 not.
        for pos in 0..2 {
            pool.write_token(&tb, 0, pos, &[1.0; 4], &[1.0; 4]).unwrap();
        }
        assert!(pool.reader().page(&tb, 0, 0).is_ok());
        assert!(pool.reader().page(&tb, 0, 1).is_err());
        assert!(pool.lend_source(&tb, 0, None).is_err());
        pool.write_token(&tb, 1, 0, &[2.0; 4], &[2.0; 4]).unwrap();
        assert!(pool.reader().page(&tb, 0, 1).is_err());
        pool.write_token(&tb, 1, 1, &[2.0; 4], &[2.0; 4]).unwrap();
        assert!(pool.reader().page(&tb, 0, 1).is_ok());
        let lent = pool.lend_source(&tb, 0, None).unwrap();
        pool.restore(lent);
        pool.release(tb);
        // A write out of the run's order zeroes what the run has not written.
        let tc = fresh_table(&mut pool, 3, 1);
        pool.begin_write(&tc, 0, 1).unwrap();
        pool.write_token(&tc, 0, 1, &[3.0; 4], &[3.0; 4]).unwrap();
        assert!(pool.reader().page(&tc, 0, 1).is_ok());
        let floats = page_floats(&pool, &tc, 0);
        assert!(floats.iter().all(|x| *x == 0.0 || *x == 3.0), "{floats:?}");
        let tb = tc;
        // An index past the table names no page: nothing is quarantined.
        let v = pool.reader().page(&tb, 5, 0).unwrap_err();
        pool.quarantine(&v);
        assert_eq!(pool.counters().quarantined_pages, 0);
    }

    #[test]
    fn a_page_from_another_pool_is_never_installed() {
        let mut a = KvPool::new(GEO, 1, false);
        let mut b = KvPool::new(GEO, 1, false);
        let ta = a
            .allocate(&limits(&a).admit(tenant(1), 1, 1, ()).unwrap())
            .unwrap();
        let tb = b
            .allocate(&limits(&b).admit(tenant(2), 1, 1, ()).unwrap())
            .unwrap();
        fill(&mut a, &ta, 0, 2, 9.0);
        fill(&mut b, &tb, 0, 2, 1.0);
        let from_a = a.lend_source(&ta, 0, None).unwrap();
        let from_b = b.lend_source(&tb, 0, None).unwrap();
        // B's slot is out; A's page of the same index must not take its place.
        b.restore(from_a);
        assert_eq!(b.counters().lent_pages, 1);
        assert!(b.reader().page(&tb, 0, 0).is_err());
        b.restore(from_b);
        assert_eq!(b.counters().lent_pages, 0);
        assert!(!page_floats(&b, &tb, 0).contains(&9.0));
        assert!(
            !format!("{b:?}").contains("9.0"),
            "debug output shows no KV"
        );
    }
}
