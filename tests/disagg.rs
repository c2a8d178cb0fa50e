//! Prefill and decode as separate OS processes over TCP: identical output
//! to the colocated engine, and every way a transfer can go wrong leaves no
//! page behind and decodes nothing from a page it should not.
//!
//! A frame-rewriting proxy between the two injects the faults; every fault test
//! first asserts that its fault was injected (frames the proxy changed, frames
//! the slowed link delayed, the SIGKILL that ended a worker), and every
//! worker's `/stats` returns to its baseline after each.

mod support;

use bulkhead_transfer::Message;
use serde_json::json;
use support::*;

#[test]
fn disaggregated_greedy_output_is_token_identical_to_colocated() {
    let p = prefill(&[]);
    let d = decode(&p.addr("transfer"), &[]);
    let c = colocated();
    let cases = [
        json!({"prompt": "What is the capital of France?", "max_tokens": 24}),
        json!({"prompt": "Write a haiku about the sea.", "max_tokens": 32}),
        json!({"raw": "The quick brown fox", "max_tokens": 16}),
        // 600 tokens: two prefill steps, pages sent in two batches.
        json!({"tokens": tokens(600), "max_tokens": 12, "ignore_eos": true}),
        // Exactly one page, and sampling with a seed.
        json!({"tokens": tokens(16), "max_tokens": 8, "temperature": 0.8, "seed": 7, "ignore_eos": true}),
    ];
    for (i, case) in cases.iter().enumerate() {
        let dis = generate(&d.addr("http"), 1 + i as u64, case);
        let col = generate(&c.addr("http"), 1 + i as u64, case);
        assert_eq!(dis.status, 200, "{}", dis.body);
        assert_eq!(col.status, 200, "{}", col.body);
        let (dt, dl) = dis.tokens();
        let (ct, cl) = col.tokens();
        assert!(!dt.is_empty());
        assert_eq!(dt, ct, "case {i}: {case}");
        assert_eq!(dl["finish_reason"], cl["finish_reason"]);
        assert_eq!(dl["usage"], cl["usage"]);
    }
    let s = stats(&d.addr("http"));
    assert_eq!(s["transfer"]["committed"], cases.len());
    assert_eq!(s["transfer"]["failed"], 0);
    assert_baseline(&[&d.addr("http"), &p.addr("http")]);
    let ps = stats(&p.addr("http"));
    assert_eq!(ps["transfer"]["released"], cases.len());
}

/// The prefix cache on the disaggregated path: prefill copies a tenant's
/// cached prompt pages instead of computing them, and decode, which keeps
/// what it served, finishes a prompt it holds all but a short suffix of
/// itself, with no transfer at all; answers stay token-identical, and
/// another tenant with the same prompt reuses nothing on either side.
#[test]
fn prefill_reuses_a_tenants_cached_prompt_and_no_other_tenants() {
    let p = prefill(&[]);
    let d = decode(&p.addr("transfer"), &[]);
    let prompt = tokens(400);
    let case = |n: usize| json!({"tokens": &prompt[..n], "max_tokens": 8, "ignore_eos": true});
    let hits = |addr: &str| stats(addr)["pool"]["prefix_hit_tokens"].as_u64();
    let committed = || stats(&d.addr("http"))["transfer"]["committed"].as_u64();
    let run = |tenant: u64, n: usize| {
        let r = generate(&d.addr("http"), tenant, &case(n));
        assert_eq!(r.status, 200, "{}", r.body);
        // Published once the transfer is released.
        assert_baseline(&[&d.addr("http"), &p.addr("http")]);
        r.tokens().0
    };
    let first = run(7, 300);
    assert_eq!(
        (hits(&p.addr("http")), hits(&d.addr("http"))),
        (Some(0), Some(0))
    );
    assert!(stats(&p.addr("http"))["pool"]["cached_pages"].as_u64() > Some(0));
    assert!(stats(&d.addr("http"))["pool"]["cached_pages"].as_u64() > Some(0));
    let other = run(8, 300);
    assert_eq!(
        (hits(&p.addr("http")), hits(&d.addr("http"))),
        (Some(0), Some(0)),
        "another tenant reused a cached prompt"
    );
    assert_eq!(committed(), Some(2));
    // The same prompt again: decode holds every full page, and the page
    // with the last prompt token (cached with the first answer's tokens
    // after it) gives its first 11 tokens by copy; it computes the last
    // token alone and opens no transfer.
    let again = run(7, 300);
    assert_eq!(hits(&d.addr("http")), Some(299));
    assert_eq!(committed(), Some(2), "a transfer for pages decode held");
    assert_eq!(again, first);
    assert_eq!(other, first);
    // A longer continuation goes to prefill, which copies what it cached.
    let longer = run(7, 400);
    assert_eq!(hits(&p.addr("http")), Some(299 / 16 * 16));
    assert_eq!(committed(), Some(3));
    assert_eq!(longer.len(), 8);
    let s = stats(&d.addr("http"));
    assert_eq!(s["transfer"]["failed"].as_u64(), Some(0));
}

/// Conditional disaggregation: a decode worker told to compute prompts of
/// up to 64 tokens itself answers a short prompt with no transfer (and
/// counts it), and still lands a longer one from its prefill worker; both
/// answers are the tokens a colocated worker gives. With the flag at 0
/// (the tests' default) the same short prompt is transferred.
#[test]
fn a_decode_worker_computes_short_prompts_itself_and_lands_long_ones() {
    let p = prefill(&[]);
    let d = decode(&p.addr("transfer"), &["--local-prefill-tokens", "64"]);
    let plain = decode(&p.addr("transfer"), &[]);
    let c = colocated();
    let prompt = tokens(200);
    let case = |n: usize| json!({"tokens": &prompt[..n], "max_tokens": 8, "ignore_eos": true});
    let committed = |w: &support::Worker| stats(&w.addr("http"))["transfer"]["committed"].as_u64();
    let here = |w: &support::Worker| stats(&w.addr("http"))["engine"]["computed_here"].as_u64();
    let answer = |w: &support::Worker, tenant: u64, n: usize| {
        let r = generate(&w.addr("http"), tenant, &case(n));
        assert_eq!(r.status, 200, "{}", r.body);
        assert_baseline(&[&w.addr("http"), &p.addr("http")]);
        r.tokens().0
    };
    let short = answer(&d, 7, 40);
    assert_eq!(
        (committed(&d), here(&d)),
        (Some(0), Some(1)),
        "a transfer for a short prompt"
    );
    assert_eq!(short, answer(&c, 7, 40));
    let long = answer(&d, 8, 200);
    assert_eq!(
        (committed(&d), here(&d)),
        (Some(1), Some(1)),
        "a long prompt computed on decode"
    );
    assert_eq!(long, answer(&c, 8, 200));
    assert_eq!(answer(&plain, 9, 40), short);
    assert_eq!((committed(&plain), here(&plain)), (Some(1), Some(0)));
}

#[test]
fn greedy_tokens_do_not_depend_on_concurrent_requests_disaggregated_or_colocated() {
    // The engine-level test (workers/engine/tests/batch_invariance.rs)
    // steps one core by hand; this one goes through real processes, where
    // neighbours join and leave the batch whenever they arrive.
    let p = prefill(&[]);
    let d = decode(&p.addr("transfer"), &[]);
    let c = colocated();
    let probe =
        json!({"prompt": "What is the capital of France?", "max_tokens": 24, "ignore_eos": true});
    for (name, addr) in [
        ("disaggregated", d.addr("http")),
        ("colocated", c.addr("http")),
    ] {
        let alone = generate(&addr, 1, &probe);
        assert_eq!(alone.status, 200, "{}", alone.body);
        let (alone_ids, _) = alone.tokens();
        assert_eq!(alone_ids.len(), 24);
        for others in [1u64, 4, 15] {
            let start = std::time::Instant::now();
            let neighbours: Vec<_> = (0..others)
                .map(|i| {
                    let addr = addr.clone();
                    let prompt: Vec<u32> = (0..10 + 7 * i as u32)
                        .map(|j| 200 + (j * 131 + i as u32 * 977) % 9000)
                        .collect();
                    std::thread::spawn(move || {
                        let body = json!({"tokens": prompt, "max_tokens": 48, "ignore_eos": true});
                        let r = generate(&addr, 2 + i, &body);
                        (r.status, start.elapsed())
                    })
                })
                .collect();
            std::thread::sleep(std::time::Duration::from_millis(30));
            let sent = start.elapsed();
            let r = generate(&addr, 1, &probe);
            assert_eq!(r.status, 200, "{}", r.body);
            let (ids, _) = r.tokens();
            for n in neighbours {
                let (status, ended) = n.join().expect("neighbour thread");
                assert_eq!(status, 200);
                // Every neighbour was still running when the probe went in
                // (they start together; the probe finished earlier or later).
                assert!(
                    ended > sent,
                    "{name}: a neighbour ended before the probe was sent"
                );
            }
            assert_eq!(ids, alone_ids, "{name}, {others} others");
        }
    }
    assert_baseline(&[&d.addr("http"), &p.addr("http"), &c.addr("http")]);
}

#[test]
fn an_over_long_prompt_is_rejected_before_anything_is_allocated_or_sent() {
    let p = prefill(&[]);
    let d = decode(&p.addr("transfer"), &[]);
    // 64 MiB of f16 pages hold 182 pages = 2,912 tokens.
    let request = json!({"tokens": tokens(2_900), "max_tokens": 100});
    let r = generate(&d.addr("http"), 1, &request);
    assert_eq!(r.status, 400, "{}", r.body);
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    let ds = stats(&d.addr("http"));
    assert_eq!(ds["pool"]["allocations"], 0);
    assert_eq!(ds["transfer"]["started"], 0);
    let ps = stats(&p.addr("http"));
    assert_eq!(ps["transfer"]["requests"], 0);
    assert_eq!(ps["pool"]["allocations"], 0);

    // The prefill door refuses on its own too, for a peer that asks anyway.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let reply = rt.block_on(async {
        use tokio::io::AsyncWriteExt;
        // A peer with a decode worker's certificate: the port admits it.
        let tls = support::identity(bulkhead_trust::Role::Decode)
            .connector(&[bulkhead_trust::Role::Prefill])
            .unwrap();
        let mut s =
            bulkhead_trust::connect::dial(&tls, bulkhead_trust::Role::Prefill, &p.addr("transfer"))
                .await
                .unwrap();
        let Message::Hello(h) = Message::read(&mut s).await.unwrap() else {
            panic!("hello first")
        };
        s.write_all(&Message::Hello(h).encode()).await.unwrap();
        s.flush().await.unwrap();
        // Tenant 9's request on transfer `id`, one landing slot a page,
        // with the gateway's context for tenant 9.
        let request = |id: u64, max_tokens: u64, prompt: Vec<u32>| {
            let slots = prompt.len().div_ceil(16) as u64;
            let req = bulkhead_transfer::PrefillRequest {
                transfer: bulkhead_kv::TransferId::new(id),
                tenant: 9,
                max_tokens,
                prompt,
                slots: (1..=slots)
                    .map(bulkhead_kv::Generation::from_wire)
                    .collect(),
                context: support::context_for(9),
                traceparent: None,
                key: [1; bulkhead_transfer::mac::KEY_LEN],
                cache: None,
            };
            Message::Prefill(req).encode()
        };
        s.write_all(&request(42, 100, tokens(2_900))).await.unwrap();
        s.flush().await.unwrap();
        let over_long = Message::read(&mut s).await.unwrap();
        // A token id outside the vocabulary is refused too, and prefill lives on.
        s.write_all(&request(43, 4, vec![1, 2, 4_000_000_000]))
            .await
            .unwrap();
        s.flush().await.unwrap();
        let wild = Message::read(&mut s).await.unwrap();
        // Reusing a transfer id (42 was refused above) closes the connection.
        s.write_all(&request(42, 4, vec![1, 2, 3])).await.unwrap();
        s.flush().await.unwrap();
        let closed = Message::read(&mut s).await.is_err();
        (over_long, wild, closed)
    });
    let (reply, wild, closed) = reply;
    assert!(closed, "a reused transfer id must close the connection");
    let refusal = |m: &Message| match m {
        Message::Rejected { error, .. } => Some(error.reason()),
        _ => None,
    };
    assert_eq!(refusal(&reply), Some("pool_capacity_exceeded"), "{reply:?}");
    assert_eq!(refusal(&wild), Some("token_out_of_range"), "{wild:?}");
    let ps = stats(&p.addr("http"));
    assert_eq!(ps["transfer"]["rejected"], 2);
    assert_eq!(ps["transfer"]["requests"], 2);
    assert_eq!(ps["pool"]["allocations"], 0);
    assert_baseline(&[&d.addr("http"), &p.addr("http")]);
}

/// After its peer was killed mid-transfer, the worker at `addr` is back to
/// its baseline, counted one lost connection and finished no transfer
/// (its `finished` counter is 0).
fn lost_one_connection(addr: &str, finished: &str) {
    assert_baseline(&[addr]);
    let s = stats(addr);
    assert_eq!(s["transfer"]["connection_losses"], 1, "{s}");
    assert_eq!(s["transfer"][finished], 0, "{s}");
}

/// Passes every frame on as it is but the `n`-th page frame (from 1), for
/// which it sends what `f` makes of it.
fn on_nth_page(
    n: usize,
    mut f: impl FnMut(bulkhead_transfer::PageHeader, Vec<u8>) -> Vec<Message> + Send + 'static,
) -> Tamper {
    let mut pages = 0;
    Box::new(move |m| match m {
        Message::Page(h, payload) => {
            pages += 1;
            if pages == n {
                f(h, payload)
            } else {
                vec![Message::Page(h, payload)]
            }
        }
        m => vec![m],
    })
}

/// Runs one request through a tampering proxy and checks it fails cleanly.
fn tampered(tamper: Tamper, expect_counter: &str) {
    let p = prefill(&[]);
    let via = proxy(p.addr("transfer"), tamper);
    let d = decode(&via.addr, &[]);
    let request = json!({"tokens": tokens(100), "max_tokens": 8});
    let r = generate(&d.addr("http"), 5, &request);
    assert!(via.injected() > 0, "the proxy injected no fault");
    assert_eq!(r.status, 502, "{}", r.body);
    assert!(r.body.contains("kv_transfer_failed"), "{}", r.body);
    assert!(!r.body.contains("\"token\""), "no token may be produced");
    assert_baseline(&[&d.addr("http"), &p.addr("http")]);
    let ds = stats(&d.addr("http"));
    assert_eq!(ds["transfer"][expect_counter], 1, "{ds}");
    assert_eq!(ds["transfer"]["committed"], 0);
    // Decode aborted; prefill acknowledged exactly once.
    assert_eq!(ds["transfer"]["aborts_sent"], 1);
    assert_eq!(ds["transfer"]["acks_received"], 1);
    let ps = stats(&p.addr("http"));
    assert_eq!(ps["transfer"]["acks_sent"], 1);
    // A clean request afterwards works on the same pair.
    let request = json!({"raw": "Hello", "max_tokens": 4});
    let ok = generate(&d.addr("http"), 5, &request);
    assert_eq!(ok.status, 200, "{}", ok.body);
}

#[test]
fn a_prefill_request_that_differs_from_its_signed_context_is_refused_before_any_page() {
    // A compromised decode host rewrites what it asks prefill for: first
    // the tenant (to tag pages as another's), then the cache scope (to ask
    // whether another tenant's cache holds this prompt). Prefill takes both
    // from the gateway's context the request carries, and refuses.
    let p = prefill(&[]);
    let mut n = 0;
    let lie: Tamper = Box::new(move |m| match m {
        Message::Prefill(mut r) => {
            n += 1;
            if n == 1 {
                r.tenant += 1;
            } else if let Some(scope) = r.cache {
                let other = bulkhead_kv::Namespace::from_digest([0x5a; 16]);
                r.cache = Some(bulkhead_kv::CacheScope::new(other, scope.shared()));
            }
            vec![Message::Prefill(r)]
        }
        m => vec![m],
    });
    let via = proxy_both(p.addr("transfer"), lie, Box::new(|m| vec![m]));
    let d = decode(&via.addr, &[]);
    let request = json!({"tokens": tokens(100), "max_tokens": 8});
    for attempt in 1..=2 {
        let r = generate(&d.addr("http"), 5, &request);
        assert_eq!(
            via.injected(),
            attempt,
            "the proxy rewrote request {attempt}"
        );
        assert_eq!(r.status, 502, "{}", r.body);
        assert!(r.body.contains("kv_transfer_failed"), "{}", r.body);
        assert!(!r.body.contains("\"token\""), "no token may be produced");
    }
    let ps = stats(&p.addr("http"));
    assert_eq!(ps["transfer"]["rejected"], 2, "{ps}");
    assert_eq!(ps["transfer"]["pages_sent"], 0, "{ps}");
    assert_eq!(
        ps["pool"]["allocations"], 0,
        "no prefill page was touched: {ps}"
    );
    assert_baseline(&[&d.addr("http"), &p.addr("http")]);
}

#[test]
fn a_corrupted_page_frame_fails_the_transfer() {
    let flip = |h, mut payload: Vec<u8>| {
        payload[1000] ^= 0x40;
        vec![Message::Page(h, payload)]
    };
    // The tag is the only integrity check when serving.
    tampered(on_nth_page(3, flip), "tag_mismatches");
}

#[test]
fn a_page_forged_with_a_correct_checksum_fails_on_its_tag() {
    // A host that rewrites a page, puts its CRC where the checksum goes
    // and fixes the digest over the checksums holds every unkeyed check;
    // it cannot make the tag.
    let mut n = 0;
    let mut sums = Vec::new();
    tampered(
        Box::new(move |m| match m {
            Message::Page(mut h, mut payload) => {
                n += 1;
                if n == 3 {
                    payload.iter_mut().for_each(|b| *b = 0x3c);
                    h.checksum = bulkhead_transfer::checksum::page_crc(&payload);
                }
                sums.push((h.generation, h.checksum));
                vec![Message::Page(h, payload)]
            }
            Message::Done(mut d) => {
                d.digest = bulkhead_transfer::checksum::transfer_digest(&sums, d.tokens, &d.logits);
                sums.clear();
                vec![Message::Done(d)]
            }
            m => vec![m],
        }),
        "tag_mismatches",
    );
}

#[test]
fn a_page_with_a_forged_checksum_still_cannot_land_in_another_slot() {
    // Aimed at the next slot, its generation left as it is.
    let aim = |mut h: bulkhead_transfer::PageHeader, payload| {
        h.slot += 1;
        vec![Message::Page(h, payload)]
    };
    tampered(on_nth_page(2, aim), "slot_mismatches");
}

#[test]
fn a_truncated_transfer_fails() {
    tampered(on_nth_page(7, |_, _| vec![]), "incomplete");
}

#[test]
fn duplicate_and_late_frames_are_dropped_and_counted() {
    // Within a live transfer a slot written twice fails it...
    let twice = |h, payload| vec![Message::Page(h, payload); 2];
    tampered(on_nth_page(1, twice), "duplicate_pages");
    // ...and once it is finished, its frames are dropped by the tombstone.
    let p = prefill(&[]);
    let mut kept: Vec<Message> = Vec::new();
    let via = proxy(
        p.addr("transfer"),
        Box::new(move |m| match m {
            Message::Page(..) => {
                kept.push(m.clone());
                vec![m]
            }
            Message::Done(d) => {
                // Done, then a duplicate page, then the Done again, late.
                let mut out = vec![Message::Done(d.clone())];
                out.extend(kept.drain(..1));
                out.push(Message::Done(d));
                out
            }
            m => vec![m],
        }),
    );
    let d = decode(&via.addr, &[]);
    let c = colocated();
    let body = json!({"tokens": tokens(40), "max_tokens": 6, "ignore_eos": true});
    let r = generate(&d.addr("http"), 2, &body);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        via.injected(),
        1,
        "the Done frame came with a duplicate and a late copy"
    );
    assert_eq!(r.tokens().0, generate(&c.addr("http"), 2, &body).tokens().0);
    let ds = wait_stats(&d.addr("http"), |s| s["transfer"]["dropped_frames"] == 2);
    assert_eq!(ds["transfer"]["dropped_frames"], 2, "{ds}");
    assert_eq!(ds["transfer"]["committed"], 1);
    assert_baseline(&[&d.addr("http"), &p.addr("http")]);
}

#[test]
fn decode_aborts_mid_transfer_and_keeps_its_pages_until_prefill_drains() {
    // 8 pages at 400 ms each; decode gives up after 1 s.
    let p = prefill(&["--page-delay-ms", "400"]);
    let d = decode(&p.addr("transfer"), &["--transfer-timeout-ms", "1000"]);
    let request = json!({"tokens": tokens(128), "max_tokens": 4});
    let r = generate(&d.addr("http"), 3, &request);
    assert_eq!(r.status, 502, "{}", r.body);
    assert!(r.body.contains("timed out"), "{}", r.body);
    // The client has its answer, but prefill's write in flight is not
    // drained yet: the landing pages are still held, not reused.
    let held = stats(&d.addr("http"));
    assert_eq!(held["engine"]["draining_transfers"], 1, "{held}");
    assert!(held["pool"]["allocated_pages"].as_u64().unwrap() > 0);
    assert_baseline(&[&d.addr("http"), &p.addr("http")]);
    let ds = stats(&d.addr("http"));
    assert_eq!(ds["transfer"]["timeouts"], 1);
    assert_eq!(ds["transfer"]["acks_received"], 1);
    let ps = stats(&p.addr("http"));
    assert_delayed(&ps);
    assert_eq!(ps["transfer"]["aborts_received"], 1);
    assert_eq!(ps["transfer"]["acks_sent"], 1);
}

/// The slowed link was in force: prefill held frames back.
fn assert_delayed(prefill_stats: &serde_json::Value) {
    assert!(
        prefill_stats["transfer"]["delayed_frames"].as_u64() > Some(0),
        "the slowed link delayed nothing: {prefill_stats}"
    );
}

#[test]
fn prefill_aborts_mid_transfer_and_gets_exactly_one_ack() {
    let p = prefill(&["--page-delay-ms", "300"]);
    let d = decode(&p.addr("transfer"), &[]);
    let daddr = d.addr("http");
    let client = std::thread::spawn(move || {
        generate(&daddr, 4, &json!({"tokens": tokens(160), "max_tokens": 4}))
    });
    wait_stats(&p.addr("http"), |s| {
        s["transfer"]["pages_sent"].as_u64() >= Some(2)
    });
    let a = http(&p.addr("http"), "POST", "/admin/abort", None, "");
    assert_eq!(a.status, 202);
    let r = client.join().unwrap();
    assert_eq!(r.status, 502, "{}", r.body);
    assert!(r.body.contains("aborted"), "{}", r.body);
    assert_baseline(&[&d.addr("http"), &p.addr("http")]);
    let ds = stats(&d.addr("http"));
    assert_eq!(ds["transfer"]["aborts_received"], 1);
    assert_eq!(ds["transfer"]["acks_sent"], 1);
    let ps = wait_stats(&p.addr("http"), |s| s["transfer"]["acks_received"] == 1);
    assert_delayed(&ps);
    assert_eq!(ps["transfer"]["aborts_sent"], 1);
    assert_eq!(ps["transfer"]["acks_received"], 1);
}

#[test]
fn kill_9_of_decode_mid_transfer_releases_prefill_pages() {
    let p = prefill(&["--page-delay-ms", "300"]);
    let mut d = decode(&p.addr("transfer"), &[]);
    let daddr = d.addr("http");
    std::thread::spawn(move || {
        let _ = std::panic::catch_unwind(|| {
            generate(&daddr, 6, &json!({"tokens": tokens(160), "max_tokens": 4}))
        });
    });
    wait_stats(&p.addr("http"), |s| {
        s["transfer"]["pages_sent"].as_u64() >= Some(2)
    });
    let during = stats(&p.addr("http"));
    assert_delayed(&during);
    assert!(during["pool"]["allocated_pages"].as_u64().unwrap() > 0);
    assert_eq!(d.kill9(), Some(9), "decode was killed by SIGKILL");
    lost_one_connection(&p.addr("http"), "completed");
}

#[test]
fn kill_9_of_prefill_mid_transfer_fails_the_request_and_frees_decode_pages() {
    let mut p = prefill(&["--page-delay-ms", "300"]);
    let d = decode(&p.addr("transfer"), &[]);
    let daddr = d.addr("http");
    let client = std::thread::spawn(move || {
        generate(&daddr, 7, &json!({"tokens": tokens(160), "max_tokens": 4}))
    });
    wait_stats(&d.addr("http"), |s| {
        s["pool"]["receiving_pages"].as_u64() > Some(0)
    });
    // Mid-transfer: prefill has started sending through the slowed link.
    assert_delayed(&wait_stats(&p.addr("http"), |s| {
        s["transfer"]["delayed_frames"].as_u64() > Some(0)
    }));
    assert_eq!(p.kill9(), Some(9), "prefill was killed by SIGKILL");
    let r = client.join().unwrap();
    assert_eq!(r.status, 502, "{}", r.body);
    assert!(r.body.contains("connection"), "{}", r.body);
    assert!(!r.body.contains("\"token\""));
    lost_one_connection(&d.addr("http"), "committed");
}

#[test]
fn a_client_disconnect_never_aborts_a_transfer_mid_flight() {
    let p = prefill(&["--page-delay-ms", "200"]);
    let d = decode(&p.addr("transfer"), &[]);
    // Send the request, then hang up while the pages are on the wire.
    {
        use std::io::Write;
        let body = json!({"tokens": tokens(100), "max_tokens": 50}).to_string();
        let mut s = support::tls_connect(&d.addr("http"), bulkhead_trust::Role::Gateway);
        write!(
            s,
            "POST /v1/generate HTTP/1.0\r\nx-bulkhead-context: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            support::context_for(8),
            body.len()
        )
        .unwrap();
        s.flush().unwrap();
        wait_stats(&p.addr("http"), |s| {
            s["transfer"]["pages_sent"].as_u64() >= Some(2)
        });
    }
    // The transfer runs to its end and is released; then the request is
    // cancelled and every page comes back. Nothing was aborted.
    let ps = wait_stats(&p.addr("http"), |s| s["transfer"]["released"] == 1);
    assert_delayed(&ps);
    assert_eq!(ps["transfer"]["released"], 1, "{ps}");
    assert_eq!(ps["transfer"]["aborts_received"], 0);
    assert_baseline(&[&d.addr("http"), &p.addr("http")]);
    let ds = stats(&d.addr("http"));
    assert_eq!(ds["transfer"]["committed"], 1);
    assert_eq!(ds["transfer"]["aborts_sent"], 0);
}

#[test]
fn logits_of_the_wrong_length_fail_the_request_even_with_a_valid_digest() {
    // A peer that recomputes the digest over truncated logits fails the
    // end's tag (it has no key); were it the prefill worker itself, the
    // engine would still refuse to sample from them.
    // Only the first transfer's end: `tampered` then runs a clean request.
    let (mut sums, mut first) = (Vec::new(), true);
    tampered(
        Box::new(move |m| match m {
            Message::Page(h, payload) => {
                sums.push((h.generation, h.checksum));
                vec![Message::Page(h, payload)]
            }
            Message::Done(mut d) if first => {
                first = false;
                d.logits.truncate(100);
                d.digest = bulkhead_transfer::checksum::transfer_digest(&sums, d.tokens, &d.logits);
                vec![Message::Done(d)]
            }
            m => vec![m],
        }),
        "tag_mismatches",
    );
}

#[test]
fn a_prompt_that_cannot_be_prefilled_in_time_is_refused_at_admission_and_a_slow_one_is_never_cut_off()
 {
    // A prefill worker with a 1 s deadline prefills a few hundred tokens
    // in time at most; the pair narrows to it, so decode refuses at its
    // own door, before any page or frame.
    let p = prefill(&["--prefill-deadline-secs", "1"]);
    let d = decode(&p.addr("transfer"), &[]);
    let request = json!({"tokens": tokens(2_000), "max_tokens": 4});
    let r = generate(&d.addr("http"), 1, &request);
    assert_eq!(r.status, 400, "{}", r.body);
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["error"]["code"], "prefill_too_long", "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("2000 tokens") && msg.contains("deadline"),
        "{msg}"
    );
    assert_eq!(stats(&d.addr("http"))["pool"]["allocations"], 0);
    assert_eq!(stats(&p.addr("http"))["transfer"]["requests"], 0);
    drop(d);
    drop(p);

    // A transfer may go 1 s without a sign of life, and this prompt takes
    // several seconds to prefill: the progress prefill reports after every
    // step keeps it alive to the end.
    let p = prefill(&[]);
    let d = decode(&p.addr("transfer"), &["--transfer-timeout-ms", "1000"]);
    let started = std::time::Instant::now();
    // Long enough that the blocked attention kernel still takes seconds.
    let request = json!({"tokens": tokens(2_500), "max_tokens": 2, "ignore_eos": true});
    let r = generate(&d.addr("http"), 2, &request);
    let took = started.elapsed();
    assert_eq!(r.status, 200, "{}", r.body);
    let (t, last) = r.tokens();
    assert_eq!(t.len(), 2, "{}", r.body);
    assert_eq!(last["finish_reason"], "length");
    assert!(
        took > std::time::Duration::from_millis(2_000),
        "the prefill outlasted the transfer timeout twice over ({took:?}), or the test proves nothing"
    );
    let s = stats(&d.addr("http"));
    assert_eq!(s["transfer"]["committed"], 1, "{s}");
    assert_baseline(&[&d.addr("http"), &p.addr("http")]);
}
