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
