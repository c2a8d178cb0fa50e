//! What only the engine's insides show: a batch prompt makes no progress
//! while an interactive prompt lands from a prefill worker (the landing
//! sequence computes nothing here, so the scheduler's other guards do not
//! see it).

use super::super::*;
use crate::fetch::{Progress, Source, ensure_default_model};
use crate::{GenerateRequest, WorkClass};
use bulkhead_kv::{TenantId, TransferId};
use tokio::sync::mpsc::unbounded_channel;

#[test]
// The model cache comes from the environment, as in every test process.
#[allow(clippy::disallowed_methods)]
fn batch_prompts_wait_while_an_interactive_prompt_lands_from_a_prefill_worker() {
    let path = ensure_default_model(&Source::from_vars(|k| std::env::var_os(k), Progress::Quiet))
        .expect("default model");
    let model = Arc::new(ModelFile::load(&path).expect("model loads"));
    let mut core = EngineCore::new(model, &EngineConfig::with_budget(64 << 20)).expect("core");
    let limits = core.limits();
    let (tx, _b) = unbounded_channel();
    let batch = GenerateRequest {
        class: WorkClass::Batch,
        ..GenerateRequest::fixed_length(vec![30; 900], 2)
    };
    core.submit(EngineCore::admit(&limits, TenantId::new(2), batch, tx).expect("admitted"));
    assert!(core.step(), "B's prompt started");
    let computed = |core: &EngineCore| {
        core.running
            .iter()
            .find(|s| s.class == WorkClass::Batch)
            .map(|s| s.computed)
    };
    let before = computed(&core).expect("B runs");
    assert!(before < 900, "B's prompt is not done in one step");
    // A's interactive prompt (past what a decode worker computes itself)
    // is to land from a prefill worker through a transfer.
    let (atx, _a) = unbounded_channel();
    let (grant, _granted) = oneshot::channel();
    let a = GenerateRequest::fixed_length(vec![28; 300], 1);
    let landing = Some((TransferId::new(9), grant));
    core.submit(
        EngineCore::admit_with(&limits, TenantId::new(1), a, atx, landing).expect("admitted"),
    );
    for _ in 0..4 {
        core.step();
    }
    assert!(core.running.iter().any(|s| !s.runnable()), "A is landing");
    assert_eq!(
        computed(&core),
        Some(before),
        "B's prompt moved while A's was landing"
    );
}
