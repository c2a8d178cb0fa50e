//! The prefix cache: full prompt pages kept after their sequence ends, so a
//! later prompt of the same namespace that starts with the same tokens
//! reads them instead of computing them again.
//!
//! A cached page is tagged [`PageTag::Cached`] with its namespace and
//! generation. It is immutable (every write and every lend refuses it), it
//! is reference-counted by the tables that name it, and it is readable
//! only from a table whose [`CacheScope`] may read its namespace: a read
//! from any other table is an [`OwnerViolation`], as for an owned page.
//!
//! Where the chain of whole blocks stops inside a prompt, the cached block
//! that continues it and starts with the most of the prompt's next tokens
//! is copied into the table's own page, its later slots zeroed (never
//! shared: the table writes the rest of that page), so a prompt sent again
//! computes only its last token.
//!
//! Blocks are found by a chain: a block's key is a hash of its namespace,
//! the key of the block before it and its own tokens, and the entry keeps
//! all three to compare, so a hash collision is a miss, never a hit. The
//! namespace roots the chain, so another namespace's blocks are never even
//! looked at.
//!
//! Unreferenced cached pages count as free ([`KvPool::free_pages`]): they
//! are evicted the moment an allocation needs their page, from the
//! namespace holding the most unreferenced pages first (so one tenant's
//! cache cannot crowd out another's), least recently used first within
//! it. An evicted page is freed like any other: its bytes are stale to the
//! next owner, who can read only what it writes.

use super::{Fill, KvPool, PageRef, PageTable, PageTag, Whereabouts};
use crate::admission::Admitted;
use crate::ids::{CacheScope, Namespace, PageId};
use crate::pool::{AllocError, PoolExhausted};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

/// The cache's bookkeeping, owned by the pool.
#[derive(Debug, Default)]
pub(crate) struct PrefixCache {
    /// Block key to cached page.
    index: HashMap<u64, PageId>,
    /// Every cached page's entry.
    entries: HashMap<PageId, Entry>,
    /// Bumped on every lookup; entries remember when they were last hit.
    clock: u64,
    /// Prompt tokens read from the cache instead of computed, so far.
    pub(crate) hit_tokens: u64,
    /// Entries with no reference (kept as a count: `free_pages` reads it
    /// on every scheduling decision).
    unreferenced: usize,
}

#[derive(Debug)]
struct Entry {
    namespace: Namespace,
    parent: u64,
    tokens: Box<[u32]>,
    key: u64,
    /// Tables that name this page now.
    refs: u32,
    last_used: u64,
    /// Position of the block in its chain (deeper blocks go first on a tie).
    depth: usize,
}

/// A table's cached prefix, found by [`KvPool::allocate_prefixed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixHit {
    /// Prompt tokens whose keys and values are already in the table.
    pub tokens: usize,
}

impl KvPool {
    /// Allocates like [`KvPool::allocate`], first reusing the longest run
    /// of cached blocks that `prompt` starts with in `scope` (the shared
    /// namespace's blocks first, then the scope's own), read-only. At
    /// least the prompt's last token is left to compute, since its logits
    /// are needed. The table reads cached pages only in `scope`. It
    /// allocates only when the whole reservation would fit, as
    /// [`KvPool::allocate`], so a hit never starts a request sooner.
    pub fn allocate_prefixed<T>(
        &mut self,
        admitted: &Admitted<T>,
        scope: CacheScope,
        prompt: &[u32],
    ) -> Result<(PageTable, PrefixHit), AllocError> {
        let hits = self.pinned_hits(admitted, scope, prompt)?;
        let partial = self.pinned_partial(admitted, scope, prompt, &hits);
        let refs: Vec<PageRef> = hits.iter().map(|(_, r)| *r).collect();
        match self.allocate_after(admitted, refs) {
            Ok(mut table) => {
                let extra = self.copy_partial(&table, hits.len(), partial);
                table.scope = Some(scope);
                Ok((table, self.count_hit(hits.len(), extra)))
            }
            Err(e) => {
                self.unref(hits.iter().map(|(p, _)| *p));
                self.unref(partial.iter().map(|(p, _)| *p));
                Err(e)
            }
        }
    }

    /// As [`KvPool::allocate_prefixed`], but the table owns every page:
    /// the cached blocks' bytes are copied into its first pages. For a
    /// prefill worker, whose pages are lent whole to a transfer (a shared
    /// page is never lent): the prompt's cached part is copied instead of
    /// computed. When the reuse would leave too few free pages for the
    /// whole reservation, it allocates as a miss.
    pub fn allocate_prefixed_copy<T>(
        &mut self,
        admitted: &Admitted<T>,
        scope: CacheScope,
        prompt: &[u32],
    ) -> Result<(PageTable, PrefixHit), AllocError> {
        let mut hits = self.pinned_hits(admitted, scope, prompt)?;
        let mut partial = self.pinned_partial(admitted, scope, prompt, &hits);
        if admitted.reserve() > self.free_pages() {
            self.unref(hits.iter().map(|(p, _)| *p));
            self.unref(partial.iter().map(|(p, _)| *p));
            hits.clear();
            partial = None;
        }
        let allocated = self.allocate_tail(admitted, Vec::new(), None);
        let mut table = match allocated {
            Ok(table) => table,
            Err(e) => {
                self.unref(hits.iter().map(|(p, _)| *p));
                self.unref(partial.iter().map(|(p, _)| *p));
                return Err(e);
            }
        };
        for (i, (src, _)) in hits.iter().enumerate() {
            let dst = table.pages[i].page;
            self.copy_page(*src, dst);
            self.fill[dst.index()] = Fill::Clean;
        }
        self.unref(hits.iter().map(|(p, _)| *p));
        let extra = self.copy_partial(&table, hits.len(), partial);
        table.scope = Some(scope);
        Ok((table, self.count_hit(hits.len(), extra)))
    }

    /// Prompt tokens of `prompt` this pool's cache holds for `scope` now,
    /// in whole pages, at most all but its last token (what an allocation
    /// with the scope would reuse). Pins nothing.
    pub fn cached_prefix_tokens(&mut self, scope: CacheScope, prompt: &[u32]) -> usize {
        let most = self.reusable_blocks(prompt);
        self.lookup(scope, prompt, most).len() * self.geometry.page_size
    }

    /// The most whole blocks of `prompt` a cache hit may cover: at least
    /// its last token is left to compute, since its logits are needed.
    fn reusable_blocks(&self, prompt: &[u32]) -> usize {
        prompt.len().saturating_sub(1) / self.geometry.page_size
    }

    /// [`KvPool::allocate_receiving`] for a request with a cache scope: once
    /// the sequence ends, its landed pages are published under `scope` as
    /// if it had computed them here (the transfer's tags proved they are
    /// what prefill computed for this request).
    pub fn allocate_receiving_in<T>(
        &mut self,
        admitted: &Admitted<T>,
        transfer: crate::ids::TransferId,
        scope: CacheScope,
    ) -> Result<PageTable, AllocError> {
        let mut table = self.allocate_receiving(admitted, transfer)?;
        table.scope = Some(scope);
        Ok(table)
    }

    /// The cached blocks `prompt` starts with in `scope`, each referenced
    /// (pinned, so no allocation evicts it), once the whole reservation
    /// would fit: a request starts when it would on a miss, so what the
    /// cache holds never changes when a request starts (and so never shows
    /// in another tenant's wait). At least the prompt's last token is left
    /// to compute, since its logits are needed.
    fn pinned_hits<T>(
        &mut self,
        admitted: &Admitted<T>,
        scope: CacheScope,
        prompt: &[u32],
    ) -> Result<Vec<(PageId, PageRef)>, AllocError> {
        if admitted.reserve() > self.free_pages() {
            return Err(PoolExhausted {
                needed: admitted.reserve(),
                free: self.free_pages(),
            }
            .into());
        }
        let most = self.reusable_blocks(prompt);
        let hits = self.lookup(scope, prompt, most.min(admitted.reserve()));
        for (page, _) in &hits {
            self.pin(*page);
        }
        Ok(hits)
    }

    /// References cached `page` (no allocation evicts it until
    /// [`KvPool::unref`]).
    fn pin(&mut self, page: PageId) {
        if let Some(e) = self.prefix.entries.get_mut(&page) {
            if e.refs == 0 {
                self.prefix.unreferenced -= 1;
            }
            e.refs += 1;
        }
    }

    fn count_hit(&mut self, blocks: usize, extra: usize) -> PrefixHit {
        let tokens = blocks * self.geometry.page_size + extra;
        self.prefix.hit_tokens += tokens as u64;
        PrefixHit { tokens }
    }

    /// Where the chain of `hits` stops inside the prompt (before its last
    /// token, whose logits are needed), a cached block that continues the
    /// chain and starts with the most of the prompt's next tokens: the
    /// same prompt again, ending inside a block, or a conversation's next
    /// turn, diverging inside one. Found in the namespaces the scope may
    /// read, referenced (pinned) when the reservation still fits beside
    /// it; `None` when no such block starts with even one of the tokens.
    fn pinned_partial<T>(
        &mut self,
        admitted: &Admitted<T>,
        scope: CacheScope,
        prompt: &[u32],
        hits: &[(PageId, PageRef)],
    ) -> Option<(PageId, usize)> {
        let ps = self.geometry.page_size;
        let from = hits.len() * ps;
        let rest = prompt.get(from..prompt.len().saturating_sub(1).min(from + ps))?;
        if rest.is_empty() || admitted.reserve().saturating_sub(hits.len()) >= self.free_pages() {
            return None;
        }
        let parent = match hits.last() {
            Some((page, _)) => self.prefix.entries.get(page)?.key,
            None => 0,
        };
        let readable = |ns: Namespace| ns == scope.own() || Some(ns) == scope.shared();
        let (page, matched) = self
            .prefix
            .entries
            .iter()
            .filter(|(p, e)| {
                e.parent == parent
                    && readable(e.namespace)
                    && self.prefix.index.get(&e.key) == Some(*p)
            })
            .map(|(p, e)| {
                let same = e
                    .tokens
                    .iter()
                    .zip(rest)
                    .take_while(|(a, b)| a == b)
                    .count();
                (*p, same)
            })
            .filter(|&(_, same)| same > 0)
            .max_by_key(|&(p, same)| (same, std::cmp::Reverse(p)))?;
        let now = self.prefix.clock;
        if let Some(e) = self.prefix.entries.get_mut(&page) {
            e.last_used = now;
        }
        self.pin(page);
        Some((page, matched))
    }

    /// Copies the pinned block of [`KvPool::pinned_partial`] into the
    /// table's page `index` (its own, from the allocation) and lets go of
    /// it: the page's first `matched` slots are the cached tokens, the
    /// rest zeroed (the block's later tokens are not the table's, and a
    /// prefill worker lends the page whole). Returns the tokens gained.
    fn copy_partial(
        &mut self,
        table: &PageTable,
        index: usize,
        partial: Option<(PageId, usize)>,
    ) -> usize {
        let Some((src, matched)) = partial else {
            return 0;
        };
        let gained = match table.pages.get(index) {
            Some(r) => {
                self.copy_page(src, r.page);
                self.zero_slots(r.page, matched, self.geometry.page_size, 0);
                self.fill[r.page.index()] = Fill::Clean;
                matched
            }
            None => 0,
        };
        self.unref(std::iter::once(src));
        gained
    }

    /// Copies page `src`'s memory over page `dst`'s (both home).
    fn copy_page(&mut self, src: PageId, dst: PageId) {
        fn copy<T: Copy>(pages: &mut [Box<[T]>], src: usize, dst: usize) {
            if src == dst {
                return;
            }
            let (lo, hi) = pages.split_at_mut(src.max(dst));
            let (a, b) = (&mut lo[src.min(dst)], &mut hi[0]);
            if src < dst {
                b.copy_from_slice(a);
            } else {
                a.copy_from_slice(b);
            }
        }
        match &mut self.planes {
            super::Planes::F16(p) => copy(p, src.index(), dst.index()),
            super::Planes::F32(p) => copy(p, src.index(), dst.index()),
        }
    }

    /// Adds the full, computed blocks of `table` (its first `computed`
    /// tokens of `tokens`) to the cache under the table's own namespace,
    /// so the pages stay when the table is released. Blocks already cached
    /// (by this table's hits or by another sequence) are left as they are.
    /// A table allocated without a scope publishes nothing.
    pub fn publish_prefix(&mut self, table: &PageTable, tokens: &[u32], computed: usize) {
        let Some(scope) = table.scope else { return };
        let ps = self.geometry.page_size;
        let mut parent = 0u64;
        for (i, r) in table
            .pages
            .iter()
            .enumerate()
            .take(computed.min(tokens.len()) / ps)
        {
            let block = &tokens[i * ps..(i + 1) * ps];
            if let Some(PageTag::Cached { .. }) = self.tags.get(r.page.index()) {
                match self.prefix.entries.get(&r.page) {
                    Some(e) if e.tokens[..] == *block => {
                        parent = e.key;
                        continue;
                    }
                    _ => return,
                }
            }
            let ns = scope.own();
            let key = block_key(ns, parent, block);
            if let Some(e) = self
                .prefix
                .index
                .get(&key)
                .and_then(|p| self.prefix.entries.get(p))
            {
                // Another sequence cached the same block first: keep this
                // page private (it is freed on release) and go on.
                if e.namespace == ns && e.parent == parent && e.tokens[..] == *block {
                    parent = key;
                    continue;
                }
                return;
            }
            let publishable = self.tag_matches(table.owner, *r)
                && self.fill[r.page.index()] == Fill::Clean
                && self.whereabouts[r.page.index()] == Whereabouts::Home
                && !self.pending_quarantine.contains(&r.page);
            if !publishable {
                return;
            }
            self.tags[r.page.index()] = PageTag::Cached {
                namespace: ns,
                generation: r.generation,
            };
            self.prefix.index.insert(key, r.page);
            self.prefix.entries.insert(
                r.page,
                Entry {
                    namespace: ns,
                    parent,
                    tokens: block.into(),
                    key,
                    refs: 1,
                    last_used: self.prefix.clock,
                    depth: i,
                },
            );
            parent = key;
        }
    }

    /// Cached pages now, referenced or not.
    pub fn cached_pages(&self) -> usize {
        self.prefix.entries.len()
    }

    /// Cached pages no table names: evictable, so counted as free.
    pub(crate) fn evictable(&self) -> usize {
        self.prefix.unreferenced
    }

    /// Drops every cached page no table names (their pages are freed).
    pub fn clear_prefix_cache(&mut self) {
        while self.evict_one() {}
    }

    /// The longest cached run `prompt` starts with, at most `most` blocks:
    /// shared blocks while they last, then the scope's own.
    fn lookup(&mut self, scope: CacheScope, prompt: &[u32], most: usize) -> Vec<(PageId, PageRef)> {
        self.prefix.clock += 1;
        let now = self.prefix.clock;
        let ps = self.geometry.page_size;
        let mut out = Vec::new();
        let mut parent = 0u64;
        let mut in_shared = scope.shared().is_some();
        for block in prompt.chunks_exact(ps).take(most) {
            let mut found = None;
            if in_shared {
                found = scope.shared().and_then(|ns| self.find(ns, parent, block));
                in_shared = found.is_some();
            }
            let found = found.or_else(|| self.find(scope.own(), parent, block));
            let Some((page, key)) = found else { break };
            let Some(PageTag::Cached { generation, .. }) = self.tags.get(page.index()).copied()
            else {
                break;
            };
            if let Some(e) = self.prefix.entries.get_mut(&page) {
                e.last_used = now;
            }
            out.push((page, PageRef { page, generation }));
            parent = key;
        }
        out
    }

    fn find(&self, ns: Namespace, parent: u64, block: &[u32]) -> Option<(PageId, u64)> {
        let key = block_key(ns, parent, block);
        let page = *self.prefix.index.get(&key)?;
        let e = self.prefix.entries.get(&page)?;
        (e.namespace == ns && e.parent == parent && e.tokens[..] == *block).then_some((page, key))
    }

    /// A table naming cached `pages` lets go of them.
    pub(crate) fn unref(&mut self, pages: impl Iterator<Item = PageId>) {
        for p in pages {
            let now_unused = match self.prefix.entries.get_mut(&p) {
                Some(e) if e.refs > 0 => {
                    e.refs -= 1;
                    if e.refs == 0 {
                        self.prefix.unreferenced += 1;
                    }
                    e.refs == 0
                }
                Some(_) => false,
                None => false,
            };
            if now_unused && self.pending_quarantine.contains(&p) {
                self.drop_entry(p);
                self.free_page(p, true);
            }
        }
    }

    /// Whether `r` names a cached page at its generation (a table's hit).
    pub(crate) fn names_cached(&self, r: PageRef) -> bool {
        matches!(self.tags.get(r.page.index()), Some(PageTag::Cached { generation, .. }) if *generation == r.generation)
    }

    /// Takes a cached page out of the index at once (no new hit reaches
    /// it); it leaves service when its last table lets go.
    pub(crate) fn withdraw(&mut self, page: PageId) {
        if let Some(e) = self.prefix.entries.get(&page) {
            let (key, unused) = (e.key, e.refs == 0);
            self.prefix.index.remove(&key);
            if unused {
                self.drop_entry(page);
                self.free_page(page, true);
            }
        }
    }

    /// Evicts one unreferenced cached page: of the namespace holding the
    /// most of them, the least recently used (deepest on a tie).
    pub(crate) fn evict_one(&mut self) -> bool {
        let mut per_ns: HashMap<Namespace, usize> = HashMap::new();
        for e in self.prefix.entries.values().filter(|e| e.refs == 0) {
            *per_ns.entry(e.namespace).or_default() += 1;
        }
        let Some(ns) = per_ns
            .into_iter()
            .max_by_key(|(ns, n)| (*n, std::cmp::Reverse(*ns)))
            .map(|(ns, _)| ns)
        else {
            return false;
        };
        let victim = self
            .prefix
            .entries
            .iter()
            .filter(|(_, e)| e.refs == 0 && e.namespace == ns)
            .min_by_key(|(p, e)| (e.last_used, std::cmp::Reverse(e.depth), **p))
            .map(|(p, _)| *p);
        let Some(page) = victim else { return false };
        self.drop_entry(page);
        let scrub = self.scrub_on_free;
        self.free_page(page, scrub);
        true
    }

    fn drop_entry(&mut self, page: PageId) {
        let Some(e) = self.prefix.entries.remove(&page) else {
            return;
        };
        if e.refs == 0 {
            self.prefix.unreferenced -= 1;
        }
        if self.prefix.index.get(&e.key) == Some(&page) {
            self.prefix.index.remove(&e.key);
        }
    }
}

/// A block's chain key: its namespace, its parent's key and its tokens.
pub(crate) fn block_key(ns: Namespace, parent: u64, block: &[u32]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    ns.hash(&mut h);
    parent.hash(&mut h);
    block.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::tests::{GEO, fill, fresh_table, limits, page_floats, tenant};

    fn ns(n: u8) -> Namespace {
        Namespace::from_digest([n; 16])
    }

    fn scope(n: u8) -> CacheScope {
        CacheScope::new(ns(n), None)
    }

    /// Runs `prompt` for `tenant` in `scope` to completion (every prompt
    /// token written with value `x`, nothing generated) and publishes it.
    fn run(pool: &mut KvPool, t: u64, sc: CacheScope, prompt: &[u32], x: f32) -> PrefixHit {
        let a = limits(pool).admit(tenant(t), prompt.len(), 1, ()).unwrap();
        let (table, hit) = pool.allocate_prefixed(&a, sc, prompt).unwrap();
        fill(pool, &table, hit.tokens, prompt.len() - hit.tokens, x);
        pool.publish_prefix(&table, prompt, prompt.len());
        pool.release(table);
        hit
    }

    /// A pool of eight pages whose cache holds the two full pages of the
    /// prompt it returns, which tenant 1 ran in scope 1 (every value 7);
    /// and tenant 1's admission to run it again.
    fn cached() -> (KvPool, [u32; 5], crate::Admitted<()>) {
        let mut pool = KvPool::new(GEO, 8, false);
        let prompt = [1, 2, 3, 4, 5];
        run(&mut pool, 1, scope(1), &prompt, 7.0);
        let again = limits(&pool).admit(tenant(1), 5, 1, ()).unwrap();
        (pool, prompt, again)
    }

    /// [`cached`], then tenant 1's table for the prompt again, reading the
    /// cache (or, with `copy`, copying from it): four tokens a hit.
    fn rerun(copy: bool) -> (KvPool, PageTable, [u32; 5]) {
        let (mut pool, prompt, a) = cached();
        let (table, hit) = if copy {
            pool.allocate_prefixed_copy(&a, scope(1), &prompt).unwrap()
        } else {
            pool.allocate_prefixed(&a, scope(1), &prompt).unwrap()
        };
        assert_eq!(hit.tokens, 4);
        (pool, table, prompt)
    }

    /// Lands `table`'s pages for transfer `t` (zeros) and commits them.
    fn land(pool: &mut KvPool, table: &PageTable, t: crate::ids::TransferId) {
        let mut lent = pool.lend_landing(table, t, None);
        for page in &mut lent {
            let n = bytes::BufMut::remaining_mut(page);
            bytes::BufMut::put_slice(page, &vec![0u8; n]);
        }
        for page in lent {
            pool.restore(page);
        }
        assert!(pool.commit_received(table, t));
    }

    #[test]
    fn a_prompt_ending_or_diverging_inside_a_cached_block_reuses_its_leading_tokens() {
        let mut pool = KvPool::new(GEO, 12, false);
        let prompt = [1, 2, 3, 4, 5, 6];
        run(&mut pool, 1, scope(1), &prompt, 7.0);
        // The same prompt again: two whole blocks, then the first token of
        // the third (its last token is computed for its logits).
        let a = limits(&pool).admit(tenant(1), 6, 1, ()).unwrap();
        let (table, hit) = pool.allocate_prefixed(&a, scope(1), &prompt).unwrap();
        assert_eq!(hit.tokens, 5);
        // The third page is the table's own, holding the cached block's
        // first slot and zeros in the second.
        assert!(!pool.names_cached(table.pages[2]));
        let floats = page_floats(&pool, &table, 2);
        assert_eq!(
            floats.iter().filter(|&&x| x == 7.0).count(),
            floats.len() / 2
        );
        assert_eq!(
            floats.iter().filter(|&&x| x == 0.0).count(),
            floats.len() / 2
        );
        // The block it copied is not held by the table.
        assert_eq!(pool.evictable(), pool.cached_pages() - 2);
        pool.release(table);
        // The same through a copy (a prefill worker's table).
        let (table, hit) = pool.allocate_prefixed_copy(&a, scope(1), &prompt).unwrap();
        assert_eq!(hit.tokens, 5);
        pool.release(table);
        // Diverging inside the second block: its first token.
        assert_eq!(
            run(&mut pool, 1, scope(1), &[1, 2, 3, 9, 9, 9], 8.0).tokens,
            3
        );
        // Another namespace reads none of it.
        assert_eq!(run(&mut pool, 2, scope(2), &prompt, 9.0).tokens, 0);
        // A block is read only after its own parent: [5, 6], cached third,
        // does not start a prompt.
        assert_eq!(run(&mut pool, 1, scope(1), &[5, 6, 0, 0, 0], 8.0).tokens, 0);
        // A block taken out of the index (withdrawn, quarantined) while a
        // table still reads it is not copied either.
        let longer = [1, 2, 3, 4, 5, 6, 7];
        let a7 = limits(&pool).admit(tenant(1), 7, 1, ()).unwrap();
        let (holder, hit) = pool.allocate_prefixed(&a7, scope(1), &longer).unwrap();
        assert_eq!(hit.tokens, 6);
        pool.withdraw(holder.pages[2].page);
        assert_eq!(run(&mut pool, 1, scope(1), &prompt, 7.0).tokens, 4);
        pool.release(holder);
    }

    /// A pool just large enough for the prompt again: the partial block is
    /// given up rather than pinned where pinning it would leave too few
    /// pages, and the request is admitted with its whole blocks.
    #[test]
    fn a_partial_block_is_not_pinned_at_the_cost_of_the_allocation() {
        let mut pool = KvPool::new(GEO, 4, false);
        let prompt = [1, 2, 3, 4, 5, 6];
        run(&mut pool, 1, scope(1), &prompt, 7.0);
        assert_eq!(pool.cached_pages(), 3);
        let a = limits(&pool).admit(tenant(1), 6, 1, ()).unwrap();
        let (table, hit) = pool.allocate_prefixed(&a, scope(1), &prompt).unwrap();
        assert_eq!(hit.tokens, 4);
        pool.release(table);
    }

    #[test]
    fn a_landed_table_in_a_scope_publishes_there_and_the_peek_pins_nothing() {
        let mut pool = KvPool::new(GEO, 8, false);
        let prompt = [1, 2, 3, 4, 5];
        assert_eq!(pool.cached_prefix_tokens(scope(1), &prompt), 0);
        // Landed from a transfer, with the request's scope.
        let t = crate::ids::TransferId::new(9);
        let a = limits(&pool).admit(tenant(1), 5, 1, ()).unwrap();
        let table = pool.allocate_receiving_in(&a, t, scope(1)).unwrap();
        land(&mut pool, &table, t);
        pool.publish_prefix(&table, &prompt, prompt.len());
        pool.release(table);
        // Its two full pages are cached in its scope, in no other.
        assert_eq!(pool.cached_prefix_tokens(scope(1), &prompt), 4);
        assert_eq!(pool.cached_prefix_tokens(scope(2), &prompt), 0);
        // Peeking pinned nothing: every cached page is still evictable.
        assert_eq!(pool.evictable(), pool.cached_pages());
        // A landing table without a scope publishes nothing.
        let mut other = KvPool::new(GEO, 8, false);
        let a = limits(&other).admit(tenant(1), 5, 1, ()).unwrap();
        let table = other.allocate_receiving(&a, t).unwrap();
        land(&mut other, &table, t);
        other.publish_prefix(&table, &prompt, prompt.len());
        other.release(table);
        assert_eq!(other.cached_pages(), 0);
    }

    fn first(pool: &KvPool, table: &PageTable, index: usize) -> f32 {
        match pool.reader().page(table, index, 0).unwrap().keys(0) {
            crate::KvData::F32(k) => k[0],
            crate::KvData::F16(k) => k[0].to_f32(),
        }
    }

    #[test]
    fn a_namespace_reuses_its_own_blocks_and_no_other_namespace_sees_them() {
        let mut pool = KvPool::new(GEO, 16, false);
        let prompt = [1, 2, 3, 4, 5, 6, 7];
        assert_eq!(run(&mut pool, 1, scope(1), &prompt, 1.0).tokens, 0);
        // Three full blocks cached; the last token is always computed.
        assert_eq!(pool.cached_pages(), 3);
        assert_eq!(run(&mut pool, 1, scope(1), &prompt, 2.0).tokens, 6);
        // Same tenant number, same tokens, another namespace: nothing.
        assert_eq!(run(&mut pool, 1, scope(2), &prompt, 3.0).tokens, 0);
        // A prompt that diverges in its second block reuses the first only.
        assert_eq!(run(&mut pool, 1, scope(1), &[1, 2, 9, 9, 5], 4.0).tokens, 2);
        let c = pool.counters();
        assert_eq!(c.prefix_hit_tokens, 8);
        // Shared pages are counted once; unreferenced ones are free to take.
        assert_eq!(c.cached_pages, c.evictable_pages);
        assert_eq!(c.free_pages, 16);
    }

    #[test]
    fn a_hit_reads_the_cached_bytes_and_cannot_write_or_lend_them() {
        let (mut pool, table, _) = rerun(false);
        assert_eq!(first(&pool, &table, 0), 7.0);
        assert_eq!(first(&pool, &table, 1), 7.0);
        // Immutable: a write to a cached page is refused.
        assert!(
            pool.write_token(&table, 0, 0, &[0.0; 4], &[0.0; 4])
                .is_err()
        );
        assert!(pool.begin_write(&table, 0, 2).is_err());
        pool.release(table);
    }

    #[test]
    fn reading_a_cached_page_from_another_namespace_is_a_violation() {
        let (mut pool, prompt, own) = cached();
        let victim = pool.allocate_prefixed(&own, scope(1), &prompt).unwrap().0;
        let a = limits(&pool).admit(tenant(2), 5, 1, ()).unwrap();
        let (mut attacker, hit) = pool.allocate_prefixed(&a, scope(2), &prompt).unwrap();
        assert_eq!(hit.tokens, 0);
        // The incident's index bug: the attacker's entry names the victim's page.
        attacker.pages[0] = victim.pages[0];
        let v = pool.reader().page(&attacker, 0, 0).unwrap_err();
        assert_ne!(v.page, PageId::NONE);
        pool.quarantine(&v);
        // Withdrawn at once: not even its own namespace hits it again...
        pool.release(victim);
        pool.release(attacker);
        let a = limits(&pool).admit(tenant(1), 5, 1, ()).unwrap();
        let (t, hit) = pool.allocate_prefixed(&a, scope(1), &prompt).unwrap();
        assert_eq!(hit.tokens, 0);
        pool.release(t);
        // ...and out of service once its last table let go.
        assert_eq!(pool.tag(v.page), Some(PageTag::Quarantined));
    }

    #[test]
    fn eviction_is_fair_and_never_serves_freed_bytes() {
        let mut pool = KvPool::new(GEO, 8, false);
        // Tenant 1 caches 6 pages, tenant 2 caches 1.
        run(&mut pool, 1, scope(1), &[1; 13], 5.0);
        run(&mut pool, 2, scope(2), &[2; 3], 6.0);
        assert_eq!(pool.cached_pages(), 7);
        assert_eq!(pool.free_pages(), 8);
        // A newcomer needs 4 pages: they come from the largest cache.
        let a = limits(&pool).admit(tenant(3), 7, 1, ()).unwrap();
        let table = pool.allocate(&a).unwrap();
        assert_eq!(pool.cached_pages(), 4);
        assert_eq!(run_hits(&mut pool, 2, &[2; 3]), 2, "the small cache stays");
        // The newcomer reads nothing of the evicted pages' bytes: every
        // page it holds is refused until it writes it.
        for i in 0..table.len() {
            assert!(pool.reader().page(&table, i, 0).is_err());
        }
        fill(&mut pool, &table, 0, 7, 9.0);
        for i in 0..table.len() {
            assert_eq!(first(&pool, &table, i), 9.0);
            let floats = match &pool.planes {
                crate::pool::Planes::F32(p) => p[table.pages[i].page.index()].to_vec(),
                crate::pool::Planes::F16(_) => unreachable!("the test pool is f32"),
            };
            assert!(floats.iter().all(|x| *x == 9.0 || *x == 0.0), "{floats:?}");
        }
        pool.release(table);
    }

    fn run_hits(pool: &mut KvPool, t: u8, prompt: &[u32]) -> usize {
        let a = limits(pool)
            .admit(tenant(u64::from(t)), prompt.len(), 1, ())
            .unwrap();
        let (table, hit) = pool.allocate_prefixed(&a, scope(t), prompt).unwrap();
        pool.release(table);
        hit.tokens
    }

    #[test]
    fn a_shared_prefix_is_read_by_every_scope_and_what_follows_is_not() {
        let mut pool = KvPool::new(GEO, 16, false);
        let public = ns(9);
        // The operator publishes a 4-token prefix into the shared namespace.
        run(
            &mut pool,
            0,
            CacheScope::new(public, None),
            &[7, 7, 8, 8, 0],
            1.0,
        );
        let alice = CacheScope::new(ns(1), Some(public));
        let bob = CacheScope::new(ns(2), Some(public));
        let prompt = [7, 7, 8, 8, 3, 3, 4];
        assert_eq!(run(&mut pool, 1, alice, &prompt, 2.0).tokens, 4);
        // Alice's blocks after the prefix are hers: Bob reuses only the prefix.
        assert_eq!(run(&mut pool, 2, bob, &prompt, 3.0).tokens, 4);
        assert_eq!(run(&mut pool, 1, alice, &prompt, 4.0).tokens, 6);
        // Without the shared namespace in its scope, nothing.
        assert_eq!(run(&mut pool, 3, scope(3), &prompt, 5.0).tokens, 0);
    }

    #[test]
    fn a_hit_never_starts_a_request_a_miss_could_not() {
        let mut pool = KvPool::new(GEO, 6, false);
        let prompt = [1, 2, 3, 4, 5];
        run(&mut pool, 1, scope(1), &prompt, 1.0);
        assert_eq!((pool.cached_pages(), pool.free_pages()), (2, 6));
        let held = fresh_table(&mut pool, 2, 7);
        assert_eq!(pool.free_pages(), 2);
        // Three pages reserved, two of them cached: it would fit, but a
        // miss would not, so neither does the hit.
        let a = limits(&pool).admit(tenant(1), 5, 1, ()).unwrap();
        assert!(matches!(
            pool.allocate_prefixed(&a, scope(1), &prompt),
            Err(AllocError::Exhausted(_))
        ));
        assert_eq!(pool.cached_pages(), 2, "nothing was taken or evicted");
        pool.release(held);
        let (_, hit) = pool.allocate_prefixed(&a, scope(1), &prompt).unwrap();
        assert_eq!(hit.tokens, 4);
    }

    #[test]
    fn a_copied_prefix_is_owned_whole_and_equal_to_the_cache() {
        let (mut pool, table, prompt) = rerun(true);
        for i in 0..2 {
            assert!(matches!(
                pool.tag(table.pages[i].page),
                Some(PageTag::Owned { .. })
            ));
            assert_eq!(first(&pool, &table, i), 7.0);
        }
        // Owned, so writable (and lendable) like any page of its own.
        assert!(pool.write_token(&table, 0, 0, &[1.0; 4], &[1.0; 4]).is_ok());
        // The cache is untouched and unreferenced.
        assert_eq!(
            (pool.cached_pages(), pool.counters().evictable_pages),
            (2, 2)
        );
        // Another namespace copies nothing.
        let b = limits(&pool).admit(tenant(2), 5, 1, ()).unwrap();
        let (_, hit) = pool.allocate_prefixed_copy(&b, scope(2), &prompt).unwrap();
        assert_eq!(hit.tokens, 0);
    }

    #[test]
    fn a_table_without_a_scope_neither_reads_nor_publishes() {
        let mut pool = KvPool::new(GEO, 8, false);
        let table = fresh_table(&mut pool, 1, 5);
        fill(&mut pool, &table, 0, 5, 1.0);
        pool.publish_prefix(&table, &[1, 2, 3, 4, 5], 5);
        assert_eq!(pool.cached_pages(), 0);
        pool.release(table);
        assert_eq!(pool.free_pages(), 8);
    }
}
