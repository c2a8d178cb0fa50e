//! Page ownership at the engine's boundary: a corrupted page table cannot
//! read another tenant's page, a quarantined page does not stall the queue,
//! every page returns to the pool whatever way a request ends, and a
//! rejected prompt touches nothing.

mod common;

use bulkhead_engine::{EngineConfig, EngineCore, EngineError, GenerateRequest, SeqEvent};
use bulkhead_kv::{AdmissionError, Owner, PageTag, TenantId};
use common::{engine, greedy, model, run};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

/// Admits and queues `req` for `tenant`; returns the owner admission gave
/// it and its events.
fn submit(
    core: &mut EngineCore,
    tenant: u64,
    req: GenerateRequest,
) -> (Owner, UnboundedReceiver<SeqEvent>) {
    let (tx, rx) = unbounded_channel();
    let admitted =
        EngineCore::admit(&core.limits(), TenantId::new(tenant), req, tx).expect("admitted");
    let owner = admitted.owner();
    core.submit(admitted);
    (owner, rx)
}

fn drain(rx: &mut UnboundedReceiver<SeqEvent>) -> Vec<SeqEvent> {
    std::iter::from_fn(|| rx.try_recv().ok()).collect()
}

fn token_ids(events: &[SeqEvent]) -> Vec<u32> {
    events
        .iter()
        .filter_map(|e| match e {
            SeqEvent::Token { id, .. } => Some(*id),
            _ => None,
        })
        .collect()
}

#[test]
fn a_page_table_pointing_at_another_tenants_page_fails_that_request_only() {
    let m = model();
    let prompt_a = m
        .tokenizer()
        .encode("Tenant A's secret: the vault code is 4471.")
        .unwrap();
    let prompt_b = m
        .tokenizer()
        .encode("Tell me a short story about a lighthouse.")
        .unwrap();
    let mut core = EngineCore::new(m, &EngineConfig::with_budget(64 << 20)).expect("engine core");
    let (a, mut rx_a) = submit(&mut core, 1, greedy(prompt_a.clone(), 24));
    let (b, mut rx_b) = submit(&mut core, 2, greedy(prompt_b, 24));
    // Prefill both and decode a few tokens.
    for _ in 0..4 {
        assert!(core.step());
    }
    let before_b = drain(&mut rx_b);
    assert!(!token_ids(&before_b).is_empty());
    let pages_a = core.pages_of(a.request()).unwrap();

    // The index bug of the incident: B's first page-table entry now names A's first page.
    assert!(core.redirect_page_for_fault_injection(b.request(), 0, a.request(), 0));
    // B's next decode (sequences may take turns while tenants share).
    let mut after_b = Vec::new();
    for _ in 0..4 {
        assert!(core.step());
        after_b.extend(drain(&mut rx_b));
        if !after_b.is_empty() {
            break;
        }
    }
    assert_eq!(
        token_ids(&after_b),
        Vec::<u32>::new(),
        "no token may come from a foreign page"
    );
    match after_b.as_slice() {
        [SeqEvent::Failed(EngineError::Integrity(v))] => {
            assert_eq!(v.page, pages_a[0]);
            assert_eq!(v.owner, b);
        }
        other => panic!("expected one integrity failure, got {other:?}"),
    }
    let c = core.counters();
    assert_eq!(c.owner_violations, 1);

    // A is unharmed: it finishes with exactly the tokens it would produce alone.
    while core.step() {}
    let a_tokens = token_ids(&drain(&mut rx_a));
    let e = engine(64);
    let (alone, _, _) = run(&e, 1, greedy(prompt_a, 24));
    assert_eq!(a_tokens, alone);

    // The page is out of service now that A released it; nothing else leaked.
    assert_eq!(core.pool().tag(pages_a[0]), Some(PageTag::Quarantined));
    let c = core.counters();
    assert_eq!((c.quarantined_pages, c.allocated_pages), (1, 0));
    assert_eq!(c.free_pages, c.total_pages - 1);
}

#[test]
fn a_foreign_page_behind_a_prefill_tile_is_refused_before_the_tile_reads_it() {
    let m = model();
    let prompt_a = m
        .tokenizer()
        .encode("Tenant A's secret: the vault code is 4471.")
        .unwrap();
    // Long enough for several chunks of several rows each: the blocked
    // kernel's tiles read every earlier page of B for each chunk.
    let text = "Tell me a long story about a lighthouse keeper and the ships. ".repeat(8);
    let prompt_b = m.tokenizer().encode(&text).unwrap();
    assert!(prompt_b.len() > 96, "{}", prompt_b.len());
    let mut config = EngineConfig::with_budget(64 << 20);
    config.step_tokens = 32;
    let mut core = EngineCore::new(m, &config).expect("engine core");
    let (a, mut rx_a) = submit(&mut core, 1, greedy(prompt_a, 24));
    while token_ids(&drain(&mut rx_a)).is_empty() {
        assert!(core.step());
    }
    let (b, mut rx_b) = submit(&mut core, 2, greedy(prompt_b, 8));
    // B's first chunk: its first two pages are written.
    assert!(core.step());
    assert!(drain(&mut rx_b).is_empty(), "B is still prefilling");
    let pages_a = core.pages_of(a.request()).unwrap();

    // B's first entry now names A's first page; B's next chunk is a tile
    // of many rows that attends over B's first pages.
    assert!(core.redirect_page_for_fault_injection(b.request(), 0, a.request(), 0));
    assert!(core.step());
    let after_b = drain(&mut rx_b);
    match after_b.as_slice() {
        [SeqEvent::Failed(EngineError::Integrity(v))] => {
            assert_eq!(v.page, pages_a[0]);
            assert_eq!(v.owner, b);
        }
        other => panic!("expected one integrity failure and no token, got {other:?}"),
    }
    assert_eq!(core.counters().owner_violations, 1);
    // A goes on to the end.
    while core.step() {}
    assert!(
        drain(&mut rx_a)
            .iter()
            .any(|e| matches!(e, SeqEvent::Finished { .. }))
    );
}

#[test]
fn a_request_that_can_never_fit_after_a_quarantine_is_refused_and_the_queue_moves_on() {
    let m = model();
    let mut core = EngineCore::new(m, &EngineConfig::with_budget(8 << 20)).expect("engine core");
    let limits = core.limits();
    // One owner violation takes a page out of service for good.
    let (a, mut rx_a) = submit(&mut core, 1, greedy(vec![28; 20], 8));
    let (b, mut rx_b) = submit(&mut core, 2, greedy(vec![29; 20], 8));
    assert!(core.step());
    assert!(core.redirect_page_for_fault_injection(b.request(), 0, a.request(), 0));
    while core.step() {}
    assert!(matches!(
        drain(&mut rx_b).last(),
        Some(SeqEvent::Failed(EngineError::Integrity(_)))
    ));
    assert!(matches!(
        drain(&mut rx_a).last(),
        Some(SeqEvent::Finished { .. })
    ));
    assert_eq!(core.counters().quarantined_pages, 1);
    assert_eq!(
        core.limits().pool_tokens(),
        limits.pool_tokens(),
        "admission still uses the limits measured at start"
    );

    // Admitted against the whole pool, it can never be allocated now; the
    // small request queued behind it must still be served.
    let biggest = limits.max_request_tokens();
    let (_, mut rx_big) = submit(&mut core, 3, greedy(vec![28; biggest - 1], 1));
    let (_, mut rx_small) = submit(&mut core, 4, greedy(vec![30; 8], 4));
    let mut steps = 0;
    while core.step() {
        steps += 1;
        assert!(steps < 100, "the queue is stuck");
    }
    match drain(&mut rx_big).as_slice() {
        [
            SeqEvent::Failed(EngineError::Rejected(AdmissionError::PoolCapacityExceeded {
                limit,
                ..
            })),
        ] => {
            assert_eq!(*limit, limits.pool_tokens() - limits.page_size());
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let small = drain(&mut rx_small);
    assert_eq!(token_ids(&small).len(), 4, "{small:?}");
    let c = core.counters();
    assert_eq!((c.allocated_pages, c.quarantined_pages), (0, 1));
}

#[test]
fn every_page_returns_after_finished_cancelled_failed_and_rejected_requests() {
    let e = engine(16);
    let tok = e.tokenizer();
    let total = e.counters().unwrap().total_pages;

    // Finished by length, by EOS or stop string.
    let (ids, _, end) = run(&e, 1, greedy(tok.encode("Count to five:").unwrap(), 8));
    assert_eq!(ids.len(), 8);
    assert!(matches!(end, SeqEvent::Finished { .. }));
    let mut stop = greedy(tok.encode("The quick brown fox").unwrap(), 64);
    stop.stop = vec!["bear".into()];
    let (_, text, end) = run(&e, 2, stop);
    assert!(!text.contains("bear"), "{text}");
    assert!(matches!(end, SeqEvent::Finished { .. }));

    // Cancelled mid-generation by dropping the handle (a client disconnect).
    let mut h = e
        .submit(
            TenantId::new(3),
            greedy(tok.encode("Write a long poem.").unwrap(), 200),
        )
        .unwrap();
    assert!(matches!(h.blocking_next(), Some(SeqEvent::Token { .. })));
    drop(h);
    // Cancelled while still waiting for pages: six requests of 13 pages each
    // against a 45-page pool, so at most three run and the rest wait.
    assert_eq!(total, 45);
    let long: Vec<_> = (0..6)
        .map(|i| {
            e.submit(
                TenantId::new(4),
                greedy(tok.encode(&format!("Story {i}:")).unwrap(), 200),
            )
            .unwrap()
        })
        .collect();
    drop(long);

    // Rejected: longer than the pool.
    let limit = e.info().limits.max_request_tokens();
    let err = e
        .submit(TenantId::new(5), greedy(vec![28; limit], 1))
        .unwrap_err();
    assert!(matches!(err, AdmissionError::PoolCapacityExceeded { .. }));

    // The engine processes cancellations asynchronously: wait (bounded) for it.
    let mut c = e.counters().unwrap();
    for _ in 0..200 {
        if c.allocated_pages == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        c = e.counters().unwrap();
    }
    assert_eq!(
        (c.free_pages, c.allocated_pages, c.quarantined_pages),
        (total, 0, 0)
    );
    assert_eq!(c.allocations, c.releases);
}

#[test]
fn a_rejected_over_long_prompt_leaves_the_pool_untouched() {
    // The incident's configuration: a pool smaller than the context window.
    let e = engine(8);
    let info = e.info().clone();
    assert!(info.limits.pool_tokens() < info.limits.context_window());
    let before = e.counters().unwrap();

    let over_pool = e.submit(
        TenantId::new(1),
        greedy(vec![28; info.limits.pool_tokens()], 1),
    );
    assert_eq!(
        over_pool.unwrap_err(),
        AdmissionError::PoolCapacityExceeded {
            prompt_tokens: info.limits.pool_tokens(),
            max_tokens: 1,
            limit: info.limits.pool_tokens(),
        }
    );
    let over_window = e.submit(
        TenantId::new(1),
        greedy(vec![28; info.limits.context_window() + 1], 1),
    );
    assert!(matches!(
        over_window.unwrap_err(),
        AdmissionError::ContextWindowExceeded { .. }
    ));
    let no_room_for_output = e.submit(
        TenantId::new(1),
        greedy(vec![28; info.limits.pool_tokens() - 4], 5),
    );
    assert!(matches!(
        no_room_for_output.unwrap_err(),
        AdmissionError::PoolCapacityExceeded { .. }
    ));

    assert_eq!(e.counters().unwrap(), before);
    // The largest admissible request still runs.
    let (ids, _, _) = run(&e, 1, greedy(vec![28; info.limits.pool_tokens() - 2], 2));
    assert_eq!(ids.len(), 2);
}
