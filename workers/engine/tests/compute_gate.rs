//! The compute gate as an engine keeps it: held from its first step of
//! work to its last, free while it waits for requests.

mod common;

use bulkhead_engine::{Engine, EngineConfig, SeqEvent};
use bulkhead_kv::TenantId;
use common::{greedy, model};
use std::fs::{File, TryLockError};
use std::time::{Duration, Instant};

/// Whether an engine holds the gate at `probe`'s file.
fn held(probe: &File) -> bool {
    match probe.try_lock() {
        Ok(()) => {
            probe.unlock().expect("unlock");
            false
        }
        Err(TryLockError::WouldBlock) => true,
        Err(TryLockError::Error(e)) => panic!("probing the gate: {e}"),
    }
}

/// Waits up to ten seconds for `want`; whether it came.
fn comes(probe: &File, want: bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if held(probe) == want {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

#[test]
fn an_engine_holds_its_compute_gate_while_it_generates_and_frees_it_when_idle() {
    let path = std::env::temp_dir().join(format!("bulkhead-engine-gate-{}", std::process::id()));
    let mut c = EngineConfig::with_budget(64 << 20);
    c.threads = 2;
    c.compute_gate = Some(path.clone());
    let engine = Engine::start(model(), &c).expect("engine starts");
    let probe = File::open(&path).expect("the engine made the gate file");
    assert!(comes(&probe, false), "an idle engine holds the gate");

    let prompt: Vec<u32> = (0..48).map(|i| 100 + i).collect();
    let mut h = engine
        .submit(TenantId::new(1), greedy(prompt, 160))
        .expect("admitted");
    let mut tokens = 0;
    while let Some(ev) = h.blocking_next() {
        match ev {
            SeqEvent::Token { .. } => {
                tokens += 1;
                // With 159 steps to go (a second or so), the engine
                // computes: a probe this late in them would be a wait of
                // that long on this thread.
                if tokens == 1 {
                    assert!(held(&probe), "a generating engine left the gate free");
                }
            }
            SeqEvent::Finished { .. } => break,
            other => panic!("unexpected event {other:?}"),
        }
    }
    assert_eq!(tokens, 160);
    assert!(comes(&probe, false), "the engine kept the gate once idle");

    // A gate file that cannot be opened is refused at start, by name.
    let mut bad = EngineConfig::with_budget(64 << 20);
    bad.compute_gate = Some(path.join("not-a-directory").join("gate"));
    let err = Engine::start(model(), &bad).expect_err("refused");
    assert!(err.to_string().contains("compute gate"), "{err}");
    drop(engine);
    let _ = std::fs::remove_file(&path);
}
