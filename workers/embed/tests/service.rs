//! The embedding thread: calls over the limits are refused before they are
//! queued; queued calls share passes, a small call is not held behind a
//! large one, and every call gets exactly the vectors it would get alone.

// Tests read their services from the environment (clippy.toml keeps
// library code from it).
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)]

use bulkhead_embed::{EmbedService, Embedder, Limits, Refusal, Tokens, package};
use bulkhead_engine::ComputeGate;
use bulkhead_engine::fetch::{Progress, Source};
use std::time::Instant;

fn service(limits: Limits, pass_tokens: usize) -> EmbedService {
    service_behind(limits, pass_tokens, None)
}

fn service_behind(limits: Limits, pass_tokens: usize, gate: Option<ComputeGate>) -> EmbedService {
    let source = Source::from_vars(|k| std::env::var_os(k), Progress::Quiet);
    let dir = package::ensure(&source).expect("embedding model");
    let e = Embedder::load(&dir).expect("model loads");
    EmbedService::start(e, limits, (2, pass_tokens), gate).expect("started")
}

fn tokens(s: &EmbedService, texts: &[String]) -> Vec<Tokens> {
    texts
        .iter()
        .map(|t| s.embedder().tokenize(t).expect("tokenized"))
        .collect()
}

#[test]
fn calls_over_the_limits_are_refused_before_they_are_queued() {
    let s = service(
        Limits {
            max_inputs: 3,
            max_tokens: 40,
        },
        1_024,
    );
    assert_eq!(s.admit(Vec::new()).unwrap_err(), Refusal::Empty);
    let four: Vec<String> = (0..4).map(|i| format!("input {i}")).collect();
    assert_eq!(
        s.admit(tokens(&s, &four)).unwrap_err(),
        Refusal::TooManyInputs { given: 4, limit: 3 }
    );
    let long = vec!["word ".repeat(50)];
    let err = s.admit(tokens(&s, &long)).unwrap_err();
    assert_eq!(
        err,
        Refusal::TooManyTokens {
            given: 52,
            limit: 40
        }
    );
    assert!(err.to_string().contains("at most 40"), "{err}");
    let ok = s.admit(tokens(&s, &four[..3])).expect("within the limits");
    assert_eq!(
        ok.tokens(),
        ok.inputs().iter().map(Tokens::len).sum::<usize>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_call_is_answered_before_a_large_one_queued_ahead_of_it() {
    // Passes of 512 tokens: the large call takes 16 of them.
    let s = service(Limits::default(), 512);
    let large: Vec<String> = (0..32)
        .map(|i| format!("paragraph {i}: ") + &"the river runs past the mill. ".repeat(40))
        .collect();
    let small = vec!["A short question?".to_owned()];
    let (large_t, small_t) = (tokens(&s, &large), tokens(&s, &small));
    assert!(large_t.iter().all(|t| t.len() == 256));
    let alone = s.embedder().embed(&small_t).expect("alone");
    let large_alone = s.embedder().embed(&large_t[..2]).expect("alone");

    let started = Instant::now();
    let big = {
        let (s, call) = (s.clone(), s.admit(large_t).expect("admitted"));
        tokio::spawn(async move { (s.embed(call).await, started.elapsed()) })
    };
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let v = s
        .embed(s.admit(small_t).expect("admitted"))
        .await
        .expect("small");
    let small_done = started.elapsed();
    let (big, big_done) = big.await.expect("joined");
    let big = big.expect("large");
    assert!(
        small_done < big_done,
        "small answered at {small_done:?}, large at {big_done:?}"
    );
    assert_eq!(v, alone, "the small call's vector, packed with another's");
    assert_eq!(big.len(), 32);
    assert_eq!(&big[..2], large_alone.as_slice());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_held_compute_gate_a_call_waits_and_still_moves_to_the_same_vectors() {
    let path = std::env::temp_dir().join(format!("bulkhead-embed-gate-{}", std::process::id()));
    let mut engine = ComputeGate::open(&path).expect("gate");
    let s = service_behind(
        Limits::default(),
        4_096,
        Some(ComputeGate::open(&path).expect("gate")),
    );
    let texts: Vec<String> = (0..4).map(|i| format!("a sentence about {i}")).collect();
    let alone = s
        .embedder()
        .embed(&tokens(&s, &texts))
        .expect("computed without the service");

    // An engine that computes all along: each piece of the pass waits
    // its most first (6 layers, 4 pieces each), so the call takes seconds.
    engine.hold().expect("an engine computes");
    let call = s.admit(tokens(&s, &texts)).expect("admitted");
    let service = s.clone();
    let start = std::time::Instant::now();
    let mut answer = tokio::spawn(async move { service.embed(call).await });
    let early = tokio::time::timeout(std::time::Duration::from_millis(400), &mut answer).await;
    assert!(
        early.is_err(),
        "the call was computed while the gate was held"
    );
    let vectors = tokio::time::timeout(std::time::Duration::from_secs(60), answer)
        .await
        .expect("answered under a load that never paused")
        .expect("task")
        .expect("vectors");
    assert!(
        start.elapsed() >= bulkhead_embed::MOST_BEHIND * 24,
        "pieces went on before their wait: {:?}",
        start.elapsed()
    );
    assert_eq!(vectors, alone);
    assert_eq!(s.gate_waits().count(), 24, "each piece waited at the gate");
    assert!(s.gate_waits().waited() >= bulkhead_embed::MOST_BEHIND * 24);
    engine.release().expect("the engine is idle");
    let _ = std::fs::remove_file(&path);
}
