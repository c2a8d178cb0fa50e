//! KV transfers on the pool side: landing slots, lending a page's memory
//! out of the pool, and taking it back.
//!
//! A page's memory is one contiguous block in the pool's own page-major
//! layout (`[layer][keys | values]`, little-endian); that block is what
//! travels. A landing page (`PageTag::Receiving`) becomes readable only
//! through [`KvPool::commit_received`], once the whole transfer is verified.
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

#[cfg(target_endian = "big")]
compile_error!("KV page bytes are little-endian on the wire; big-endian hosts are not supported");

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

    /// Makes every landing slot of `transfer` in `table` an ordinary owned,
    /// readable page. Call only after the whole transfer was verified.
    pub fn commit_received(&mut self, table: &PageTable, transfer: TransferId) {
        for r in &table.pages {
            if self.lands(table, transfer, *r) {
                self.tags[r.page.index()] = PageTag::Owned {
                    owner: table.owner,
                    generation: r.generation,
                };
            }
        }
    }

    fn lands(&self, table: &PageTable, transfer: TransferId, r: PageRef) -> bool {
        self.tags.get(r.page.index())
            == Some(&PageTag::Receiving {
                owner: table.owner,
                generation: r.generation,
                transfer,
            })
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
    use crate::ids::TransferId;
    use crate::pool::tests::{GEO, limits, owner};
    use crate::pool::{Home, KvDtype, KvGeometry, KvPool, LentPage, OwnerChecks, PageTag};
    use std::sync::{Arc, Mutex};

    const F16: KvGeometry = KvGeometry {
        dtype: KvDtype::F16,
        ..GEO
    };

    /// A home that collects returned pages.
    fn collector() -> (Home, Arc<Mutex<Vec<LentPage>>>) {
        let returned: Arc<Mutex<Vec<LentPage>>> = Arc::default();
        let sink = Arc::clone(&returned);
        (Home::new(move |p| sink.lock().unwrap().push(p)), returned)
    }

    #[test]
    fn pages_travel_whole_and_land_unreadable_until_committed() {
        let mut src = KvPool::new(F16, 4, false);
        let a = limits(&src).admit(owner(1, 1), 3, 1, ()).unwrap();
        let st = src.allocate(&a.prompt_only()).unwrap();
        assert_eq!(st.pages().len(), 2);
        for pos in 0..3 {
            for layer in 0..2 {
                let x = (pos * 10 + layer) as f32;
                src.write_token(&st, layer, pos, &[x; 4], &[-x; 4]).unwrap();
            }
        }
        let mut dst = KvPool::new(F16, 4, false);
        let t = TransferId::new(77);
        let d = limits(&dst).admit(owner(5, 9), 3, 1, ()).unwrap();
        let dt = dst.allocate_receiving(&d, t).unwrap();
        assert_eq!(dst.counters().receiving_pages, 2);
        // Landing pages refuse reads and token writes, even with checks off.
        assert!(dst.reader().page(0, dt.owner(), dt.pages()[0]).is_err());
        assert!(dst.write_token(&dt, 0, 0, &[0.0; 4], &[0.0; 4]).is_err());
        dst.set_owner_checks(OwnerChecks::OffForBenchmark);
        assert!(dst.reader().page(0, dt.owner(), dt.pages()[0]).is_err());
        dst.set_owner_checks(OwnerChecks::Enforced);
        // A stranger cannot borrow the source pages.
        assert!(
            src.lend_source(owner(2, 2), st.pages()[0], 0, None)
                .is_err()
        );

        let sent: Vec<LentPage> = (0..2)
            .map(|i| src.lend_source(st.owner(), st.pages()[i], i, None).unwrap())
            .collect();
        // Another transfer's grant lends nothing.
        assert!(dst.lend_landing(&dt, TransferId::new(78), None).is_empty());
        let mut landing = dst.lend_landing(&dt, t, None);
        assert_eq!(landing.len(), 2);
        for (l, s) in landing.iter_mut().zip(&sent) {
            assert_eq!(l.slot(), s.slot());
            l.bytes_mut().copy_from_slice(s.bytes());
        }
        assert!(!dst.landing_home(&dt, t));
        for p in landing {
            dst.restore(p);
        }
        assert!(dst.landing_home(&dt, t));
        // Home but not committed: still unreadable.
        assert!(dst.reader().page(0, dt.owner(), dt.pages()[1]).is_err());
        dst.commit_received(&dt, t);
        assert!(matches!(
            dst.tag(dt.pages()[1].page()),
            Some(PageTag::Owned { .. })
        ));
        for layer in 0..2 {
            let got = dst.reader().page(layer, dt.owner(), dt.pages()[1]).unwrap();
            // Token 2 is slot 0 of page 1: its first key element.
            let want = half::f16::from_f32((20 + layer) as f32);
            match got.keys(0) {
                crate::KvData::F16(k) => assert_eq!(k[0], want),
                crate::KvData::F32(_) => unreachable!(),
            }
        }
        for p in sent {
            src.restore(p);
        }
        dst.release(dt);
        src.release(st);
        for p in [&src, &dst] {
            let c = p.counters();
            assert_eq!((c.free_pages, c.receiving_pages, c.lent_pages), (4, 0, 0));
        }
    }

    #[test]
    fn a_page_released_while_lent_is_freed_only_when_it_comes_back() {
        let mut pool = KvPool::new(F16, 3, false);
        let t = TransferId::new(5);
        let a = limits(&pool).admit(owner(1, 1), 3, 1, ()).unwrap();
        let table = pool.allocate_receiving(&a, t).unwrap();
        let (home, returned) = collector();
        let mut lent = pool.lend_landing(&table, t, Some(&home));
        assert_eq!(lent.len(), 2);
        lent[1].bytes_mut().fill(9);
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
