//! The prefix cache on the real model: a namespace reuses its own prompt
//! pages and answers token for token as a cold run does; another
//! namespace with the identical prompt reuses nothing; an operator's
//! shared prefix is reused by every tenant and nothing after it is; under
//! pool pressure cached pages are evicted and their bytes reach nobody.

// Tests read their services from the environment (clippy.toml keeps
// library code from it).
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)]

mod common;

use bulkhead_engine::{CacheScope, Engine, EngineConfig, GenerateRequest, Namespace};
use common::{greedy, model, run};

fn ns(n: u8) -> Namespace {
    Namespace::from_digest([n; 16])
}

fn scoped(prompt: Vec<u32>, max_tokens: usize, scope: CacheScope) -> GenerateRequest {
    GenerateRequest {
        cache: Some(scope),
        ..greedy(prompt, max_tokens)
    }
}

fn engine(kv_mib: usize, prefix_cache: bool) -> Engine {
    let mut c = EngineConfig::with_budget(kv_mib << 20);
    c.threads = 2;
    c.prefix_cache = prefix_cache;
    Engine::start(model(), &c).expect("engine starts")
}

fn hit_tokens(e: &Engine) -> u64 {
    e.stats().expect("stats").pool.prefix_hit_tokens
}

/// A multi-turn chat's prompt: `turns` exchanges, rendered by the model's
/// template.
fn chat(e: &Engine, turns: usize) -> Vec<u32> {
    let mut messages = vec![bulkhead_engine::ChatMessage {
        role: "system".into(),
        content: "You are a helpful assistant who answers briefly.".into(),
    }];
    for i in 0..turns {
        messages.push(bulkhead_engine::ChatMessage {
            role: "user".into(),
            content: format!("Tell me one fact about the number {i}."),
        });
        messages.push(bulkhead_engine::ChatMessage {
            role: "assistant".into(),
            content: format!(
                "The number {i} comes after {} and before {}.",
                i + 1000,
                i + 2000
            ),
        });
    }
    messages.push(bulkhead_engine::ChatMessage {
        role: "user".into(),
        content: "And one more?".into(),
    });
    let text = e
        .model()
        .chat_template()
        .expect("a chat template")
        .render(&messages)
        .expect("the template renders");
    e.tokenizer().encode(&text).expect("tokens")
}

#[test]
fn a_namespace_reuses_its_prefix_and_answers_as_a_cold_run() {
    let cold = engine(32, false);
    let warm = engine(32, true);
    let a = CacheScope::new(ns(1), None);
    let short = chat(&warm, 3);
    let long = chat(&warm, 5);
    let common = short.iter().zip(&long).take_while(|(a, b)| a == b).count();
    assert!(
        long.len() > short.len() + 32 && common >= 48,
        "{common} tokens in common"
    );

    let (first, ..) = run(&warm, 1, scoped(short.clone(), 8, a));
    assert_eq!(hit_tokens(&warm), 0, "nothing to reuse yet");
    let (again, ..) = run(&warm, 1, scoped(short.clone(), 8, a));
    let reused = hit_tokens(&warm);
    assert!(
        reused >= (short.len() as u64 - 16),
        "reused {reused} of {}",
        short.len()
    );
    let (cold_short, ..) = run(&cold, 1, greedy(short, 8));
    assert_eq!(first, cold_short);
    assert_eq!(again, cold_short, "a warm run answers as a cold one");

    // The next turn of the same chat reuses the shared history.
    let before = hit_tokens(&warm);
    let (next, ..) = run(&warm, 1, scoped(long.clone(), 8, a));
    assert!(
        hit_tokens(&warm) > before,
        "the next turn reuses the history"
    );
    let (cold_long, ..) = run(&cold, 1, greedy(long, 8));
    assert_eq!(next, cold_long);
    assert_eq!(hit_tokens(&cold), 0, "with the cache off nothing is reused");
}

#[test]
fn another_namespace_with_the_identical_prompt_reuses_nothing() {
    let e = engine(32, true);
    let prompt = chat(&e, 3);
    let (victim, ..) = run(
        &e,
        1,
        scoped(prompt.clone(), 8, CacheScope::new(ns(1), None)),
    );
    assert!(e.stats().expect("stats").pool.cached_pages > 0);
    // Same tenant number, a different namespace: the platform derives the
    // namespace, so nothing else decides which pages a request may share.
    let (attacker, _, end) = run(&e, 1, scoped(prompt, 8, CacheScope::new(ns(2), None)));
    assert!(
        matches!(end, bulkhead_engine::SeqEvent::Finished { .. }),
        "{end:?}"
    );
    assert_eq!(hit_tokens(&e), 0);
    assert_eq!(attacker, victim);
    assert_eq!(e.stats().expect("stats").pool.owner_violations, 0);
}

#[test]
fn a_shared_prefix_is_reused_by_every_tenant_and_nothing_after_it() {
    let e = engine(32, true);
    let public = ns(9);
    let system = chat(&e, 2);
    // The operator publishes the prefix once (the platform's own request).
    run(
        &e,
        0,
        scoped(system.clone(), 1, CacheScope::new(public, None)),
    );
    let published = e.stats().expect("stats").pool.cached_pages;
    assert!(published >= system.len() / 16 - 1);

    let mut prompt = system.clone();
    prompt.extend(chat(&e, 4).into_iter().skip(system.len()));
    let alice = CacheScope::new(ns(1), Some(public));
    let bob = CacheScope::new(ns(2), Some(public));
    run(&e, 1, scoped(prompt.clone(), 4, alice));
    let alice_hit = hit_tokens(&e);
    assert!(alice_hit > 0 && alice_hit as usize <= system.len());
    // Bob reuses exactly what Alice did from the shared prefix, none of
    // Alice's own blocks that follow it.
    run(&e, 2, scoped(prompt.clone(), 4, bob));
    assert_eq!(hit_tokens(&e), 2 * alice_hit);
    // Alice's second run reuses her own blocks too.
    run(&e, 1, scoped(prompt.clone(), 4, alice));
    assert!(hit_tokens(&e) - 2 * alice_hit > alice_hit);
    // A tenant whose scope lacks the shared namespace reuses nothing.
    let before = hit_tokens(&e);
    run(&e, 3, scoped(prompt, 4, CacheScope::new(ns(3), None)));
    assert_eq!(hit_tokens(&e), before);
}

#[test]
fn under_pressure_cached_pages_are_evicted_and_answers_stay_right() {
    // A pool of a few hundred tokens: every new tenant's prompt evicts.
    let e = engine(8, true);
    let cold = engine(8, false);
    let capacity = e.info().limits.pool_tokens();
    let prompt = chat(&e, 3);
    assert!(
        prompt.len() * 2 > capacity / 2,
        "{} of {capacity}",
        prompt.len()
    );
    for t in 0..6u8 {
        let (got, _, end) = run(
            &e,
            u64::from(t),
            scoped(prompt.clone(), 8, CacheScope::new(ns(t), None)),
        );
        assert!(
            matches!(end, bulkhead_engine::SeqEvent::Finished { .. }),
            "{end:?}"
        );
        let (want, ..) = run(&cold, u64::from(t), greedy(prompt.clone(), 8));
        assert_eq!(got, want, "tenant {t}");
    }
    let s = e.stats().expect("stats");
    assert_eq!(s.pool.owner_violations, 0);
    assert_eq!(s.pool.prefix_hit_tokens, 0);
    assert!(s.pool.cached_pages <= s.pool.total_pages);
    assert_eq!(
        s.pool.free_pages, s.pool.total_pages,
        "cached pages count as free"
    );
}

/// Time to first token of one request.
fn ttft(e: &Engine, tenant: u64, req: GenerateRequest) -> f64 {
    let start = std::time::Instant::now();
    let mut h = e
        .submit(bulkhead_kv::TenantId::new(tenant), req)
        .expect("admitted");
    let mut first = None;
    while let Some(ev) = h.blocking_next() {
        match ev {
            bulkhead_engine::SeqEvent::Token { .. } => {
                first.get_or_insert_with(|| start.elapsed().as_secs_f64());
            }
            _ => break,
        }
    }
    first.expect("a first token")
}

fn median_ms(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2] * 1000.0
}

/// The two-sample Kolmogorov–Smirnov statistic and its asymptotic p-value
/// (Numerical Recipes' `kstwo` with `probks`).
fn ks(a: &[f64], b: &[f64]) -> (f64, f64) {
    let (mut a, mut b) = (a.to_vec(), b.to_vec());
    a.sort_by(f64::total_cmp);
    b.sort_by(f64::total_cmp);
    let (n, m) = (a.len() as f64, b.len() as f64);
    let (mut i, mut j, mut d) = (0, 0, 0.0f64);
    while i < a.len() && j < b.len() {
        let x = a[i].min(b[j]);
        while i < a.len() && a[i] <= x {
            i += 1;
        }
        while j < b.len() && b[j] <= x {
            j += 1;
        }
        d = d.max((i as f64 / n - j as f64 / m).abs());
    }
    let en = (n * m / (n + m)).sqrt();
    let lambda = (en + 0.12 + 0.11 / en) * d;
    // The series converges only for lambda not near 0, where p is 1.
    let (mut p, mut previous) = (0.0, 0.0f64);
    for k in 1..=100 {
        let term = 2.0 * (-1.0f64).powi(k - 1) * (-2.0 * f64::from(k * k) * lambda * lambda).exp();
        p += term;
        if term.abs() <= 1e-3 * previous || term.abs() <= 1e-8 * p.abs() {
            return (d, p.clamp(0.0, 1.0));
        }
        previous = term.abs();
    }
    (d, 1.0)
}

#[test]
fn the_ks_statistic_matches_known_values() {
    let a: Vec<f64> = (0..20).map(f64::from).collect();
    let (d, p) = ks(&a, &a);
    assert!(d == 0.0 && p > 0.99);
    let b: Vec<f64> = (100..120).map(f64::from).collect();
    let (d, p) = ks(&a, &b);
    assert!(d == 1.0 && p < 1e-6, "{d} {p}");
}

/// In the style of the published prefix-cache audits: a victim caches a
/// prompt; an attacker probes with the victim's prefix and with unrelated
/// prefixes of the same length, interleaved, each probe cold on the
/// attacker's side (a fresh namespace, as an attacker with many accounts
/// would arrange). The two TTFT samples must not be distinguishable. The
/// same probes inside the victim's namespace must be (paired control: a
/// cache that is simply off fails here).
#[test]
fn another_tenant_cannot_time_a_cached_prefix() {
    const PROBES: usize = 16;
    // A pool large enough that no probe evicts another's pages (eviction
    // is tested above): the only difference between probes is the cache.
    let e = engine(512, true);
    let prefix = chat(&e, 6);
    let unrelated = |i: usize| -> Vec<u32> {
        // The same length, other tokens: the prefix rotated and shifted.
        let mut p = prefix.clone();
        p.rotate_left(17 + i);
        p[0] = prefix[0];
        p.iter_mut()
            .skip(1)
            .for_each(|t| *t = (*t + 1 + i as u32) % 40_000);
        p
    };
    let victim = CacheScope::new(ns(200), None);
    run(&e, 1, scoped(prefix.clone(), 1, victim));
    let mut ns_next = 0u8;
    let mut fresh = || {
        ns_next = ns_next.wrapping_add(1);
        CacheScope::new(ns(ns_next), None)
    };
    let (mut same, mut other) = (Vec::new(), Vec::new());
    for i in 0..PROBES {
        // Alternate which goes first, so drift hits both alike.
        if i % 2 == 0 {
            same.push(ttft(&e, 2, scoped(prefix.clone(), 1, fresh())));
            other.push(ttft(&e, 2, scoped(unrelated(i), 1, fresh())));
        } else {
            other.push(ttft(&e, 2, scoped(unrelated(i), 1, fresh())));
            same.push(ttft(&e, 2, scoped(prefix.clone(), 1, fresh())));
        }
    }
    let (d, p) = compare(
        "attacker",
        ("victim's prefix", &same),
        ("unrelated", &other),
    );
    assert!(
        p > 0.01,
        "the attacker can tell a cached prefix: D = {d}, p = {p}"
    );

    // Inside the victim's namespace the hit is plain to see.
    let (mut hit, mut miss) = (Vec::new(), Vec::new());
    for i in 0..PROBES {
        let before = hit_tokens(&e);
        hit.push(ttft(&e, 1, scoped(prefix.clone(), 1, victim)));
        assert_eq!(
            hit_tokens(&e) - before,
            (prefix.len() as u64 - 1) / 16 * 16,
            "the victim's probe reuses every full page of its prefix"
        );
        miss.push(ttft(&e, 1, scoped(unrelated(100 + i), 1, victim)));
    }
    let (d, p) = compare("victim's own namespace", ("hit", &hit), ("miss", &miss));
    assert!(
        p < 0.01,
        "the cache did not make the victim's own hit faster: D = {d}, p = {p}"
    );
}

/// The Kolmogorov-Smirnov statistic and p-value of two samples of TTFT,
/// printed with their medians under `who`.
fn compare(who: &str, (a, xs): (&str, &[f64]), (b, ys): (&str, &[f64])) -> (f64, f64) {
    let (d, p) = ks(xs, ys);
    let (mx, my) = (median_ms(xs), median_ms(ys));
    eprintln!("{who}: D = {d:.3}, p = {p:.3e}; median TTFT {a} {mx:.1} ms, {b} {my:.1} ms");
    (d, p)
}
