//! Moving whole pages in and out of the pool for KV transfers.
//!
//! A page leaves and enters the pool as bytes in one fixed, layout-free
//! order: for each layer, that page's keys then its values, little-endian
//! (the pool's own page-major layout, so a page is one contiguous block).
//! Export reads only a page the caller owns; import writes only a landing
//! slot of the caller's own transfer, at the generation it was granted; a
//! landed page becomes readable only through [`KvPool::commit_received`].

use super::{KvPool, PageRef, PageTable, PageTag, Planes};
use crate::ids::{Generation, Owner, TransferId};
use crate::pool::OwnerViolation;

#[cfg(target_endian = "big")]
compile_error!("KV page bytes are little-endian on the wire; big-endian hosts are not supported");

/// Why a page could not be written into a landing slot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    /// The slot index is past the table's granted pages.
    #[error("slot {slot} is outside the {granted} granted pages")]
    SlotOutOfRange {
        /// The slot named.
        slot: usize,
        /// Slots granted.
        granted: usize,
    },
    /// The slot's page is not a landing slot of this transfer at this
    /// generation (stale, foreign, already committed or released).
    #[error("slot {slot} is not a landing page of {transfer} at generation {generation}")]
    NotGranted {
        /// The slot named.
        slot: usize,
        /// The transfer named.
        transfer: TransferId,
        /// The generation named.
        generation: u64,
    },
    /// The payload is not exactly one page.
    #[error("page payload of {got} bytes, expected {expected}")]
    Length {
        /// Bytes received.
        got: usize,
        /// Bytes per page.
        expected: usize,
    },
}

impl KvPool {
    /// Appends the bytes of page `r` to `out`, if `owner` owns it
    /// (owner-checked like any read).
    pub fn export_page(
        &self,
        owner: Owner,
        r: PageRef,
        out: &mut Vec<u8>,
    ) -> Result<(), OwnerViolation> {
        self.check(owner, r)?;
        match &self.planes {
            Planes::F16(pages) => {
                out.extend_from_slice(bytemuck::cast_slice(&pages[r.page.index()]))
            }
            Planes::F32(pages) => {
                out.extend_from_slice(bytemuck::cast_slice(&pages[r.page.index()]))
            }
        }
        Ok(())
    }

    /// Writes `bytes` into landing slot `slot` of `table` for `transfer`,
    /// if that page is still a landing slot of exactly this transfer at
    /// `generation`. The page stays unreadable.
    pub fn import_page(
        &mut self,
        table: &PageTable,
        transfer: TransferId,
        slot: usize,
        generation: Generation,
        bytes: &[u8],
    ) -> Result<(), ImportError> {
        let granted = self.receiving_slots(table, transfer);
        let refused = ImportError::NotGranted {
            slot,
            transfer,
            generation: generation.get(),
        };
        let Some(r) = table.pages.get(slot).copied() else {
            return Err(ImportError::SlotOutOfRange { slot, granted });
        };
        if r.generation != generation
            || !self.lands(table, transfer, r)
            || self.whereabouts[r.page.index()] != super::Whereabouts::Home
        {
            return Err(refused);
        }
        let expected = self.geometry.bytes_per_page();
        if bytes.len() != expected {
            return Err(ImportError::Length {
                got: bytes.len(),
                expected,
            });
        }
        match &mut self.planes {
            Planes::F16(pages) => copy_le(&mut pages[r.page.index()], bytes),
            Planes::F32(pages) => copy_le(&mut pages[r.page.index()], bytes),
        }
        Ok(())
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

    /// Landing slots of `transfer` that `table` still holds.
    pub fn receiving_slots(&self, table: &PageTable, transfer: TransferId) -> usize {
        table
            .pages
            .iter()
            .filter(|r| self.lands(table, transfer, **r))
            .count()
    }

    pub(super) fn lands(&self, table: &PageTable, transfer: TransferId, r: PageRef) -> bool {
        self.tags.get(r.page.index())
            == Some(&PageTag::Receiving {
                owner: table.owner,
                generation: r.generation,
                transfer,
            })
    }
}

fn copy_le<T: bytemuck::Pod>(dst: &mut [T], src: &[u8]) {
    let dst = bytemuck::cast_slice_mut::<T, u8>(dst);
    if dst.len() == src.len() {
        dst.copy_from_slice(src);
    }
}

#[cfg(test)]
mod tests {
    use crate::admission::Limits;
    use crate::ids::{Owner, RequestId, TenantId, TransferId};
    use crate::pool::{ImportError, KvDtype, KvGeometry, KvPool, PageTag};

    const GEO: KvGeometry = KvGeometry {
        layers: 2,
        kv_heads: 1,
        head_dim: 4,
        page_size: 2,
        dtype: KvDtype::F16,
    };

    fn owner(t: u64, r: u64) -> Owner {
        Owner {
            tenant: TenantId::new(t),
            request: RequestId::new(r),
        }
    }

    #[test]
    fn pages_round_trip_and_land_unreadable_until_committed() {
        let limits = |p: &KvPool| Limits {
            context_window: 64,
            pool_tokens: p.capacity_tokens(),
            page_size: 2,
        };
        let mut src = KvPool::new(GEO, 4, false);
        let a = limits(&src).admit(owner(1, 1), 3, 1, ()).unwrap();
        let st = src.allocate(&a.prompt_only()).unwrap();
        assert_eq!(st.pages().len(), 2);
        for pos in 0..3 {
            for layer in 0..2 {
                let x = (pos * 10 + layer) as f32;
                src.write_token(&st, layer, pos, &[x; 4], &[-x; 4]).unwrap();
            }
        }
        let mut dst = KvPool::new(GEO, 4, false);
        let t = TransferId::new(77);
        let d = limits(&dst).admit(owner(5, 9), 3, 1, ()).unwrap();
        let dt = dst.allocate_receiving(&d, t).unwrap();
        assert_eq!(dst.counters().receiving_pages, 2);
        assert_eq!(dt.pages().len(), 2);

        let mut bytes = Vec::new();
        src.export_page(st.owner(), st.pages()[1], &mut bytes)
            .unwrap();
        assert_eq!(bytes.len(), GEO.bytes_per_page());
        let g = dt.pages()[1].generation();
        // Wrong transfer, wrong generation, wrong slot, wrong length: refused.
        assert!(matches!(
            dst.import_page(&dt, TransferId::new(78), 1, g, &bytes),
            Err(ImportError::NotGranted { .. })
        ));
        assert!(matches!(
            dst.import_page(&dt, t, 0, g, &bytes),
            Err(ImportError::NotGranted { .. })
        ));
        assert!(matches!(
            dst.import_page(&dt, t, 5, g, &bytes),
            Err(ImportError::SlotOutOfRange { .. })
        ));
        assert!(matches!(
            dst.import_page(&dt, t, 1, g, &bytes[1..]),
            Err(ImportError::Length { .. })
        ));
        dst.import_page(&dt, t, 1, g, &bytes).unwrap();
        // Landed but not committed: not readable.
        assert!(dst.reader().page(0, dt.owner(), dt.pages()[1]).is_err());
        dst.commit_received(&dt, t);
        assert!(matches!(
            dst.tag(dt.pages()[1].page()),
            Some(PageTag::Owned { .. })
        ));
        let mut back = Vec::new();
        dst.export_page(dt.owner(), dt.pages()[1], &mut back)
            .unwrap();
        assert_eq!(back, bytes);
        // A committed page is no longer a landing slot.
        assert!(dst.import_page(&dt, t, 1, g, &bytes).is_err());
        dst.release_scrubbed(dt);
        src.release(st);
        for p in [&src, &dst] {
            let c = p.counters();
            assert_eq!((c.free_pages, c.receiving_pages), (4, 0));
        }
    }
}
