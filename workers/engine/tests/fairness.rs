//! One tenant's long prompts do not hold back another tenant's short one:
//! prefill chunks are shared across tenants every step.

mod common;

use bulkhead_engine::{EngineConfig, EngineCore, SeqEvent};
use bulkhead_kv::TenantId;
use common::{greedy, model};
use tokio::sync::mpsc::unbounded_channel;

#[test]
fn a_short_prompt_runs_in_the_first_step_despite_another_tenants_long_prompts() {
    let mut core =
        EngineCore::new(model(), &EngineConfig::with_budget(64 << 20)).expect("engine core");
    let limits = core.limits();
    // Tenant B queued two 600-token prompts first: two steps of 512
    // tokens each to get through even one of them alone.
    let mut b = Vec::new();
    for _ in 0..2 {
        let (tx, rx) = unbounded_channel();
        let admitted = EngineCore::admit(&limits, TenantId::new(2), greedy(vec![28; 600], 2), tx)
            .expect("admitted");
        core.submit(admitted);
        b.push(rx);
    }
    let (tx, mut a) = unbounded_channel();
    let admitted =
        EngineCore::admit(&limits, TenantId::new(1), greedy(vec![30; 4], 4), tx).expect("admitted");
    core.submit(admitted);

    assert!(core.step());
    assert!(
        matches!(a.try_recv(), Ok(SeqEvent::Token { .. })),
        "A's first token comes out of the first step"
    );
    for rx in &mut b {
        assert!(
            rx.try_recv().is_err(),
            "B's prompts are still being computed"
        );
    }
    // Everyone finishes.
    while core.step() {}
    let mut ends = 0;
    for rx in b.iter_mut().chain(std::iter::once(&mut a)) {
        while let Ok(ev) = rx.try_recv() {
            if matches!(ev, SeqEvent::Finished { .. }) {
                ends += 1;
            }
            assert!(!matches!(ev, SeqEvent::Failed(_)), "{ev:?}");
        }
    }
    assert_eq!(ends, 3);
}

#[test]
fn a_request_that_fits_is_not_queued_behind_another_tenants_waiting_ones() {
    // 45 pages of 16 tokens.
    let mut core =
        EngineCore::new(model(), &EngineConfig::with_budget(16 << 20)).expect("engine core");
    let limits = core.limits();
    assert_eq!(core.counters().total_pages, 45);
    let submit = |core: &mut EngineCore, tenant: u64, prompt: usize, max: usize| {
        let (tx, rx) = unbounded_channel();
        let admitted = EngineCore::admit(
            &limits,
            TenantId::new(tenant),
            greedy(vec![28 + tenant as u32; prompt], max),
            tx,
        )
        .expect("admitted");
        core.submit(admitted);
        rx
    };
    // Tenant B: two requests of 20 pages run, a third of 20 waits (5 free).
    let mut b1 = submit(&mut core, 2, 16, 304);
    let _b2 = submit(&mut core, 2, 16, 304);
    let mut b3 = submit(&mut core, 2, 16, 304);
    // Tenant A: 4 pages, after B's third.
    let mut a = submit(&mut core, 1, 16, 48);
    assert!(core.step());
    assert!(matches!(b1.try_recv(), Ok(SeqEvent::Token { .. })));
    assert!(b3.try_recv().is_err(), "B's third waits for pages");
    assert!(
        matches!(a.try_recv(), Ok(SeqEvent::Token { .. })),
        "A's request fits and runs at once, not behind B's queue"
    );
    assert_eq!(core.counters().free_pages, 1);
}
