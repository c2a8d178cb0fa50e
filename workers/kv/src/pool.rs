//! The physical page pool: tags, free list, page memory and checked access.

use crate::admission::Admitted;
use crate::ids::{Generation, Owner, PageId, TransferId};
use half::f16;

mod lend;

pub use lend::{Home, LentPage};

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
#[derive(Debug)]
enum Planes {
    F16(Vec<Box<[f16]>>),
    F32(Vec<Box<[f32]>>),
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
    /// Taken out of service after an ownership violation.
    Quarantined,
}

/// Whether page accesses compare tags. Always `Enforced` when serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerChecks {
    /// Every read and write compares the page's tag with the sequence.
    Enforced,
    /// No comparison: exists only so `bulkhead bench engine` can measure
    /// what the checks cost. No serving command can select it.
    OffForBenchmark,
}

/// One entry of a page table: a physical page and the generation it was
/// allocated at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRef {
    page: PageId,
    generation: Generation,
}

/// The pages of one sequence, in token order. Not `Clone`: one table per allocation.
#[derive(Debug)]
pub struct PageTable {
    owner: Owner,
    pages: Vec<PageRef>,
}

/// A page access that the page's tag does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("KV page {page} is not owned by {} of {}", .owner.request, .owner.tenant)]
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

/// Allocation counters of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolCounters {
    /// Pages in the pool.
    pub total_pages: usize,
    /// Pages in the free list.
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
}

/// A worker's KV pool. Owned by one thread (the engine loop); shared
/// read-only with the attention threads through [`PageReader`].
#[derive(Debug)]
pub struct KvPool {
    geometry: KvGeometry,
    tags: Vec<PageTag>,
    free: Vec<PageId>,
    next_generation: Generation,
    /// Owned pages to quarantine when their owner releases them.
    pending_quarantine: Vec<PageId>,
    planes: Planes,
    whereabouts: Vec<Whereabouts>,
    scrub_on_free: bool,
    checks: OwnerChecks,
    allocations: u64,
    releases: u64,
    owner_violations: u64,
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
        assert!(u32::try_from(pages).is_ok(), "too many pages");
        let floats = geometry.layers * 2 * geometry.floats_per_layer_page();
        KvPool {
            geometry,
            tags: vec![PageTag::Free; pages],
            // Pop from the end: lowest page ids are handed out first.
            free: (0..pages).rev().map(PageId::from_index).collect(),
            next_generation: Generation::FIRST,
            pending_quarantine: Vec::new(),
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
            scrub_on_free,
            checks: OwnerChecks::Enforced,
            allocations: 0,
            releases: 0,
            owner_violations: 0,
        }
    }

    /// Sets whether freed pages are zeroed.
    pub fn set_scrub_on_free(&mut self, scrub: bool) {
        self.scrub_on_free = scrub;
    }

    /// Sets whether accesses check tags (see [`OwnerChecks`]).
    pub fn set_owner_checks(&mut self, checks: OwnerChecks) {
        self.checks = checks;
    }

    /// The page shape.
    pub fn geometry(&self) -> KvGeometry {
        self.geometry
    }

    /// Tokens the whole pool can hold.
    pub fn capacity_tokens(&self) -> usize {
        self.tags.len() * self.geometry.page_size
    }

    /// Allocates every page the admitted request needs, or none.
    pub fn allocate<T>(&mut self, admitted: &Admitted<T>) -> Result<PageTable, PoolExhausted> {
        self.allocate_with(admitted, None)
    }

    /// Allocates every page like [`KvPool::allocate`], and tags the first
    /// [`Admitted::prompt_pages`] as landing slots of `transfer`: unreadable
    /// until [`KvPool::commit_received`].
    pub fn allocate_receiving<T>(
        &mut self,
        admitted: &Admitted<T>,
        transfer: TransferId,
    ) -> Result<PageTable, PoolExhausted> {
        self.allocate_with(admitted, Some(transfer))
    }

    fn allocate_with<T>(
        &mut self,
        admitted: &Admitted<T>,
        transfer: Option<TransferId>,
    ) -> Result<PageTable, PoolExhausted> {
        let needed = admitted.pages();
        if needed > self.free.len() {
            return Err(PoolExhausted {
                needed,
                free: self.free.len(),
            });
        }
        let owner = admitted.owner();
        let mut pages = Vec::with_capacity(needed);
        for i in 0..needed {
            let page = self.free.pop().expect("length checked above");
            let generation = self.next_generation;
            self.next_generation = generation.next();
            self.tags[page.index()] = match transfer {
                Some(transfer) if i < admitted.prompt_pages() => PageTag::Receiving {
                    owner,
                    generation,
                    transfer,
                },
                _ => PageTag::Owned { owner, generation },
            };
            pages.push(PageRef { page, generation });
        }
        self.allocations += 1;
        Ok(PageTable { owner, pages })
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
        for r in &table.pages {
            if self.held_by(table.owner, *r) {
                self.free_page(r.page, scrub);
                returned += 1;
            }
        }
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
            }
            Some(PageTag::Owned { .. } | PageTag::Receiving { .. }) => {
                self.pending_quarantine.push(violation.page);
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
            return;
        }
        if scrub {
            self.scrub(page);
        }
        self.tags[page.index()] = PageTag::Free;
        self.free.push(page);
    }

    /// The tag of `page` (for tests and metrics).
    pub fn tag(&self, page: PageId) -> Option<PageTag> {
        self.tags.get(page.index()).copied()
    }

    /// Counters for metrics and tests.
    pub fn counters(&self) -> PoolCounters {
        let quarantined = self
            .tags
            .iter()
            .filter(|t| **t == PageTag::Quarantined)
            .count();
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
            free_pages: self.free.len(),
            allocated_pages: self.tags.len() - self.free.len() - quarantined,
            quarantined_pages: quarantined,
            allocations: self.allocations,
            releases: self.releases,
            owner_violations: self.owner_violations,
            receiving_pages: receiving,
            lent_pages: lent,
        }
    }

    /// Writes one token's keys and values (`kv_heads * head_dim` each) for
    /// `layer` at position `pos` of the table's sequence.
    pub fn write_token(
        &mut self,
        table: &PageTable,
        layer: usize,
        pos: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(), OwnerViolation> {
        let g = self.geometry;
        let r = table.pages[pos / g.page_size];
        self.check(table.owner, r)?;
        let slot = pos % g.page_size;
        let n = g.floats_per_layer_page();
        let at = layer * 2 * n;
        match &mut self.planes {
            Planes::F16(pages) => {
                let (keys, values) = pages[r.page.index()][at..at + 2 * n].split_at_mut(n);
                scatter(keys, values, g, slot, k, v, f16::from_f32);
            }
            Planes::F32(pages) => {
                let (keys, values) = pages[r.page.index()][at..at + 2 * n].split_at_mut(n);
                scatter(keys, values, g, slot, k, v, |x| x);
            }
        }
        Ok(())
    }

    /// Shared read access for attention.
    pub fn reader(&self) -> PageReader<'_> {
        PageReader { pool: self }
    }

    fn tag_matches(&self, owner: Owner, r: PageRef) -> bool {
        self.tags.get(r.page.index())
            == Some(&PageTag::Owned {
                owner,
                generation: r.generation,
            })
    }

    /// Whether `owner` holds `r` in any state (owned or receiving).
    fn held_by(&self, owner: Owner, r: PageRef) -> bool {
        match self.tags.get(r.page.index()) {
            Some(
                PageTag::Owned {
                    owner: o,
                    generation,
                }
                | PageTag::Receiving {
                    owner: o,
                    generation,
                    ..
                },
            ) => *o == owner && *generation == r.generation,
            _ => false,
        }
    }

    fn check(&self, owner: Owner, r: PageRef) -> Result<(), OwnerViolation> {
        let home = self.whereabouts.get(r.page.index()) == Some(&Whereabouts::Home);
        let unchecked = self.checks == OwnerChecks::OffForBenchmark
            && matches!(self.tags.get(r.page.index()), Some(PageTag::Owned { .. }));
        if home && (unchecked || self.tag_matches(owner, r)) {
            Ok(())
        } else {
            Err(OwnerViolation {
                page: r.page,
                owner,
            })
        }
    }

    fn scrub(&mut self, page: PageId) {
        match &mut self.planes {
            Planes::F16(pages) => pages[page.index()].fill(f16::ZERO),
            Planes::F32(pages) => pages[page.index()].fill(0.0),
        }
    }
}

/// Writes one token into a page: keys dimension-major (`[head][dim][slot]`),
/// values token-major (`[head][slot][dim]`).
fn scatter<T: Copy>(
    keys: &mut [T],
    values: &mut [T],
    g: KvGeometry,
    slot: usize,
    k: &[f32],
    v: &[f32],
    conv: impl Fn(f32) -> T,
) {
    for h in 0..g.kv_heads {
        for d in 0..g.head_dim {
            keys[(h * g.head_dim + d) * g.page_size + slot] = conv(k[h * g.head_dim + d]);
        }
        let at = (h * g.page_size + slot) * g.head_dim;
        for (dst, src) in values[at..at + g.head_dim]
            .iter_mut()
            .zip(&v[h * g.head_dim..(h + 1) * g.head_dim])
        {
            *dst = conv(*src);
        }
    }
}

impl<'a> PageReader<'a> {
    /// The keys and values of page `r` in `layer`, if `owner` owns it at
    /// `r`'s generation. Otherwise the data is not returned.
    pub fn page(
        &self,
        layer: usize,
        owner: Owner,
        r: PageRef,
    ) -> Result<PageView<'a>, OwnerViolation> {
        self.pool.check(owner, r)?;
        let g = self.pool.geometry;
        let n = g.floats_per_layer_page();
        Ok(PageView {
            pool: self.pool,
            page: r.page.index(),
            base: layer * 2 * n,
            n,
            head_floats: g.head_dim * g.page_size,
        })
    }
}

impl<'a> PageView<'a> {
    /// Keys of `kv_head`, dimension-major: `[head_dim][page_size]`.
    pub fn keys(&self, kv_head: usize) -> KvData<'a> {
        let at =
            self.base + kv_head * self.head_floats..self.base + (kv_head + 1) * self.head_floats;
        match &self.pool.planes {
            Planes::F16(pages) => KvData::F16(&pages[self.page][at]),
            Planes::F32(pages) => KvData::F32(&pages[self.page][at]),
        }
    }

    /// Values of `kv_head`, token-major: `[page_size][head_dim]`.
    pub fn values(&self, kv_head: usize) -> KvData<'a> {
        let base = self.base + self.n;
        let at = base + kv_head * self.head_floats..base + (kv_head + 1) * self.head_floats;
        match &self.pool.planes {
            Planes::F16(pages) => KvData::F16(&pages[self.page][at]),
            Planes::F32(pages) => KvData::F32(&pages[self.page][at]),
        }
    }
}

impl PageRef {
    /// The physical page.
    pub fn page(&self) -> PageId {
        self.page
    }

    /// The generation it was allocated at.
    pub fn generation(&self) -> Generation {
        self.generation
    }
}

impl PageTable {
    /// The owning sequence.
    pub fn owner(&self) -> Owner {
        self.owner
    }

    /// The page references, in token order.
    pub fn pages(&self) -> &[PageRef] {
        &self.pages
    }

    /// Points entry `index` at `target`: simulates the index bugs of the
    /// 2026 incident so tests can show the tag check stops them.
    #[cfg(feature = "fault-injection")]
    pub fn redirect_for_fault_injection(&mut self, index: usize, target: PageRef) {
        self.pages[index] = target;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::admission::Limits;
    use crate::ids::{RequestId, TenantId};

    /// Two layers, one head of four, two tokens a page.
    pub(crate) const GEO: KvGeometry = KvGeometry {
        layers: 2,
        kv_heads: 1,
        head_dim: 4,
        page_size: 2,
        dtype: KvDtype::F32,
    };

    pub(crate) fn owner(t: u64, r: u64) -> Owner {
        Owner {
            tenant: TenantId::new(t),
            request: RequestId::new(r),
        }
    }

    pub(crate) fn limits(pool: &KvPool) -> Limits {
        Limits {
            context_window: 64,
            pool_tokens: pool.capacity_tokens(),
            page_size: pool.geometry().page_size,
        }
    }

    #[test]
    fn foreign_and_stale_pages_are_refused() {
        let mut pool = KvPool::new(GEO, 4, false);
        let a = limits(&pool).admit(owner(1, 1), 3, 1, ()).unwrap();
        let table_a = pool.allocate(&a).unwrap();
        pool.write_token(&table_a, 0, 0, &[1.0; 4], &[2.0; 4])
            .unwrap();
        let b = owner(2, 2);
        let stolen = table_a.pages()[0];
        let err = pool.reader().page(0, b, stolen).unwrap_err();
        assert_eq!(err.page, stolen.page());

        // After release and reallocation the old generation is stale.
        pool.release(table_a);
        let a2 = limits(&pool).admit(owner(1, 3), 7, 1, ()).unwrap();
        let table_a2 = pool.allocate(&a2).unwrap();
        let reused = *table_a2
            .pages()
            .iter()
            .find(|r| r.page() == stolen.page())
            .unwrap();
        assert_ne!(reused.generation(), stolen.generation());
        assert!(pool.reader().page(0, owner(1, 1), stolen).is_err());
        assert!(pool.reader().page(0, owner(1, 3), reused).is_ok());
    }

    #[test]
    fn allocation_is_all_or_nothing_and_quarantine_removes_pages() {
        let mut pool = KvPool::new(GEO, 3, true);
        let big = limits(&pool).admit(owner(1, 1), 5, 1, ()).unwrap();
        assert_eq!(big.pages(), 3);
        let t = pool.allocate(&big).unwrap();
        let again = limits(&pool).admit(owner(1, 2), 1, 1, ()).unwrap();
        assert_eq!(
            pool.allocate(&again).unwrap_err(),
            PoolExhausted { needed: 1, free: 0 }
        );
        let victim = t.pages()[1];
        pool.quarantine(&OwnerViolation {
            page: victim.page(),
            owner: owner(2, 9),
        });
        // The rightful owner keeps its page until it releases it.
        assert!(pool.reader().page(0, owner(1, 1), victim).is_ok());
        pool.release(t);
        let c = pool.counters();
        assert_eq!(
            (c.free_pages, c.quarantined_pages, c.allocated_pages),
            (2, 1, 0)
        );
        assert_eq!(c.owner_violations, 1);
        assert_eq!(pool.tag(victim.page()), Some(PageTag::Quarantined));
    }
}
