//! Writing K and V into a table's pages: one token at a time, or a run of
//! tokens begun layer by layer, and zeroing the slots a page does not hold
//! yet. Every write goes through the table's owner check first.

use super::*;

impl KvPool {
    /// Writes one token's keys and values (`kv_heads * head_dim` each) for
    /// `layer` at position `pos` of the table's sequence.
    ///
    /// A page still holding a previous owner's bytes is zeroed whole first
    /// (call [`KvPool::begin_write`] before a run of writes to zero only
    /// what the run leaves unwritten); so is what a begun run has not
    /// written yet, when a write leaves the run's order.
    pub fn write_token(
        &mut self,
        table: &PageTable,
        layer: usize,
        pos: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(), OwnerViolation> {
        let g = self.geometry;
        let r = Self::entry(table, pos / g.page_size)?;
        self.check_access(table.owner, r)?;
        let slot = pos % g.page_size;
        let i = r.page.index();
        self.fill[i] = match self.fill[i] {
            Fill::Clean => Fill::Clean,
            Fill::Stale => {
                self.scrub(r.page);
                Fill::Clean
            }
            Fill::Writing {
                lo,
                hi,
                layer: at,
                mut mask,
            } => {
                let (lo, hi, at) = (usize::from(lo), usize::from(hi), usize::from(at));
                if (lo..hi).contains(&slot) && layer < at {
                    // A layer the run has written already.
                    self.fill[i]
                } else if (lo..hi).contains(&slot) && layer == at {
                    mask[slot / 64] |= 1 << (slot % 64);
                    // Only slots of the run ever get a bit.
                    let written: u32 = mask.iter().map(|w| w.count_ones()).sum();
                    if written as usize == hi - lo {
                        Self::next_layer(lo, hi, at + 1, g.layers)
                    } else {
                        Fill::Writing {
                            lo: lo as u16,
                            hi: hi as u16,
                            layer: at as u16,
                            mask,
                        }
                    }
                } else {
                    // Out of the run's order: zero what it has not written.
                    self.zero_slots(r.page, lo, hi, at);
                    Fill::Clean
                }
            }
        };

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

    /// Prepares the pages that positions `start..start + len` of the
    /// table's sequence fall in for writing: in each page that still holds
    /// a previous owner's bytes, every slot outside that range is zeroed
    /// (the range itself is about to be written in every layer), so no
    /// stale byte is left behind. Pages the range covers whole are not
    /// touched.
    pub fn begin_write(
        &mut self,
        table: &PageTable,
        start: usize,
        len: usize,
    ) -> Result<(), OwnerViolation> {
        let ps = self.geometry.page_size;
        if len == 0 {
            return Ok(());
        }
        let end = start.saturating_add(len);
        let pages = start / ps..=(end - 1) / ps;
        // Every page is checked before any is changed.
        for index in pages.clone() {
            self.check_access(table.owner, Self::entry(table, index)?)?;
        }
        for index in pages {
            let r = Self::entry(table, index)?;
            if self.fill[r.page.index()] == Fill::Clean {
                continue;
            }
            // A stale page, or one whose earlier run never finished.
            let (from, to) = (
                start.max(index * ps) - index * ps,
                end.min((index + 1) * ps) - index * ps,
            );
            self.zero_slots(r.page, 0, from, 0);
            self.zero_slots(r.page, to, ps, 0);
            self.fill[r.page.index()] = Self::next_layer(from, to, 0, self.geometry.layers);
        }
        Ok(())
    }

    /// A run over slots `lo..hi` whose layers below `layer` are written.
    pub(super) fn next_layer(lo: usize, hi: usize, layer: usize, layers: usize) -> Fill {
        if layer >= layers {
            Fill::Clean
        } else {
            // Page sizes are at most 256 and layers fit u16 (checked at use).
            Fill::Writing {
                lo: lo as u16,
                hi: hi as u16,
                layer: u16::try_from(layer).unwrap_or(u16::MAX),
                mask: [0; 4],
            }
        }
    }

    /// Zeroes slots `from..to` of a page in every layer from `layer` on,
    /// keys and values.
    pub(super) fn zero_slots(&mut self, page: PageId, from: usize, to: usize, layer: usize) {
        if from >= to {
            return;
        }
        let g = self.geometry;
        let skip = layer * 2 * g.floats_per_layer_page();
        match &mut self.planes {
            Planes::F16(pages) => {
                zero_range(&mut pages[page.index()][skip..], g, from, to, f16::ZERO);
            }
            Planes::F32(pages) => zero_range(&mut pages[page.index()][skip..], g, from, to, 0.0),
        }
    }
}

/// Zeroes slots `from..to` of every layer of one page's memory.
pub(super) fn zero_range<T: Copy>(page: &mut [T], g: KvGeometry, from: usize, to: usize, zero: T) {
    let n = g.floats_per_layer_page();
    for layer in page.chunks_exact_mut(2 * n) {
        let (keys, values) = layer.split_at_mut(n);
        for row in keys.chunks_exact_mut(g.page_size) {
            row[from..to].fill(zero);
        }
        for head in values.chunks_exact_mut(g.page_size * g.head_dim) {
            head[from * g.head_dim..to * g.head_dim].fill(zero);
        }
    }
}

/// Writes one token into a page: keys dimension-major (`[head][dim][slot]`),
/// values token-major (`[head][slot][dim]`).
pub(super) fn scatter<T: Copy>(
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
