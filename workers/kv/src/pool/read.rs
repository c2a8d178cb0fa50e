//! Reading pages: every read is checked against the page's owner tag and
//! generation first ([`KvPool::reader`], [`PageReader::page`]), and a
//! mismatch is refused and counted, never served.

use super::*;

impl KvPool {
    /// The table's entry `index`, or a refusal naming no real page (so
    /// nothing is quarantined for it) when the index is out of range.
    pub(super) fn entry(table: &PageTable, index: usize) -> Result<PageRef, OwnerViolation> {
        table.pages.get(index).copied().ok_or(OwnerViolation {
            page: PageId::NONE,
            owner: table.owner,
        })
    }

    /// The raw bytes of entry `index` of `table`, if readable: for tests
    /// that look for stale bytes in committed pages.
    #[cfg(feature = "test-hooks")]
    pub fn page_bytes_for_test(&self, table: &PageTable, index: usize) -> Option<Vec<u8>> {
        let r = Self::entry(table, index).ok()?;
        self.check_table_read(table, r, None).ok()?;
        Some(match &self.planes {
            Planes::F16(p) => bytemuck::cast_slice(&p[r.page.index()]).to_vec(),
            Planes::F32(p) => bytemuck::cast_slice(&p[r.page.index()]).to_vec(),
        })
    }

    /// Shared read access for attention.
    pub fn reader(&self) -> PageReader<'_> {
        PageReader { pool: self }
    }

    pub(super) fn tag_matches(&self, owner: Owner, r: PageRef) -> bool {
        self.tags.get(r.page.index())
            == Some(&PageTag::Owned {
                owner,
                generation: r.generation,
            })
    }

    /// Whether `owner` holds `r` in any state (owned or receiving).
    pub(super) fn held_by(&self, owner: Owner, r: PageRef) -> bool {
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

    /// Whether `owner` may write `r` (or lend it): the tag matches and the
    /// memory is home.
    pub(super) fn check_access(&self, owner: Owner, r: PageRef) -> Result<(), OwnerViolation> {
        let home = self.whereabouts.get(r.page.index()) == Some(&Whereabouts::Home);
        #[cfg(feature = "test-hooks")]
        let unchecked = self.checks == OwnerChecks::OffForBenchmark
            && matches!(self.tags.get(r.page.index()), Some(PageTag::Owned { .. }));
        #[cfg(not(feature = "test-hooks"))]
        let unchecked = false;
        if home && (unchecked || self.tag_matches(owner, r)) {
            Ok(())
        } else {
            Err(OwnerViolation {
                page: r.page,
                owner,
            })
        }
    }

    /// Whether `owner` may read `layer` of `r` (all layers: `None`): as
    /// [`Self::check_access`], and no byte of a previous owner is left
    /// there. A page not written that far is refused without naming it
    /// (it is the owner's own: nothing to quarantine).
    /// Whether `table` may read `layer` of `r`: a cached page only in the
    /// table's scope and at the entry's generation; any other page as
    /// [`Self::check_read`] says.
    pub(super) fn check_table_read(
        &self,
        table: &PageTable,
        r: PageRef,
        layer: Option<usize>,
    ) -> Result<(), OwnerViolation> {
        if let Some(PageTag::Cached {
            namespace,
            generation,
        }) = self.tags.get(r.page.index())
        {
            let home = self.whereabouts[r.page.index()] == Whereabouts::Home;
            return if home
                && *generation == r.generation
                && table.scope.is_some_and(|s| s.may_read(*namespace))
            {
                Ok(())
            } else {
                Err(OwnerViolation {
                    page: r.page,
                    owner: table.owner,
                })
            };
        }
        self.check_read(table.owner, r, layer)
    }

    pub(super) fn check_read(
        &self,
        owner: Owner,
        r: PageRef,
        layer: Option<usize>,
    ) -> Result<(), OwnerViolation> {
        self.check_access(owner, r)?;
        let readable = match (self.fill[r.page.index()], layer) {
            (Fill::Clean, _) => true,
            (Fill::Writing { layer: done, .. }, Some(l)) => l < usize::from(done),
            _ => false,
        };
        if readable {
            Ok(())
        } else {
            Err(OwnerViolation {
                page: PageId::NONE,
                owner,
            })
        }
    }
}

impl<'a> PageReader<'a> {
    /// The keys and values in `layer` of entry `index` of `table`, if the
    /// table's sequence owns that page at the entry's generation and the
    /// page holds only its bytes. Otherwise the data is not returned. The
    /// reader names its own table: there is no way to ask for a page by
    /// owner or by physical id.
    pub fn page(
        &self,
        table: &PageTable,
        index: usize,
        layer: usize,
    ) -> Result<PageView<'a>, OwnerViolation> {
        let r = KvPool::entry(table, index)?;
        self.pool.check_table_read(table, r, Some(layer))?;
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
