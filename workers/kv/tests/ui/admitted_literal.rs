// An admission can only come from `Limits::admit`.
use bulkhead_kv::{Admitted, KvPool};

fn allocate_anything(pool: &mut KvPool, victim: bulkhead_kv::Owner) {
    let forged = Admitted {
        owner: victim,
        prompt_tokens: 1,
        max_tokens: 1,
        pages: 1,
        prompt_pages: 1,
        payload: (),
    };
    let _ = pool.allocate(&forged);
}

fn main() {}
