//! One decode worker linked to two prefill workers, as OS processes over
//! TCP: requests spread over both by load; a prefill worker killed with
//! SIGKILL mid-transfer takes only the transfers open on it (they fail with
//! `kv_transfer_failed`, no token sent), new requests go to the other, and
//! every page comes back.

mod support;

use serde_json::{Value, json};
use std::time::{Duration, Instant};
use support::{assert_baseline, decode_fleet, generate, prefill, stats, tokens, wait_stats};

/// The prefill workers a decode worker's `/stats` says it is linked to.
fn linked(s: &Value) -> usize {
    s["prefills"].as_array().map_or(0, Vec::len)
}

#[test]
fn a_decode_worker_spreads_over_its_prefill_workers_and_survives_losing_one() {
    // The first prefill worker's link is slow (every frame waits 300 ms), so
    // a transfer on it is surely in flight when it is killed.
    let mut slow = prefill(&["--page-delay-ms", "300"]);
    let fast = prefill(&[]);
    let d = decode_fleet(&[&slow.addr("transfer"), &fast.addr("transfer")], &[]);
    let daddr = d.addr("http");
    let s = wait_stats(&daddr, |s| linked(s) == 2);
    assert_eq!(linked(&s), 2, "linked to both: {s}");

    // Four at once: fewest in flight first, so both prefill workers get some.
    let clients: Vec<_> = (0..4)
        .map(|i| {
            let a = daddr.clone();
            std::thread::spawn(move || {
                generate(&a, 10 + i, &json!({"tokens": tokens(40), "max_tokens": 4}))
            })
        })
        .collect();
    for c in clients {
        let r = c.join().expect("client");
        assert_eq!(r.status, 200, "{}", r.body);
    }
    for p in [&slow, &fast] {
        let s = stats(&p.addr("http"));
        assert!(
            s["transfer"]["requests"].as_u64() >= Some(1),
            "{} prefilled nothing: {s}",
            p.addr("http")
        );
    }

    // Steady traffic from four clients while the slow prefill worker dies
    // mid-transfer.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|i| {
            let a = daddr.clone();
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut out = Vec::new();
                let mut k = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // A new first token each time: no prompt is one the
                    // decode worker already holds (it would finish that
                    // itself, with no transfer).
                    let mut prompt = tokens(60);
                    prompt[0] = 1000 + k;
                    k += 1;
                    out.push(generate(
                        &a,
                        20 + i,
                        &json!({"tokens": prompt, "max_tokens": 4}),
                    ));
                }
                out
            })
        })
        .collect();
    let during = wait_stats(&slow.addr("http"), |s| {
        s["transfer"]["delayed_frames"].as_u64() > Some(0)
            && s["pool"]["allocated_pages"].as_u64() > Some(0)
    });
    assert!(
        during["pool"]["allocated_pages"].as_u64() > Some(0),
        "a transfer is in flight on the slow prefill worker: {during}"
    );
    assert_eq!(slow.kill9(), Some(9), "prefill was killed by SIGKILL");
    // Keep serving for a while after the loss.
    let after = Instant::now();
    let served_before = stats(&fast.addr("http"))["transfer"]["requests"]
        .as_u64()
        .unwrap_or(0);
    // At least 3 s, and until the survivor has taken a request since (on
    // a loaded machine the first may take longer than that).
    let served = || {
        stats(&fast.addr("http"))["transfer"]["requests"]
            .as_u64()
            .unwrap_or(0)
    };
    while after.elapsed() < Duration::from_secs(3)
        || (served() <= served_before && after.elapsed() < Duration::from_secs(60))
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut ok = 0;
    let mut failed = 0;
    for c in clients {
        for r in c.join().expect("client") {
            match r.status {
                200 => {
                    let (ids, _) = r.tokens();
                    assert!(!ids.is_empty(), "a 200 carries its tokens: {}", r.body);
                    ok += 1;
                }
                502 => {
                    assert!(r.body.contains("kv_transfer_failed"), "{}", r.body);
                    assert!(!r.body.contains("\"token\""), "{}", r.body);
                    failed += 1;
                }
                s => panic!("unexpected status {s}: {}", r.body),
            }
        }
    }
    assert!(
        failed >= 1,
        "the transfer in flight on the dead worker failed"
    );
    assert!(
        failed <= 4,
        "only transfers open on the dead worker failed ({failed} of {})",
        ok + failed
    );
    let s = stats(&daddr);
    assert!(
        s["transfer"]["connection_losses"].as_u64() >= Some(1),
        "{s}"
    );
    assert_eq!(linked(&s), 1, "linked to the survivor only: {s}");
    assert!(
        stats(&fast.addr("http"))["transfer"]["requests"].as_u64() > Some(served_before),
        "the survivor took the new requests"
    );
    // Once the loss is known, every new request succeeds.
    for i in 0..4 {
        let r = generate(
            &daddr,
            30 + i,
            &json!({"tokens": tokens(30), "max_tokens": 4}),
        );
        assert_eq!(r.status, 200, "{}", r.body);
    }
    assert_baseline(&[&daddr, &fast.addr("http")]);
}

/// With several prefill workers, a tenant's prompts keep meeting the one
/// that cached them (ties in load go by the tenant's own namespace), so
/// its second and third prompts, each continuing the one before by more
/// than the decode worker finishes itself, reuse the cached pages there.
#[test]
fn a_tenants_prompts_return_to_the_prefill_worker_that_cached_them() {
    let a = prefill(&[]);
    let b = prefill(&[]);
    let d = decode_fleet(&[&a.addr("transfer"), &b.addr("transfer")], &[]);
    let daddr = d.addr("http");
    assert_eq!(linked(&wait_stats(&daddr, |s| linked(s) == 2)), 2);
    let prompt = tokens(320);
    let hits = |w: &support::Worker| stats(&w.addr("http"))["pool"]["prefix_hit_tokens"].as_u64();
    for n in [200, 260, 320] {
        let case = json!({"tokens": &prompt[..n], "max_tokens": 4, "ignore_eos": true});
        let r = generate(&daddr, 21, &case);
        assert_eq!(r.status, 200, "{}", r.body);
        assert_baseline(&[&daddr, &a.addr("http"), &b.addr("http")]);
    }
    let (ha, hb) = (hits(&a).unwrap_or(0), hits(&b).unwrap_or(0));
    // Each reuses every full page of the prompt before it, on one worker.
    assert_eq!(
        (ha.max(hb), ha.min(hb)),
        (199 / 16 * 16 + 259 / 16 * 16, 0),
        "{ha} {hb}"
    );
    // The decode worker finished none of them itself.
    assert_eq!(stats(&daddr)["transfer"]["committed"].as_u64(), Some(3));
}
