//! KV transfers on the pool side: landing slots, lending a page's memory
//! out of the pool, and taking it back.
//!
//! A page's memory is one contiguous block in the pool's own page-major
//! layout (`[layer][keys | values]`, little-endian); that block is what
//! travels. A landing page (`PageTag::Receiving`) becomes readable only
//! through [`KvPool::commit_received`], once the whole transfer is verified
//! and every byte of it was written by the transfer.
//!
//! A KV transfer moves a page's memory, not a copy: the prefill side lends
//! its finished prompt pages to the sender, and the decode side lends its
//! landing pages to the receiver, which reads the wire straight into them.
//! While lent, the pool holds no memory for the page, so nobody can read it
//! through the pool and it cannot be reallocated: a page released while lent
//! is freed only when its memory comes back. "Release only after in-flight
//! writes drain" is therefore ownership, not a timer.
//!
//! A source page is lent only when clean (no byte of a previous owner in
//! it), so nothing stale goes on the wire. A landing page still holds
//! whatever its last owner left: it is lent write-only ([`bytes::BufMut`],
//! whose chunks cannot be read in safe code), and [`LentPage::bytes`] shows
//! only the prefix the transfer has written.
//!
//! A [`LentPage`] returns itself when dropped, through its [`Home`]: the
//! pool's owner (the engine thread) gets it back on its command channel.

use super::{Fill, KvPool, PageRef, PageTable, PageTag, Planes, Whereabouts};
use crate::admission::PoolId;
use crate::ids::{Generation, PageId, TransferId};
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

/// The memory of one page, out of its pool: a source page (readable, all
/// of it the owner's) or a landing page (write-only until written).
pub struct LentPage {
    pool: PoolId,
    page: PageId,
    generation: Generation,
    slot: usize,
    mem: PageMem,
    /// `None` for a source page; for a landing page, how many leading
    /// bytes its transfer has written.
    written: Option<usize>,
    home: Option<Home>,
}

pub(crate) enum PageMem {
    F16(Box<[f16]>),
    F32(Box<[f32]>),
}

impl std::fmt::Debug for PageMem {
    // Never the bytes: a debug line must not become a way out for KV.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PageMem({} bytes)", self.bytes().len())
    }
}

impl std::fmt::Debug for LentPage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LentPage")
            .field("page", &self.page)
            .field("generation", &self.generation)
            .field("slot", &self.slot)
            .field("written", &self.written)
            .finish_non_exhaustive()
    }
}

impl PageMem {
    fn bytes(&self) -> &[u8] {
        match self {
            PageMem::F16(m) => bytemuck::cast_slice(m),
            PageMem::F32(m) => bytemuck::cast_slice(m),
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            PageMem::F16(m) => bytemuck::cast_slice_mut(m),
            PageMem::F32(m) => bytemuck::cast_slice_mut(m),
        }
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

    /// The page's bytes in the transfer's wire order: all of a source
    /// page; of a landing page, only what its transfer has written so far.
    pub fn bytes(&self) -> &[u8] {
        let all = self.mem.bytes();
        match self.written {
            None => all,
            Some(n) => &all[..n],
        }
    }

    /// Bytes still to be written into a landing page (0 for a source page).
    pub fn unwritten(&self) -> usize {
        match self.written {
            None => 0,
            Some(n) => self.mem.bytes().len() - n,
        }
    }

    /// Whether this is a landing page its transfer has written whole.
    pub fn is_written(&self) -> bool {
        self.written == Some(self.mem.bytes().len())
    }
}

// A landing page takes the wire's bytes in order, without ever showing
// what was in it before: `chunk_mut` hands out an `UninitSlice`, which safe
// code can write but not read. The memory is always initialised (it is a
// real page), so advancing over written bytes upholds `BufMut`'s contract.
#[allow(unsafe_code)]
// SAFETY: `chunk_mut` returns exactly the `remaining_mut` unwritten bytes,
// and `advance_mut` moves past at most those; the memory behind them is
// initialised page memory. (A caller that advanced over bytes it never
// wrote would see old contents through `bytes`: `advance_mut` is `unsafe`
// for that reason, and the only callers, tokio's `read_buf` and
// `put_slice`, advance over what they wrote.)
unsafe impl bytes::BufMut for LentPage {
    fn remaining_mut(&self) -> usize {
        self.unwritten()
    }

    /// # Safety
    /// The caller wrote the next `cnt` bytes of [`chunk_mut`](Self::chunk_mut)
    /// (`BufMut`'s contract); more than the page has left panics.
    #[allow(unsafe_code)]
    unsafe fn advance_mut(&mut self, cnt: usize) {
        assert!(
            cnt <= self.unwritten(),
            "advance past the end of a landing page"
        );
        if let Some(n) = &mut self.written {
            *n += cnt;
        }
    }

    fn chunk_mut(&mut self) -> &mut bytes::buf::UninitSlice {
        let from = self.written.unwrap_or(usize::MAX);
        let all = self.mem.bytes_mut();
        let from = from.min(all.len());
        bytes::buf::UninitSlice::new(&mut all[from..])
    }
}

impl Drop for LentPage {
    fn drop(&mut self) {
        if let Some(home) = self.home.take() {
            let mem = std::mem::replace(&mut self.mem, PageMem::F16(Box::default()));
            (home.0)(LentPage {
                pool: self.pool,
                page: self.page,
                generation: self.generation,
                slot: self.slot,
                mem,
                written: self.written,
                home: None,
            });
        }
    }
}

impl KvPool {
    /// Lends entry `index` of `table` (slot `index` of a transfer): the
    /// prefill side's finished prompt pages. Refused unless the table's
    /// sequence owns the page and the page holds only its bytes.
    pub fn lend_source(
        &mut self,
        table: &PageTable,
        index: usize,
        home: Option<Home>,
    ) -> Result<LentPage, OwnerViolation> {
        let r = Self::entry(table, index)?;
        self.check_read(table.owner, r, None)?;
        Ok(self.take(r, index, None, home))
    }

    /// Lends every landing page of `transfer` in `table`, in slot order,
    /// write-only.
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
                out.push(self.take(*r, slot, Some(0), home.cloned()));
            }
        }
        out
    }

    /// Takes a lent page's memory back. A page released while it was out
    /// is freed now (zeroed if the release asked for it). A page that was
    /// not lent by this pool at this generation is dropped, never installed.
    pub fn restore(&mut self, mut page: LentPage) {
        page.home = None;
        let i = page.page.index();
        let ours = page.pool == self.id
            && self
                .whereabouts
                .get(i)
                .is_some_and(|w| *w != Whereabouts::Home)
            && matches!(
                self.tags[i],
                PageTag::Owned { generation, .. } | PageTag::Receiving { generation, .. }
                    if generation == page.generation
            );
        if !ours {
            return;
        }
        let whole = page.is_written();
        let landing = page.written.is_some();
        let mem = std::mem::replace(&mut page.mem, PageMem::F16(Box::default()));
        match (&mut self.planes, mem) {
            (Planes::F16(pages), PageMem::F16(m)) if pages[i].is_empty() => pages[i] = m,
            (Planes::F32(pages), PageMem::F32(m)) if pages[i].is_empty() => pages[i] = m,
            _ => return,
        }
        if landing {
            // Clean only if the transfer overwrote every byte.
            self.fill[i] = if whole { Fill::Clean } else { Fill::Stale };
        }
        match std::mem::replace(&mut self.whereabouts[i], Whereabouts::Home) {
            Whereabouts::LentThenFree { scrub } => self.free_page(page.page, scrub),
            Whereabouts::Home | Whereabouts::Lent => {}
        }
    }

    /// Makes every landing slot of `transfer` in `table` an ordinary owned,
    /// readable page. Call only after the whole transfer was verified.
    /// Refused (nothing changes) unless every landing page is home and was
    /// written whole by the transfer.
    pub fn commit_received(&mut self, table: &PageTable, transfer: TransferId) -> bool {
        let complete = table.pages.iter().all(|r| {
            !self.lands(table, transfer, *r)
                || (self.whereabouts[r.page.index()] == Whereabouts::Home
                    && self.fill[r.page.index()] == Fill::Clean)
        });
        if !complete {
            return false;
        }
        for r in &table.pages {
            if self.lands(table, transfer, *r) {
                self.tags[r.page.index()] = PageTag::Owned {
                    owner: table.owner,
                    generation: r.generation,
                };
            }
        }
        true
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

    fn take(
        &mut self,
        r: PageRef,
        slot: usize,
        written: Option<usize>,
        home: Option<Home>,
    ) -> LentPage {
        let i = r.page.index();
        self.whereabouts[i] = Whereabouts::Lent;
        if written.is_some() {
            // A landing page is clean again only once written whole.
            self.fill[i] = Fill::Stale;
        }
        let mem = match &mut self.planes {
            Planes::F16(pages) => PageMem::F16(std::mem::take(&mut pages[i])),
            Planes::F32(pages) => PageMem::F32(std::mem::take(&mut pages[i])),
        };
        debug_assert!(!matches!(self.tags[i], PageTag::Free));
        LentPage {
            pool: self.id,
            page: r.page,
            generation: r.generation,
            slot,
            mem,
            written,
            home,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::ids::TransferId;
    use crate::pool::tests::{GEO, limits, receiving, tenant};
    use crate::pool::{Home, KvDtype, KvGeometry, KvPool, LentPage, PageTag};
    use bytes::BufMut;
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
        let a = limits(&src).admit(tenant(1), 3, 1, ()).unwrap();
        let st = src.allocate(&a.prompt_only()).unwrap();
        assert_eq!(st.len(), 2);
        src.begin_write(&st, 0, 3).unwrap();
        for pos in 0..3 {
            for layer in 0..2 {
                let x = (pos * 10 + layer) as f32;
                src.write_token(&st, layer, pos, &[x; 4], &[-x; 4]).unwrap();
            }
        }
        let mut dst = KvPool::new(F16, 4, false);
        let t = TransferId::new(77);
        let d = limits(&dst).admit(tenant(5), 3, 1, ()).unwrap();
        let dt = dst.allocate_receiving(&d, t).unwrap();
        assert_eq!(dst.counters().receiving_pages, 2);
        // Landing pages refuse reads and token writes.
        assert!(dst.reader().page(&dt, 0, 0).is_err());
        assert!(dst.write_token(&dt, 0, 0, &[0.0; 4], &[0.0; 4]).is_err());

        let sent: Vec<LentPage> = (0..2)
            .map(|i| src.lend_source(&st, i, None).unwrap())
            .collect();
        // Another transfer's grant lends nothing.
        assert!(dst.lend_landing(&dt, TransferId::new(78), None).is_empty());
        let mut landing = dst.lend_landing(&dt, t, None);
        assert_eq!(landing.len(), 2);
        for (l, s) in landing.iter_mut().zip(&sent) {
            assert_eq!(l.slot(), s.slot());
            // Nothing of the page's past shows before it is written.
            assert!(l.bytes().is_empty());
            assert_eq!(l.remaining_mut(), s.bytes().len());
            l.put_slice(s.bytes());
            assert!(l.is_written());
            assert_eq!(l.bytes(), s.bytes());
        }
        assert!(!dst.landing_home(&dt, t));
        for p in landing {
            dst.restore(p);
        }
        assert!(dst.landing_home(&dt, t));
        // Home but not committed: still unreadable.
        assert!(dst.reader().page(&dt, 1, 0).is_err());
        assert!(dst.commit_received(&dt, t));
        assert!(matches!(
            dst.tag(dt.pages[1].page),
            Some(PageTag::Owned { .. })
        ));
        for layer in 0..2 {
            let got = dst.reader().page(&dt, 1, layer).unwrap();
            // Token 2 is slot 0 of page 1: its first key element; slot 1
            // was never written by the owner, so it is zero, not stale.
            let want = half::f16::from_f32((20 + layer) as f32);
            match got.keys(0) {
                crate::KvData::F16(k) => assert_eq!((k[0], k[1]), (want, half::f16::ZERO)),
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
    fn a_landing_page_written_in_part_is_never_committed() {
        let mut pool = KvPool::new(F16, 2, false);
        let t = TransferId::new(9);
        let table = receiving(&mut pool, 1, 2, t);
        let mut lent = pool.lend_landing(&table, t, None);
        assert_eq!(lent.len(), 1);
        lent[0].put_slice(&[1, 2, 3]);
        assert_eq!(lent[0].bytes(), &[1, 2, 3]);
        assert!(!lent[0].is_written());
        for p in lent {
            pool.restore(p);
        }
        assert!(pool.landing_home(&table, t));
        assert!(!pool.commit_received(&table, t));
        assert!(pool.reader().page(&table, 0, 0).is_err());
        pool.release_scrubbed(table);
        assert_eq!(pool.counters().free_pages, 2);
    }

    #[test]
    fn a_page_released_while_lent_is_freed_only_when_it_comes_back() {
        let mut pool = KvPool::new(F16, 3, false);
        let t = TransferId::new(5);
        let table = receiving(&mut pool, 1, 3, t);
        let (home, returned) = collector();
        let mut lent = pool.lend_landing(&table, t, Some(&home));
        assert_eq!(lent.len(), 2);
        lent[1].put_bytes(9, 10);
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
