//! Serving under load, between real prefill and decode processes: admission
//! counts the prefill work queued ahead of a prompt, so a prompt that would
//! miss its deadline behind others is refused at once (503
//! `prefill_queue_full`, with when to retry), not failed after waiting; and a
//! transfer that waits its turn in the prefill queue is kept alive by
//! progress frames that carry its place, whatever the decode side's
//! deadline.

mod support;

use serde_json::{Value, json};
use std::time::{Duration, Instant};
use support::*;

/// A request on its own thread: its answer and how long it took.
fn send(addr: String, tenant: u64, body: Value) -> std::thread::JoinHandle<(Response, Duration)> {
    std::thread::spawn(move || {
        let t = Instant::now();
        let r = generate(&addr, tenant, &body);
        (r, t.elapsed())
    })
}

/// A prefill worker (with `prefill_extra`, a pool of `mib` MiB) and a
/// decode worker (with `decode_extra`, a pool of 256 MiB) linked to it, on
/// one thread each.
fn pair(mib: &str, prefill_extra: &[&str], decode_extra: &[&str]) -> (Worker, Worker) {
    let p = prefill_with(&["--kv-budget-mib", mib, "--threads", "1"], prefill_extra);
    let pool = ["--kv-budget-mib", "256", "--threads", "1"];
    let d = decode_with(&p.addr("transfer"), &pool, decode_extra);
    (p, d)
}

#[test]
fn a_prompt_that_would_miss_its_deadline_behind_queued_work_is_refused_at_once() {
    // Both pools hold two prompts: only the queue can refuse the second.
    let (p, d) = pair("256", &["--prefill-deadline-secs", "4"], &[]);
    let (dh, ph) = (d.addr("http"), p.addr("http"));
    // The longest prompt this prefill worker computes alone in 4 s, as the
    // pair's refusal of a longer one (within the window) names it.
    let r = generate(&dh, 1, &json!({"tokens": tokens(8_000), "max_tokens": 1}));
    let v: Value = serde_json::from_str(&r.body).expect("JSON");
    assert_eq!(v["error"]["code"], "prefill_too_long", "{v}");
    let limit = v["error"]["overflow"]["limit"].as_u64().expect("the limit") as usize;
    // Each costs at least 64% of the deadline (the cost grows at least
    // linearly and at most quadratically with length): one fits alone, two
    // do not.
    let n = limit * 4 / 5;
    assert!(n >= 64, "this machine prefills {limit} tokens in 4 s");
    let first = send(
        dh.clone(),
        1,
        json!({"tokens": tokens(n), "max_tokens": 2, "ignore_eos": true}),
    );
    // Once the first is queued at prefill, the second is refused at once.
    let s = wait_stats(&ph, |s| {
        s["transfer"]["queued_prefill_ms"].as_u64() > Some(0)
    });
    assert!(
        s["transfer"]["queued_prefill_ms"].as_u64() > Some(0),
        "the first prompt never queued: {s}"
    );
    let t = Instant::now();
    let second = generate(
        &dh,
        2,
        &json!({"tokens": tokens(n), "max_tokens": 2, "ignore_eos": true}),
    );
    let took = t.elapsed();
    assert_eq!(second.status, 503, "{}", second.body);
    let v: Value = serde_json::from_str(&second.body).expect("JSON");
    assert_eq!(v["error"]["code"], "prefill_queue_full", "{v}");
    let retry = v["error"]["retry_after_ms"]
        .as_u64()
        .expect("when to retry");
    assert!(
        retry > 0 && retry <= 4_000,
        "retry in {retry} ms, within the 4 s deadline: {v}"
    );
    assert!(
        took < Duration::from_secs(1),
        "refused in {took:?}, not at once"
    );
    let (r, _) = first.join().expect("first");
    assert_eq!(r.status, 200, "the first prompt is served: {}", r.body);
    // Every charge came back: the queue is empty, and the same prompt is
    // taken now.
    let s = wait_stats(&ph, |s| s["transfer"]["queued_prefill_ms"] == 0);
    assert_eq!(s["transfer"]["queued_prefill_ms"], 0, "{s}");
    assert_eq!(s["transfer"]["rejected"], 1, "the queued refusal: {s}");
    let again = generate(
        &dh,
        2,
        &json!({"tokens": tokens(n), "max_tokens": 2, "ignore_eos": true}),
    );
    assert_eq!(again.status, 200, "{}", again.body);
    assert_baseline(&[&dh, &ph]);
}

#[test]
fn a_transfer_waiting_its_turn_in_the_prefill_queue_is_kept_alive_by_progress_frames() {
    // Prefill's pool holds the first prompt but not both; decode's holds
    // both, so the second waits at prefill, for pages, for as long as the
    // first takes: several times the decode side's 1 s deadline.
    let (p, d) = pair("64", &[], &["--transfer-timeout-ms", "1000"]);
    let (dh, ph) = (d.addr("http"), p.addr("http"));
    let pool = &stats(&ph)["pool"];
    let page_size = pool["page_size"].as_u64().expect("page size") as usize;
    let capacity = pool["total_pages"].as_u64().expect("pages") as usize * page_size;
    let first_len = 2_500.min(capacity - 4 * page_size);
    let second_len = capacity - first_len + 2 * page_size;
    let first = send(
        dh.clone(),
        1,
        json!({"tokens": tokens(first_len), "max_tokens": 2, "ignore_eos": true}),
    );
    wait_stats(&ph, |s| s["pool"]["allocated_pages"].as_u64() > Some(0));
    let second = send(
        dh.clone(),
        2,
        json!({"tokens": tokens(second_len), "max_tokens": 2, "ignore_eos": true}),
    );
    let (r1, _) = first.join().expect("first");
    let (r2, waited) = second.join().expect("second");
    assert_eq!(r1.status, 200, "{}", r1.body);
    assert_eq!(
        r2.status, 200,
        "the queued transfer was not kept alive: {}",
        r2.body
    );
    // The fault was there: the second waited past the deadline, twice over,
    // and heard of its place in the queue meanwhile.
    assert!(
        waited > Duration::from_secs(2),
        "the second prompt waited {waited:?}, within the 1 s deadline twice over: the test proves nothing"
    );
    let s = stats(&ph);
    assert!(
        s["transfer"]["queued_reports"].as_u64() > Some(0),
        "no progress frame carried a place in the queue: {s}"
    );
    assert_eq!(stats(&dh)["transfer"]["committed"], 2);
    assert_baseline(&[&dh, &ph]);
}
