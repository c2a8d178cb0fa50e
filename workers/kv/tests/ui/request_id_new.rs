// Request ids are minted by admission, never from a number.
use bulkhead_kv::RequestId;

fn main() {
    let _forged = RequestId::new(42);
}
