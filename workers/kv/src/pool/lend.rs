//! Lending a page's memory out of the pool for a transfer, and taking it
//! back.
//!
//! A KV transfer moves a page's memory, not a copy: the prefill side lends
//! its finished prompt pages to the sender, and the decode side lends its
//! landing pages to the receiver, which reads the wire straight into them.
//! While lent, the pool holds no memory for the page, so nobody can read it
//! through the pool and it cannot be reallocated: a page released while lent
//! is freed only when its memory comes back. "Release only after in-flight
//! writes drain" is therefore ownership, not a timer.
//!
//! A [`LentPage`] returns itself when dropped, through its [`Home`]: the
//! pool's owner (the engine thread) gets it back on its command channel.

use super::{KvPool, PageRef, PageTable, PageTag, Planes, Whereabouts};
use crate::ids::{Generation, Owner, PageId, TransferId};
use crate::pool::OwnerViolation;
use half::f16;
use std::sync::Arc;

/// Where a dropped [`LentPage`] goes: back to the pool's owner.
#[derive(Clone)]
pub struct Home(Arc<dyn Fn(LentPage) + Send + Sync>);

impl Home {
    /// A home that hands returned pages to `f`.
    pub fn new(f: impl Fn(LentPage) + Send + Sync + 'static) -> Self {
        Home(Arc::new(f))
    }
}

impl std::fmt::Debug for Home {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Home")
    }
}

/// The memory of one page, out of its pool.
pub struct LentPage {
    page: PageId,
    generation: Generation,
    slot: usize,
    mem: PageMem,
    home: Option<Home>,
}

#[derive(Debug)]
pub(crate) enum PageMem {
    F16(Box<[f16]>),
    F32(Box<[f32]>),
}

impl std::fmt::Debug for LentPage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LentPage")
            .field("page", &self.page)
            .field("generation", &self.generation)
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

impl LentPage {
    /// The page's index in its sequence (the transfer slot).
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// The generation the page was allocated at.
    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// The page's bytes, in the transfer's wire order.
    pub fn bytes(&self) -> &[u8] {
        match &self.mem {
            PageMem::F16(m) => bytemuck::cast_slice(m),
            PageMem::F32(m) => bytemuck::cast_slice(m),
        }
    }

    /// The page's bytes, writable (a landing page being received).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.mem {
            PageMem::F16(m) => bytemuck::cast_slice_mut(m),
            PageMem::F32(m) => bytemuck::cast_slice_mut(m),
        }
    }
}

impl Drop for LentPage {
    fn drop(&mut self) {
        if let Some(home) = self.home.take() {
            let mem = std::mem::replace(&mut self.mem, PageMem::F16(Box::default()));
            (home.0)(LentPage {
                page: self.page,
                generation: self.generation,
                slot: self.slot,
                mem,
                home: None,
            });
        }
    }
}

impl KvPool {
    /// Lends page `r` (slot `slot` of a transfer) if `owner` owns it: the
    /// prefill side's finished prompt pages.
    pub fn lend_source(
        &mut self,
        owner: Owner,
        r: PageRef,
        slot: usize,
        home: Option<Home>,
    ) -> Result<LentPage, OwnerViolation> {
        self.check(owner, r)?;
        Ok(self.take(r, slot, home))
    }

    /// Lends every landing page of `transfer` in `table`, in slot order.
    pub fn lend_landing(
        &mut self,
        table: &PageTable,
        transfer: TransferId,
        home: Option<&Home>,
    ) -> Vec<LentPage> {
        let mut out = Vec::new();
        for (slot, r) in table.pages.iter().enumerate() {
            if self.lands(table, transfer, *r)
                && self.whereabouts[r.page.index()] == Whereabouts::Home
            {
                out.push(self.take(*r, slot, home.cloned()));
            }
        }
        out
    }

    /// Takes a lent page's memory back. A page released while it was out
    /// is freed now (zeroed if the release asked for it).
    pub fn restore(&mut self, mut page: LentPage) {
        page.home = None;
        let i = page.page.index();
        let mem = std::mem::replace(&mut page.mem, PageMem::F16(Box::default()));
        match (&mut self.planes, mem) {
            (Planes::F16(pages), PageMem::F16(m)) if pages[i].is_empty() => pages[i] = m,
            (Planes::F32(pages), PageMem::F32(m)) if pages[i].is_empty() => pages[i] = m,
            _ => return,
        }
        match std::mem::replace(&mut self.whereabouts[i], Whereabouts::Home) {
            Whereabouts::LentThenFree { scrub } => self.free_page(page.page, scrub),
            Whereabouts::Home | Whereabouts::Lent => {}
        }
    }

    /// Whether every landing page of `transfer` in `table` is home.
    pub fn landing_home(&self, table: &PageTable, transfer: TransferId) -> bool {
        table.pages.iter().all(|r| {
            !self.lands(table, transfer, *r)
                || self.whereabouts[r.page.index()] == Whereabouts::Home
        })
    }

    fn take(&mut self, r: PageRef, slot: usize, home: Option<Home>) -> LentPage {
        let i = r.page.index();
        self.whereabouts[i] = Whereabouts::Lent;
        let mem = match &mut self.planes {
            Planes::F16(pages) => PageMem::F16(std::mem::take(&mut pages[i])),
            Planes::F32(pages) => PageMem::F32(std::mem::take(&mut pages[i])),
        };
        debug_assert!(!matches!(self.tags[i], PageTag::Free));
        LentPage {
            page: r.page,
            generation: r.generation,
            slot,
            mem,
            home,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::admission::Limits;
    use crate::ids::{Owner, RequestId, TenantId, TransferId};
    use crate::pool::{KvDtype, KvGeometry, KvPool, LentPage};
    use std::sync::{Arc, Mutex};

    const GEO: KvGeometry = KvGeometry {
        layers: 2,
        kv_heads: 1,
        head_dim: 4,
        page_size: 2,
        dtype: KvDtype::F16,
    };

    #[test]
    fn a_page_released_while_lent_is_freed_only_when_it_comes_back() {
        let mut pool = KvPool::new(GEO, 3, false);
        let limits = Limits {
            context_window: 64,
            pool_tokens: pool.capacity_tokens(),
            page_size: 2,
        };
        let owner = Owner {
            tenant: TenantId::new(1),
            request: RequestId::new(1),
        };
        let t = TransferId::new(5);
        let a = limits.admit(owner, 3, 1, ()).unwrap();
        let table = pool.allocate_receiving(&a, t).unwrap();
        let returned: Arc<Mutex<Vec<LentPage>>> = Arc::default();
        let sink = Arc::clone(&returned);
        let home = super::Home::new(move |p| sink.lock().unwrap().push(p));
        let mut lent = pool.lend_landing(&table, t, Some(&home));
        assert_eq!(lent.len(), 2);
        lent[1].bytes_mut().fill(9);
        // Lent landing pages are unreadable and cannot be written through the pool.
        assert!(pool.reader().page(0, owner, table.pages()[1]).is_err());
        assert!(!pool.landing_home(&table, t));
        // The request ends while the memory is out: nothing is freed yet.
        pool.release_scrubbed(table);
        let c = pool.counters();
        assert_eq!((c.free_pages, c.lent_pages, c.allocated_pages), (1, 2, 2));
        // Dropping the lent pages sends them home; restoring frees them.
        drop(lent);
        let back: Vec<LentPage> = std::mem::take(&mut *returned.lock().unwrap());
        assert_eq!(back.len(), 2);
        for p in back {
            pool.restore(p);
        }
        let c = pool.counters();
        assert_eq!((c.free_pages, c.lent_pages, c.allocated_pages), (3, 0, 0));
    }
}
