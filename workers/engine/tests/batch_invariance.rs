//! A request's greedy tokens do not depend on what else is in its batch:
//! alone, or batched with 1, 4 or 15 others, whether they prefill together,
//! it decodes while they prefill, or it prefills while they decode. The
//! prober's golden answers rest on this (a golden prompt has exactly one
//! right answer only if its neighbours cannot move it).
//!
//! The core is stepped here, on this thread, so every case is known to
//! share its forward passes: each asserts how many sequences ran together.

mod common;

use bulkhead_engine::{EngineConfig, EngineCore, GenerateRequest, SeqEvent};
use bulkhead_kv::TenantId;
use common::{golden, greedy, ids, model};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

/// Where the probe stands against its neighbours.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Everyone is submitted at once: prompts prefill together, then decode.
    Together,
    /// The probe is decoding when the others' prompts arrive.
    ProbeDecodesWhileOthersPrefill,
    /// The others are decoding when the probe's prompt arrives.
    ProbePrefillsWhileOthersDecode,
}

const PROBE_TOKENS: usize = 24;

fn core() -> EngineCore {
    let mut config = EngineConfig::with_budget(96 << 20);
    config.threads = 2;
    EngineCore::new(model(), &config).expect("engine core")
}

fn probe() -> GenerateRequest {
    let g = golden();
    greedy(ids(&g["cases"][2]["prompt_ids"]), PROBE_TOKENS)
}

/// The `i`th neighbour: prompts of different lengths and contents.
fn neighbour(i: usize) -> GenerateRequest {
    let len = 3 + 37 * i % 180;
    let prompt = (0..len).map(|j| 100 + ((i * 7919 + j * 31) % 20_000) as u32);
    greedy(prompt.collect(), 40)
}

fn submit(core: &mut EngineCore, tenant: u64, req: GenerateRequest) -> UnboundedReceiver<SeqEvent> {
    let (tx, rx) = unbounded_channel();
    let limits = core.limits();
    core.submit(EngineCore::admit(&limits, TenantId::new(tenant), req, tx).expect("admitted"));
    rx
}

/// Token ids so far, and whether the stream ended well.
fn drain(rx: &mut UnboundedReceiver<SeqEvent>, ids: &mut Vec<u32>) -> bool {
    let mut finished = false;
    while let Ok(ev) = rx.try_recv() {
        match ev {
            SeqEvent::Token { id, .. } => ids.push(id),
            SeqEvent::Finished { .. } => finished = true,
            other => panic!("unexpected event {other:?}"),
        }
    }
    finished
}

/// The probe's tokens with `others` neighbours in `phase`, and the most
/// sequences that ran in one step.
fn run(others: usize, phase: Phase) -> (Vec<u32>, usize) {
    let mut core = core();
    let mut probe_ids = Vec::new();
    let mut most = 0;
    let mut step = |core: &mut EngineCore| {
        let more = core.step();
        most = most.max(core.stats().running);
        more
    };
    let (mut p, mut rest): (_, Vec<_>) = match phase {
        Phase::Together => {
            let p = submit(&mut core, 1, probe());
            let rest = (0..others).map(|i| submit(&mut core, 2 + i as u64, neighbour(i)));
            (p, rest.collect())
        }
        Phase::ProbeDecodesWhileOthersPrefill => {
            let mut p = submit(&mut core, 1, probe());
            for _ in 0..3 {
                step(&mut core);
            }
            drain(&mut p, &mut probe_ids);
            assert!(!probe_ids.is_empty(), "the probe is decoding");
            let rest = (0..others).map(|i| submit(&mut core, 2 + i as u64, neighbour(i)));
            (p, rest.collect())
        }
        Phase::ProbePrefillsWhileOthersDecode => {
            let mut rest: Vec<_> = (0..others)
                .map(|i| submit(&mut core, 2 + i as u64, neighbour(i)))
                .collect();
            for _ in 0..3 {
                step(&mut core);
            }
            let mut scratch = Vec::new();
            for rx in &mut rest {
                drain(rx, &mut scratch);
            }
            assert!(!scratch.is_empty(), "the others are decoding");
            (submit(&mut core, 1, probe()), rest)
        }
    };
    while step(&mut core) {}
    assert!(drain(&mut p, &mut probe_ids), "the probe finished");
    for rx in &mut rest {
        assert!(drain(rx, &mut Vec::new()), "every neighbour finished");
    }
    (probe_ids, most)
}

#[test]
fn greedy_tokens_are_the_same_alone_and_batched_with_1_4_and_15_others() {
    let (alone, most) = run(0, Phase::Together);
    assert_eq!(most, 1);
    assert_eq!(alone.len(), PROBE_TOKENS);
    let mut failures = Vec::new();
    for others in [1, 4, 15] {
        for phase in [
            Phase::Together,
            Phase::ProbeDecodesWhileOthersPrefill,
            Phase::ProbePrefillsWhileOthersDecode,
        ] {
            let (got, most) = run(others, phase);
            assert_eq!(
                most,
                others + 1,
                "{others} others, {phase:?}: the probe shared its steps with all of them"
            );
            if got != alone {
                failures.push(format!("{others} others, {phase:?}: {got:?} != {alone:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
