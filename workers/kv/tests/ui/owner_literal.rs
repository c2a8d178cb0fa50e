// A victim's owner cannot be spelled out: the fields are private.
use bulkhead_kv::{Owner, RequestId, TenantId};

fn forge(victim: TenantId, request: RequestId) -> Owner {
    Owner {
        tenant: victim,
        request,
    }
}

fn main() {}
