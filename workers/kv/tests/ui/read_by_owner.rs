// A page is read through the reader's own table and an index into it; there
// is no page reference to pass around and no read by owner.
use bulkhead_kv::{KvPool, Owner, PageRef};

fn steal(pool: &KvPool, victim: Owner, page: PageRef) {
    let _ = pool.reader().page(0, victim, page);
}

fn main() {}
