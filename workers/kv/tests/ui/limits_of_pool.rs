// Nor can limits be made through the pool's own constructor.
use bulkhead_kv::Limits;

fn main() {
    let _unlimited = Limits::of_pool(usize::MAX, usize::MAX, 16, todo!());
}
