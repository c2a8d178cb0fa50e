// Limits come from a pool's real geometry, never from a literal.
use bulkhead_kv::Limits;

fn main() {
    let _unlimited = Limits {
        context_window: usize::MAX,
        pool_tokens: usize::MAX,
        page_size: 16,
    };
}
