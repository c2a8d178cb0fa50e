//! One tenant's long prompts do not hold back another tenant's short one:
//! prefill chunks are shared across tenants every step.

// Tests read their services from the environment (clippy.toml keeps
// library code from it).
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)]

mod common;

use bulkhead_engine::{EngineConfig, EngineCore, GenerateRequest, SeqEvent, WorkClass};
use bulkhead_kv::{Limits, TenantId};
use common::{greedy, model};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

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

/// An engine core with room for the tests' prompts, and its limits.
fn core_with_batch_line() -> (EngineCore, Limits) {
    let core = EngineCore::new(model(), &EngineConfig::with_budget(64 << 20)).expect("engine core");
    let limits = core.limits();
    (core, limits)
}

/// Queues tenant 2's batch-class line (an 8-token prompt, `max_tokens`
/// greedy tokens) and returns its events.
fn batch_line(
    core: &mut EngineCore,
    limits: &Limits,
    max_tokens: usize,
) -> UnboundedReceiver<SeqEvent> {
    let (tx, rx) = unbounded_channel();
    let flex = GenerateRequest {
        class: WorkClass::Batch,
        ..greedy(vec![30; 8], max_tokens)
    };
    core.submit(EngineCore::admit(limits, TenantId::new(2), flex, tx).expect("admitted"));
    rx
}

#[test]
fn batch_prompt_work_waits_for_interactive_work_of_any_tenant() {
    let (mut core, limits) = core_with_batch_line();
    // Tenant B's short batch prompt (OpenAI's `service_tier: "flex"`) was
    // queued first; unclassed, it would run in the first step as the
    // tenant served least lately.
    let mut b = batch_line(&mut core, &limits, 2);
    // Tenant A's interactive prompt fills a whole step and more.
    let (tx, mut a) = unbounded_channel();
    let long = greedy(vec![28; 600], 2);
    core.submit(EngineCore::admit(&limits, TenantId::new(1), long, tx).expect("admitted"));

    assert!(core.step());
    assert!(b.try_recv().is_err(), "the batch prompt waited this step");
    assert!(a.try_recv().is_err(), "A's prompt is still being computed");
    // Once interactive work leaves room, batch work moves, and all ends.
    while core.step() {}
    for rx in [&mut a, &mut b] {
        let mut finished = false;
        while let Ok(ev) = rx.try_recv() {
            assert!(!matches!(ev, SeqEvent::Failed(_)), "{ev:?}");
            finished |= matches!(ev, SeqEvent::Finished { .. });
        }
        assert!(finished);
    }
}

#[test]
fn batch_sequences_pause_while_an_interactive_prompt_is_computed() {
    let (mut core, limits) = core_with_batch_line();
    // Tenant B's batch line is decoding.
    let mut b = batch_line(&mut core, &limits, 40);
    let tokens = |rx: &mut UnboundedReceiver<SeqEvent>| {
        std::iter::from_fn(|| rx.try_recv().ok())
            .filter(|ev| matches!(ev, SeqEvent::Token { .. }))
            .count()
    };
    while tokens(&mut b) == 0 {
        assert!(core.step(), "B's line ran");
    }
    assert!(core.step());
    assert_eq!(tokens(&mut b), 1, "B decodes a token a step");
    // Tenant A's interactive prompt takes more than one step: B's line
    // gets no token in them, and goes on once A's first token is out.
    let (tx, mut a) = unbounded_channel();
    let long = greedy(vec![28; 1_200], 4);
    core.submit(EngineCore::admit(&limits, TenantId::new(1), long, tx).expect("admitted"));
    let mut paused = 0;
    while tokens(&mut a) == 0 {
        assert!(core.step(), "A's prompt moved");
        assert_eq!(tokens(&mut b), 0, "B decoded while A's prompt was computed");
        paused += 1;
    }
    assert!(paused >= 2, "A's prompt took {paused} step(s)");
    assert!(core.step());
    assert_eq!(tokens(&mut b), 1, "B goes on beside A's decoding");
    while core.step() {}
}

#[test]
fn a_request_that_fits_is_not_queued_behind_another_tenants_waiting_ones() {
    // 45 pages of 16 tokens; every request reserves all its pages at once.
    let mut config = EngineConfig::with_budget(16 << 20);
    config.first_slice_tokens = 1 << 20;
    // Steps long enough for every prompt here: this is about joining.
    config.step_time = std::time::Duration::from_secs(5);
    let mut core = EngineCore::new(model(), &config).expect("engine core");
    let limits = core.limits();
    assert_eq!(core.counters().total_pages, 45);
    let submit = |core: &mut EngineCore, tenant: u64, prompt: usize, max: usize| {
        queue(core, &limits, tenant, prompt, max)
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

/// Admits and queues `prompt` tokens of `tenant` that may generate `max`.
fn queue(
    core: &mut EngineCore,
    limits: &Limits,
    tenant: u64,
    prompt: usize,
    max: usize,
) -> UnboundedReceiver<SeqEvent> {
    let (tx, rx) = unbounded_channel();
    let admitted = EngineCore::admit(
        limits,
        TenantId::new(tenant),
        greedy(vec![28 + tenant as u32; prompt], max),
        tx,
    )
    .expect("admitted");
    core.submit(admitted);
    rx
}

/// Events of one request so far: (token ids, finished with completion
/// tokens, failed).
fn drain(rx: &mut UnboundedReceiver<SeqEvent>) -> (Vec<u32>, Option<usize>, bool) {
    let (mut tokens, mut finished, mut failed) = (Vec::new(), None, false);
    while let Ok(ev) = rx.try_recv() {
        match ev {
            SeqEvent::Token { id, .. } => tokens.push(id),
            SeqEvent::Finished { usage, .. } => finished = Some(usage.completion_tokens),
            SeqEvent::Failed(e) => {
                eprintln!("failed: {e}");
                failed = true;
            }
        }
    }
    (tokens, finished, failed)
}

#[test]
fn a_tenant_whose_sequences_fill_the_pool_is_preempted_and_every_request_completes() {
    // 11 pages of 16 tokens; a request takes its prompt and 16 output
    // tokens at first and grows a page at a time.
    // Steps long enough, once two tenants share the engine (a quarter of
    // this), for A's whole prompt beside B's recompute: this is about pages.
    let config = EngineConfig {
        first_slice_tokens: 16,
        step_time: std::time::Duration::from_millis(800),
        ..EngineConfig::with_budget(4 << 20)
    };
    let mut core = EngineCore::new(model(), &config).expect("engine core");
    let limits = core.limits();
    assert_eq!(core.counters().total_pages, 11);
    let submit = |core: &mut EngineCore, tenant: u64, prompt: usize, max: usize| {
        queue(core, &limits, tenant, prompt, max)
    };
    // Tenant B: three requests that would hold 15 pages at the end.
    let mut b: Vec<_> = (0..3).map(|_| submit(&mut core, 2, 16, 64)).collect();
    assert!(core.step());
    assert_eq!(
        core.counters().free_pages,
        5,
        "each holds its prompt and first slice only"
    );
    let mut tokens: [Vec<u32>; 3] = Default::default();
    let mut steps = 0;
    while core.stats().preemptions == 0 {
        assert!(core.step(), "B runs until the pool is full");
        for (t, rx) in tokens.iter_mut().zip(&mut b) {
            let (n, _, failed) = drain(rx);
            assert!(!failed);
            t.extend(n);
        }
        steps += 1;
        assert!(steps < 200, "the pool fills");
    }
    // B alone may use the whole pool; it preempted its own youngest.
    assert_eq!(core.stats().preemptions, 1);
    // Tenant A arrives: it holds nothing, less than its share, so B gives
    // pages back at once and A's first token comes out of the next step.
    // (Its 48-token prompt and first slice need more pages than are free.)
    let mut a = submit(&mut core, 1, 48, 16);
    assert!(core.counters().free_pages < 4, "A needs pages B holds");
    assert!(core.step());
    let (first, _, failed) = drain(&mut a);
    assert!(!failed);
    assert_eq!(
        first.len(),
        1,
        "A's first token comes out of the first step"
    );
    let mut a_tokens = first;
    let mut a_done = None;
    let mut b_done = [None; 3];
    while core.step() {
        let (n, done, failed) = drain(&mut a);
        assert!(!failed);
        a_tokens.extend(n);
        a_done = a_done.or(done);
        for (i, rx) in b.iter_mut().enumerate() {
            let (n, done, failed) = drain(rx);
            assert!(!failed, "a preempted request resumes, it does not fail");
            tokens[i].extend(n);
            b_done[i] = b_done[i].or(done);
        }
    }
    assert_eq!((a_tokens.len(), a_done), (16, Some(16)));
    // Resumed, a request goes on exactly as if it had never stopped: the
    // same tokens as the same request alone in a large pool.
    let mut alone = EngineCore::new(model(), &EngineConfig::with_budget(64 << 20)).expect("core");
    let alone_limits = alone.limits();
    let mut reference = queue(&mut alone, &alone_limits, 2, 16, 64);
    while alone.step() {}
    let (expected, _, _) = drain(&mut reference);
    assert_eq!(expected.len(), 64);
    for i in 0..3 {
        assert_eq!(b_done[i], Some(64));
        assert_eq!(
            tokens[i], expected,
            "B's request {i} produced every token once, the same as alone"
        );
    }
    assert!(core.stats().preemptions >= 2);
    assert_eq!(core.counters().free_pages, 11);
}

#[test]
fn while_another_tenant_waits_no_tenant_takes_more_than_its_share_of_the_pool() {
    // 45 pages; a tenant may hold 22 while another waits.
    let mut config = EngineConfig::with_budget(16 << 20);
    config.first_slice_tokens = 1 << 20;
    let mut core = EngineCore::new(model(), &config).expect("engine core");
    let limits = core.limits();
    // B: two requests of 20 pages each; A: one of 30 pages, which cannot
    // fit next to B's first.
    let mut b1 = queue(&mut core, &limits, 2, 16, 304);
    let mut b2 = queue(&mut core, &limits, 2, 16, 304);
    let mut a = queue(&mut core, &limits, 1, 16, 464);
    for _ in 0..3 {
        assert!(core.step());
        let held = core.counters().allocated_pages;
        assert_eq!(
            held, 20,
            "B runs one request; its second would take it past half the pool"
        );
        assert!(
            drain(&mut b2).0.is_empty(),
            "B's second waits while A waits"
        );
        assert!(drain(&mut a).0.is_empty(), "A waits for pages");
    }
    assert!(!drain(&mut b1).0.is_empty());
}

#[test]
fn steps_are_shorter_while_another_tenant_has_just_used_the_engine() {
    // Steps until a 300-token prompt's first token: on an engine only its
    // own tenant has used, and on one another tenant used a moment ago
    // (its request already answered): then the steps are a quarter as long.
    let steps_to_first_token = |other_tenant_first: bool| {
        let mut core =
            EngineCore::new(model(), &EngineConfig::with_budget(64 << 20)).expect("engine core");
        let limits = core.limits();
        if other_tenant_first {
            let (tx, mut a) = unbounded_channel();
            let admitted = EngineCore::admit(&limits, TenantId::new(1), greedy(vec![30; 4], 1), tx)
                .expect("admitted");
            core.submit(admitted);
            while core.step() {}
            assert!(drain(&mut a).1.is_some(), "A was answered first");
        }
        let (tx, mut b) = unbounded_channel();
        let admitted = EngineCore::admit(&limits, TenantId::new(2), greedy(vec![28; 300], 1), tx)
            .expect("admitted");
        core.submit(admitted);
        let mut steps = 0;
        while drain(&mut b).0.is_empty() {
            assert!(core.step(), "B's prompt is computed");
            steps += 1;
        }
        steps
    };
    let alone = steps_to_first_token(false);
    let shared = steps_to_first_token(true);
    assert!(
        shared > 2 * alone,
        "{shared} steps beside a recent tenant against {alone} alone"
    );
}

#[test]
fn a_shared_step_of_batch_work_only_is_shorter_still() {
    // Steps until a 300-token prompt's first token, on an engine another
    // tenant used a moment ago: as an interactive request, and as a batch
    // line, whose steps (nothing interactive running) are six times
    // shorter again, so the next interactive request waits less.
    let steps_to_first_token = |class: WorkClass| {
        let mut core =
            EngineCore::new(model(), &EngineConfig::with_budget(64 << 20)).expect("engine core");
        let limits = core.limits();
        let mut a = queue(&mut core, &limits, 1, 4, 1);
        while core.step() {}
        assert!(drain(&mut a).1.is_some(), "A was answered first");
        let (tx, mut b) = unbounded_channel();
        let request = GenerateRequest {
            class,
            ..greedy(vec![28; 300], 1)
        };
        core.submit(EngineCore::admit(&limits, TenantId::new(2), request, tx).expect("admitted"));
        let mut steps = 0;
        while drain(&mut b).0.is_empty() {
            assert!(core.step(), "B's prompt is computed");
            steps += 1;
        }
        steps
    };
    let interactive = steps_to_first_token(WorkClass::Interactive);
    let batch = steps_to_first_token(WorkClass::Batch);
    assert!(
        batch > 3 * interactive,
        "{batch} batch-only steps against {interactive} interactive ones"
    );
}

/// Token events of `rx` so far.
fn token_count(rx: &mut UnboundedReceiver<SeqEvent>) -> usize {
    std::iter::from_fn(|| rx.try_recv().ok())
        .filter(|ev| matches!(ev, SeqEvent::Token { .. }))
        .count()
}

#[test]
fn decoding_sequences_take_turns_when_their_tokens_together_outlast_the_step() {
    // Steps of a millisecond: once the engine has timed a decode step,
    // six sequences no longer all decode in one.
    let run = |step: std::time::Duration| {
        let mut config = EngineConfig::with_budget(64 << 20);
        config.step_time = step;
        let mut core = EngineCore::new(model(), &config).expect("engine core");
        let limits = core.limits();
        let mut rxs: Vec<_> = (0..6)
            .map(|_| queue(&mut core, &limits, 2, 4, 16))
            .collect();
        let (mut fewest, mut tokens) = (usize::MAX, vec![0; 6]);
        while core.step() {
            let got: Vec<usize> = rxs.iter_mut().map(token_count).collect();
            let decoding = tokens.iter().filter(|&&t| t > 0 && t < 16).count();
            if decoding == 6 {
                fewest = fewest.min(got.iter().sum());
            }
            for (t, g) in tokens.iter_mut().zip(got) {
                *t += g;
            }
        }
        assert_eq!(tokens, vec![16; 6], "every sequence got all its tokens");
        fewest
    };
    assert_eq!(
        run(std::time::Duration::from_secs(5)),
        6,
        "all decode each step"
    );
    let fewest = run(std::time::Duration::from_millis(1));
    assert!(fewest < 6, "six sequences decoded together in every step");
}

#[test]
fn a_short_prompt_gets_a_step_of_its_own_before_the_next_tokens() {
    let mut core =
        EngineCore::new(model(), &EngineConfig::with_budget(64 << 20)).expect("engine core");
    let limits = core.limits();
    // Tenant B's four sequences are decoding.
    let mut b: Vec<_> = (0..4)
        .map(|_| queue(&mut core, &limits, 2, 8, 40))
        .collect();
    while b.iter_mut().map(token_count).sum::<usize>() == 0 {
        assert!(core.step(), "B's sequences ran");
    }
    assert!(core.step());
    assert_eq!(b.iter_mut().map(token_count).sum::<usize>(), 4);
    // Tenant A's 40-token prompt: its first token comes out of the next
    // step, which decodes none of B's; B goes on in the step after it.
    let mut a = queue(&mut core, &limits, 1, 40, 4);
    assert!(core.step());
    assert_eq!(token_count(&mut a), 1, "A's first token in the next step");
    assert_eq!(
        b.iter_mut().map(token_count).sum::<usize>(),
        0,
        "B decoded first"
    );
    // Another short prompt right behind it does not get the next step to
    // itself too: decoding never stops for a run of short prompts.
    let mut c = queue(&mut core, &limits, 3, 40, 4);
    assert!(core.step());
    assert!(
        b.iter_mut().map(token_count).sum::<usize>() > 0,
        "B goes on"
    );
    while core.step() {}
    assert_eq!(token_count(&mut c), 4, "C was answered");
}
