//! The worker's observed instruments, registered once for its role: KV
//! pool gauges and guard counters read from the engine's stats (cached for
//! a moment, so one collection reads the engine once), and the transfer
//! owners' counters. Nothing is copied on the hot path: readers pull.

use crate::role::Role;
use bulkhead_engine::{Engine, EngineStats};
use bulkhead_telemetry::KeyValue;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Registers the observed instruments of a worker serving `role`, named
/// `node`. Call once per process, after telemetry is set up.
pub fn register(role: &Role, node: &str) {
    let m = bulkhead_telemetry::meter();
    let role_name = match role {
        Role::Colocated(_) => "colocated",
        Role::Decode(_) => "decode",
        Role::Prefill(_) => "prefill",
    };
    let base = crate::metrics::set_base(node, role_name);
    let engine = match role {
        Role::Colocated(e) => Arc::clone(e),
        Role::Decode(d) => Arc::clone(d.engine()),
        Role::Prefill(p) => Arc::clone(p.engine()),
    };
    let stats = Arc::new(StatsCache::new(engine));
    // Each instrument reads the engine's stats (one round trip per
    // collection, whatever reads them).
    macro_rules! observe {
        ($kind:ident, $table:expr) => {
            for g in $table {
                let (stats, attrs) = (Arc::clone(&stats), base.clone());
                m.$kind(g.name)
                    .with_description(g.description)
                    .with_unit(g.unit)
                    .with_callback(move |o| {
                        if let Some(s) = stats.get() {
                            o.observe((g.read)(&s), &attrs);
                        }
                    })
                    .build();
            }
        };
    }
    observe!(u64_observable_gauge, GAUGES);
    observe!(u64_observable_counter, COUNTERS);
    match role {
        Role::Decode(d) => decode_transfers(&m, d.clone(), &base),
        Role::Prefill(p) => prefill_transfers(&m, p.clone(), &base),
        Role::Colocated(_) => {}
    }
}

/// A gauge read from the engine's stats.
struct Gauge {
    name: &'static str,
    description: &'static str,
    unit: &'static str,
    read: Read<EngineStats>,
}

#[rustfmt::skip]
const GAUGES: [Gauge; 8] = [
    gauge("bulkhead.kv.pool.capacity", "KV pages in the pool", "{page}", |s| s.pool.total_pages as u64),
    gauge("bulkhead.kv.pool.pages.free", "KV pages free", "{page}", |s| s.pool.free_pages as u64),
    gauge("bulkhead.kv.pool.pages.allocated", "KV pages owned by a request", "{page}", |s| s.pool.allocated_pages as u64),
    gauge("bulkhead.kv.pool.pages.quarantined", "KV pages held back until in-flight writes drain", "{page}", |s| s.pool.quarantined_pages as u64),
    gauge("bulkhead.kv.pool.pages.receiving", "KV pages lent to a transfer that is landing", "{page}", |s| s.pool.receiving_pages as u64),
    gauge("bulkhead.kv.pool.pages.cached", "KV pages kept in the prefix cache (each once, however many requests share it)", "{page}", |s| s.pool.cached_pages as u64),
    gauge("bulkhead.engine.requests.running", "Sequences running", "{request}", |s| s.running as u64),
    gauge("bulkhead.engine.requests.waiting", "Requests waiting for pages", "{request}", |s| s.waiting as u64),
];

/// The guards' counters kept by the pool, read the same way.
#[rustfmt::skip]
const COUNTERS: [Gauge; 3] = [
    gauge("bulkhead.kv.owner_violations", "Reads of a KV page refused because its owner tag did not match", "{read}", |s| s.pool.owner_violations),
    gauge("bulkhead.kv.prefix.hit_tokens", "Prompt tokens read from the prefix cache instead of computed", "{token}", |s| s.pool.prefix_hit_tokens),
    gauge("bulkhead.engine.prompts.computed_here", "Prompts a decode worker computed itself instead of landing them from a prefill worker", "{request}", |s| s.computed_here),
];

/// A [`Gauge`] (a `const fn`, so the table keeps one line per gauge).
const fn gauge(
    name: &'static str,
    description: &'static str,
    unit: &'static str,
    read: Read<EngineStats>,
) -> Gauge {
    Gauge {
        name,
        description,
        unit,
        read,
    }
}

/// One engine round trip serves every instrument of one collection.
#[derive(Debug)]
struct StatsCache {
    engine: Arc<Engine>,
    last: Mutex<Option<(Instant, EngineStats)>>,
}

impl StatsCache {
    fn new(engine: Arc<Engine>) -> Self {
        StatsCache {
            engine,
            last: Mutex::new(None),
        }
    }

    fn get(&self) -> Option<EngineStats> {
        let mut last = self.last.lock().ok()?;
        if let Some((at, s)) = *last
            && at.elapsed() < Duration::from_millis(250)
        {
            return Some(s);
        }
        let s = self.engine.stats()?;
        *last = Some((Instant::now(), s));
        Some(s)
    }
}

type Read<T> = fn(&T) -> u64;

fn observed<T: Send + Sync + 'static>(
    m: &bulkhead_telemetry::metrics::Meter,
    source: &Arc<dyn Fn() -> T + Send + Sync>,
    name: &'static str,
    description: &'static str,
    unit: &'static str,
    series: Vec<(Vec<KeyValue>, Read<T>)>,
) {
    let source = Arc::clone(source);
    m.u64_observable_counter(name)
        .with_description(description)
        .with_unit(unit)
        .with_callback(move |o| {
            let v = source();
            for (attrs, read) in &series {
                o.observe(read(&v), attrs);
            }
        })
        .build();
}

fn with(base: &[KeyValue], k: &'static str, v: &'static str) -> Vec<KeyValue> {
    let mut a = base.to_vec();
    a.push(KeyValue::new(k, v));
    a
}

fn decode_transfers(
    m: &bulkhead_telemetry::metrics::Meter,
    d: crate::DecodeWorker,
    base: &[KeyValue],
) {
    use bulkhead_transfer::TransferCounters as C;
    let page = d.page_bytes() as u64;
    let src: Arc<dyn Fn() -> C + Send + Sync> = Arc::new(move || d.counters());
    let b = base.to_vec();
    observed(
        m,
        &src,
        "bulkhead.kv.transfers.started",
        "KV transfers opened",
        "{transfer}",
        vec![(b.clone(), |c: &C| c.started)],
    );
    observed(
        m,
        &src,
        "bulkhead.kv.transfers.completed",
        "KV transfers verified and committed",
        "{transfer}",
        vec![(b.clone(), |c: &C| c.committed)],
    );
    observed(
        m,
        &src,
        "bulkhead.kv.transfers.failed",
        "KV transfers that did not commit, by reason",
        "{transfer}",
        vec![
            (with(&b, "reason", "check"), |c: &C| c.failed),
            (with(&b, "reason", "incomplete"), |c: &C| c.incomplete),
            (with(&b, "reason", "timeout"), |c: &C| c.timeouts),
            (with(&b, "reason", "connection_lost"), |c: &C| {
                c.connection_losses
            }),
            (with(&b, "reason", "rejected"), |c: &C| c.rejected),
        ],
    );
    let bytes = with(&b, "direction", "received");
    let src2 = Arc::clone(&src);
    m.u64_observable_counter("bulkhead.kv.transfer.size")
        .with_description("KV page bytes moved between prefill and decode")
        .with_unit("By")
        .with_callback(move |o| o.observe(src2().pages_received * page, &bytes))
        .build();
    observed(
        m,
        &src,
        "bulkhead.kv.transfer.checksum_failures",
        "Page frames whose CRC did not match, in a benchmark without tags (the transfer fails)",
        "{frame}",
        vec![(b.clone(), |c: &C| c.checksum_mismatches)],
    );
    observed(
        m,
        &src,
        "bulkhead.kv.transfer.tag_mismatches",
        "Transfer frames whose tag the transfer's key did not make: corrupted or forged (the transfer fails)",
        "{frame}",
        vec![(b.clone(), |c: &C| c.tag_mismatches)],
    );
    observed(
        m,
        &src,
        "bulkhead.kv.transfer.frames.dropped",
        "Transfer frames refused: late (for a finished, aborting or unknown transfer), duplicate, or misaddressed",
        "{frame}",
        vec![
            (with(&b, "kind", "late"), |c: &C| c.dropped_frames),
            (with(&b, "kind", "duplicate"), |c: &C| c.duplicate_pages),
            (with(&b, "kind", "misaddressed"), |c: &C| c.slot_mismatches),
        ],
    );
}

fn prefill_transfers(
    m: &bulkhead_telemetry::metrics::Meter,
    p: crate::PrefillWorker,
    base: &[KeyValue],
) {
    let page = p.page_bytes() as u64;
    let g = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let (p1, p2, p3, p4) = (p.clone(), p.clone(), p.clone(), p);
    let b = base.to_vec();
    let attrs = b.clone();
    m.u64_observable_counter("bulkhead.kv.transfers.started")
        .with_description("KV transfers opened")
        .with_unit("{transfer}")
        .with_callback(move |o| {
            let c = p1.counters();
            o.observe(g(&c.requests).saturating_sub(g(&c.rejected)), &attrs);
        })
        .build();
    let attrs = b.clone();
    m.u64_observable_counter("bulkhead.kv.transfers.completed")
        .with_description("KV transfers verified and committed")
        .with_unit("{transfer}")
        .with_callback(move |o| o.observe(g(&p2.counters().released), &attrs))
        .build();
    let attrs = with(&b, "direction", "sent");
    m.u64_observable_counter("bulkhead.kv.transfer.size")
        .with_description("KV page bytes moved between prefill and decode")
        .with_unit("By")
        .with_callback(move |o| o.observe(g(&p3.counters().pages_sent) * page, &attrs))
        .build();
    let late = with(&b, "kind", "late");
    let faults = std::sync::Arc::clone(&p4.counters().frame_faults);
    m.u64_observable_counter("bulkhead.kv.transfer.frames.dropped")
        .with_description("Transfer frames refused: late (for a finished, aborting or unknown transfer), duplicate, or misaddressed")
        .with_unit("{frame}")
        .with_callback(move |o| o.observe(g(&p4.counters().dropped_frames), &late))
        .build();
    if cfg!(feature = "test-hooks") {
        m.u64_observable_counter("bulkhead.kv.transfer.chaos.injected")
            .with_description("Page frames broken on purpose by a test build's chaos link, by kind")
            .with_unit("{frame}")
            .with_callback(move |o| {
                for (kind, n) in faults.by_kind() {
                    o.observe(n, &with(&b, "kind", kind));
                }
            })
            .build();
    }
}
