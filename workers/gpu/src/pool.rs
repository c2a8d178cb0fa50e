//! The GPU KV pool's bookkeeping, kept on the host and mirrored to the
//! device after every change: each physical page's owner tag (tenant,
//! request, generation), the free list, and the pages waiting for their
//! scrub. The same rules as the CPU pool (`bulkhead_kv`): every allocation
//! takes a fresh generation, so a table kept past its release matches no
//! page; a released page is tagged free at once and goes back to the free
//! list only after the device has zeroed it ([`PageBook::scrubbed`]).
//!
//! The kernels compare a page's tag with the sequence's table entry
//! before reading or writing any byte of it; this module decides what the
//! tags say.

use bulkhead_kv::TenantId;

/// A page's owner tag as the device holds it: three parallel arrays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tag {
    /// The owning tenant (0: free).
    pub tenant: u64,
    /// The owning request, numbered by the pool (0: free).
    pub request: u64,
    /// The allocation's generation (0: free).
    pub generation: u64,
}

impl Tag {
    const FREE: Tag = Tag {
        tenant: 0,
        request: 0,
        generation: 0,
    };
}

/// The pages of one allocation, in token order, and what each entry
/// expects its page's tag to say. Not `Clone`: one table per allocation.
#[derive(Debug, PartialEq, Eq)]
pub struct DeviceTable {
    /// The owner every page must carry.
    pub tenant: u64,
    /// The request every page must carry.
    pub request: u64,
    /// Physical pages.
    pub pages: Vec<u32>,
    /// The generation each page was allocated at.
    pub generations: Vec<u64>,
}

/// Why an allocation got no pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the GPU KV pool has {free} free pages, {wanted} were asked for")]
pub struct PoolFull {
    /// Pages asked for.
    pub wanted: usize,
    /// Pages free.
    pub free: usize,
}

/// Owner tags, free list and scrub queue of a pool of `pages` pages.
#[derive(Debug)]
pub struct PageBook {
    tags: Vec<Tag>,
    free: Vec<u32>,
    next_generation: u64,
    next_request: u64,
}

impl PageBook {
    /// A pool of `pages` free pages.
    ///
    /// # Panics
    /// If `pages` does not fit a `u32` page index.
    pub fn new(pages: usize) -> Self {
        let n = u32::try_from(pages).expect("GPU pool page count fits u32");
        PageBook {
            tags: vec![Tag::FREE; pages],
            // Pop from the end: the lowest pages first.
            free: (0..n).rev().collect(),
            next_generation: 1,
            next_request: 1,
        }
    }

    /// Every page's tag, by page index (what the device mirrors).
    pub fn tags(&self) -> &[Tag] {
        &self.tags
    }

    /// Pages free now.
    pub fn free_pages(&self) -> usize {
        self.free.len()
    }

    /// `pages` pages for a new request of `tenant`, all or none, each
    /// tagged with the request and a generation never used before.
    pub fn allocate(&mut self, tenant: TenantId, pages: usize) -> Result<DeviceTable, PoolFull> {
        if pages > self.free.len() {
            return Err(PoolFull {
                wanted: pages,
                free: self.free.len(),
            });
        }
        let request = self.next_request;
        self.next_request += 1;
        let mut table = DeviceTable {
            tenant: tenant.get(),
            request,
            pages: Vec::with_capacity(pages),
            generations: Vec::with_capacity(pages),
        };
        for _ in 0..pages {
            let Some(page) = self.free.pop() else {
                unreachable!("counted above")
            };
            let generation = self.next_generation;
            self.next_generation += 1;
            self.tags[page as usize] = Tag {
                tenant: table.tenant,
                request,
                generation,
            };
            table.pages.push(page);
            table.generations.push(generation);
        }
        Ok(table)
    }

    /// Ends `table`'s allocation: its pages are tagged free at once (no
    /// kernel reads them for anyone from here) and returned, to be
    /// scrubbed on the device before [`PageBook::scrubbed`] frees them.
    /// Only the pages the table still holds (their tag is its own) come
    /// back: a stale table frees, and so scrubs, nobody else's page.
    // By value on purpose: the table is gone once its allocation ends.
    #[allow(clippy::needless_pass_by_value)]
    pub fn release(&mut self, table: DeviceTable) -> Vec<u32> {
        let mut freed = Vec::with_capacity(table.pages.len());
        for (&p, &g) in table.pages.iter().zip(&table.generations) {
            let tag = &mut self.tags[p as usize];
            if tag.generation == g && tag.tenant == table.tenant && tag.request == table.request {
                *tag = Tag::FREE;
                freed.push(p);
            }
        }
        freed
    }

    /// `pages`, zeroed on the device, can be allocated again.
    pub fn scrubbed(&mut self, pages: Vec<u32>) {
        self.free.extend(pages);
    }

    /// Testing only: tags `page` as `tag`, as a fault that crossed a
    /// mapping would (the kernels must then refuse the page).
    pub fn plant_tag(&mut self, page: u32, tag: Tag) {
        self.tags[page as usize] = tag;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(book: &PageBook, t: &DeviceTable, i: usize) -> bool {
        let tag = book.tags()[t.pages[i] as usize];
        tag.tenant == t.tenant && tag.request == t.request && tag.generation == t.generations[i]
    }

    /// What a holder that kept a table past its release would have.
    fn kept(t: &DeviceTable) -> DeviceTable {
        DeviceTable {
            tenant: t.tenant,
            request: t.request,
            pages: t.pages.clone(),
            generations: t.generations.clone(),
        }
    }

    #[test]
    fn every_allocation_takes_fresh_generations_and_a_released_table_matches_nothing() {
        let mut book = PageBook::new(4);
        let a = book.allocate(TenantId::new(7), 2).unwrap();
        assert!((0..2).all(|i| matches(&book, &a, i)));
        let stale = kept(&a);
        let pages = book.release(a);
        assert_eq!(book.free_pages(), 2, "not free before the scrub");
        book.scrubbed(pages);
        assert_eq!(book.free_pages(), 4);
        let b = book.allocate(TenantId::new(7), 4).unwrap();
        assert!((0..4).all(|i| matches(&book, &b, i)));
        // The same tenant, the same physical pages: the old table's
        // entries still match no page.
        assert!((0..2).all(|i| !matches(&book, &stale, i)));
        assert_ne!(b.request, stale.request);
    }

    #[test]
    fn an_allocation_is_all_or_nothing() {
        let mut book = PageBook::new(3);
        let _a = book.allocate(TenantId::new(1), 2).unwrap();
        assert_eq!(
            book.allocate(TenantId::new(2), 2),
            Err(PoolFull { wanted: 2, free: 1 })
        );
        assert_eq!(book.free_pages(), 1);
    }

    #[test]
    fn releasing_a_table_twice_does_not_free_its_pages_new_owner() {
        let mut book = PageBook::new(1);
        let a = book.allocate(TenantId::new(1), 1).unwrap();
        let copy = kept(&a);
        let pages = book.release(a);
        book.scrubbed(pages);
        let b = book.allocate(TenantId::new(2), 1).unwrap();
        assert_eq!(book.release(copy), Vec::<u32>::new(), "nothing to scrub");
        assert!(matches(&book, &b, 0), "B's page keeps B's tag");
        assert_eq!(book.free_pages(), 0, "B's page is not free");
    }
}
