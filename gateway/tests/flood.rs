//! Strangers cost the gateway almost nothing: a flood of unauthenticated
//! connections that declare nearly 2 MiB bodies and send them slowly is
//! refused from the headers (the bodies are never buffered), the process
//! grows by less than a stated bound, and a tenant is served throughout.
//! Heads hyper refuses itself (headers over the limit, a malformed header)
//! are answered in the API's JSON shape. In its own test binary, so the
//! memory it measures is its own.

// Tests read their services from the environment (clippy.toml keeps
// library code from it).
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)]

mod support;

use bulkhead_gateway::ConnLimits;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};
use support::{Platform, bearer, platform, send_raw, serve_on_loopback};

/// Connections in the flood.
const FLOOD: usize = 200;
/// What the whole flood may add to the process: 200 connections with
/// 1.9 MiB bodies buffered would be about 380 MiB.
const BOUND_MIB: u64 = 48;

fn rss_mib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("resident pages");
    pages * 4096 / (1 << 20)
}

fn read_answer(s: &mut TcpStream) -> String {
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        if String::from_utf8_lossy(&out).contains("}") {
            break;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn served(addr: SocketAddr, token: &str) -> Duration {
    let started = Instant::now();
    let mut ok = send_raw(
        addr,
        &format!(
            "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: {token}\r\nConnection: close\r\n\r\n"
        ),
    );
    let answer = read_answer(&mut ok);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_slow_strangers_costs_little_memory_and_no_service() {
    // Room for the whole flood: what is measured is its cost, not a refusal.
    let limits = ConnLimits {
        max_connections: 1024,
        max_per_address: 512,
        ..ConnLimits::default()
    };
    let p = platform().await;
    let router = p.gateway(None, Platform::limiter()).await;
    let addr = serve_on_loopback(router, limits).await;
    let token = bearer(&p.a_token);
    let result = tokio::task::spawn_blocking(move || {
        let alone = served(addr, &token);
        let before = rss_mib();
        // Each declares a body just under the 2 MiB limit, sends 64 KiB of
        // it and keeps the connection open, without a valid credential.
        let chunk = vec![b'x'; 64 << 10];
        let mut flood: Vec<TcpStream> = (0..FLOOD)
            .map(|i| {
                let mut s = TcpStream::connect(addr).expect("connect");
                let auth = if i % 2 == 0 { "Authorization: Bearer nope\r\n" } else { "" };
                write!(
                    s,
                    "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                    (2 << 20) - 4096
                )
                .expect("write head");
                let _ = s.write_all(&chunk);
                s
            })
            .collect();
        // A tenant is served while they hang on.
        let during = served(addr, &token);
        let grew = rss_mib().saturating_sub(before);
        // Every stranger got its 401 from the headers alone.
        let mut refused = 0;
        for s in &mut flood {
            let answer = read_answer(s);
            if answer.starts_with("HTTP/1.1 401") && answer.contains("invalid_api_key") {
                refused += 1;
            }
        }
        assert_eq!(refused, FLOOD, "every stranger is refused from its headers");
        assert!(
            grew < BOUND_MIB,
            "{FLOOD} slow strangers grew the gateway by {grew} MiB (bound {BOUND_MIB} MiB)"
        );
        eprintln!(
            "flood of {FLOOD}: +{grew} MiB resident; a tenant's request took {alone:?} alone, {during:?} during"
        );
        assert!(during < Duration::from_secs(2), "{during:?}");
    });
    result.await.expect("client thread");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_hyper_refuses_are_answered_in_the_apis_shape() {
    let p = platform().await;
    let router = p.gateway(None, Platform::limiter()).await;
    let addr = serve_on_loopback(router, ConnLimits::default()).await;
    let result = tokio::task::spawn_blocking(move || {
        let huge = "a".repeat(256 << 10);
        let cases = [
            // Headers over the 64 KiB limit: 431.
            (
                format!("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Big: {huge}\r\n\r\n"),
                "HTTP/1.1 431",
                "\"headers_too_large\"",
            ),
            (
                format!(
                    "POST /client/v4/accounts/a/ai/run/@cf/x/y HTTP/1.1\r\nHost: x\r\nX-Big: {huge}\r\n\r\n"
                ),
                "HTTP/1.1 431",
                "\"success\":false",
            ),
            // A header line that is not a header: 400.
            (
                "GET /v1/models HTTP/1.1\r\nHost: x\r\nnot a header\r\n\r\n".to_owned(),
                "HTTP/1.1 400",
                "\"invalid_request_error\"",
            ),
            (
                "GET /client/v4/accounts/a/ai/models/search HTTP/1.1\r\nHo st: x\r\n\r\n"
                    .to_owned(),
                "HTTP/1.1 400",
                "\"errors\":[{\"code\":5006",
            ),
        ];
        for (request, status, shape) in cases {
            let mut s = TcpStream::connect(addr).expect("connect");
            let _ = s.write_all(request.as_bytes());
            let answer = read_answer(&mut s);
            assert!(answer.starts_with(status), "{request:.80}: {answer}");
            assert!(
                answer.contains("content-type: application/json"),
                "{answer}"
            );
            assert!(answer.contains(shape), "{shape} missing: {answer}");
        }
    });
    result.await.expect("client thread");
}
