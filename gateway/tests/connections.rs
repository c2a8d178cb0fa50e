//! The gateway's listener over a real socket: connections past the
//! per-address cap are closed at once, a client that never finishes its
//! headers is cut off after the header timeout, and a body that stalls is
//! refused in the API's shape; other clients are served throughout.

mod support;

use bulkhead_gateway::ConnLimits;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use support::{Platform, bearer, platform, send_raw, serve_on_loopback};

/// Reads until the server closes the connection (or `limit` passes);
/// returns what was read and whether it closed.
fn read_to_close(s: &mut TcpStream, limit: Duration) -> (String, bool) {
    s.set_read_timeout(Some(limit)).expect("timeout");
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (String::from_utf8_lossy(&out).into_owned(), true),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return (String::from_utf8_lossy(&out).into_owned(), true);
            }
            Err(_) => return (String::from_utf8_lossy(&out).into_owned(), false),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_surplus_connections_are_cut_off_and_others_are_served() {
    let p = platform().await;
    let router = p.gateway(None, Platform::limiter()).await;
    let limits = ConnLimits {
        max_connections: 64,
        max_per_address: 3,
        header_timeout: Duration::from_millis(400),
        body_timeout: Duration::from_millis(400),
    };
    let addr = serve_on_loopback(router, limits).await;
    let token = bearer(&p.a_token);
    let result = tokio::task::spawn_blocking(move || {
        // Three connections that never finish their headers.
        let mut slow: Vec<TcpStream> = (0..3)
            .map(|_| {
                let mut s = TcpStream::connect(addr).expect("connect");
                s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
                    .expect("write");
                s
            })
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        // A fourth from the same address is closed at once.
        let mut surplus = TcpStream::connect(addr).expect("connect");
        let started = Instant::now();
        let (_, closed) = read_to_close(&mut surplus, Duration::from_secs(2));
        assert!(closed, "the surplus connection was not closed");
        assert!(
            started.elapsed() < Duration::from_millis(350),
            "closed at once"
        );
        // The slow ones are cut off by the header timeout.
        for s in &mut slow {
            let (_, closed) = read_to_close(s, Duration::from_secs(3));
            assert!(
                closed,
                "a client that never finished its headers stayed connected"
            );
        }
        // The gateway counts a connection's end when its task reports it,
        // a moment after the client sees the close: wait until this
        // address is served again before the next step.
        let until = Instant::now() + Duration::from_secs(3);
        loop {
            let mut probe = send_raw(
                addr,
                "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            );
            let (answer, _) = read_to_close(&mut probe, Duration::from_secs(2));
            if answer.starts_with("HTTP/1.1 200") || Instant::now() > until {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // A body that stalls is refused in the API's shape.
        let mut stall = send_raw(
            addr,
            &format!(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: {token}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"model\""
            ),
        );
        let (answer, _) = read_to_close(&mut stall, Duration::from_secs(3));
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        assert!(answer.contains("\"invalid_request_error\""), "{answer}");
        // Everyone else is served.
        let mut ok = send_raw(
            addr,
            &format!(
                "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: {token}\r\nConnection: close\r\n\r\n"
            ),
        );
        let (answer, closed) = read_to_close(&mut ok, Duration::from_secs(5));
        assert!(closed);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    });
    result.await.expect("client thread");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_with_prior_knowledge_is_served_beside_http1() {
    use http_body_util::{BodyExt, Empty};
    use hyper::body::Bytes;
    let p = platform().await;
    let router = p.gateway(None, Platform::limiter()).await;
    let limits = ConnLimits {
        header_timeout: Duration::from_millis(400),
        ..ConnLimits::default()
    };
    let addr = serve_on_loopback(router, limits).await;

    // h2c, as `curl --http2-prior-knowledge` speaks it: two requests on
    // one connection.
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .expect("an HTTP/2 handshake");
    tokio::spawn(conn);
    for path in ["/v1/models", "/v1/nothing"] {
        let req = hyper::Request::get(format!("http://{addr}{path}"))
            .header("authorization", bearer(&p.a_token))
            .body(Empty::<Bytes>::new())
            .expect("request");
        let resp = send.send_request(req).await.expect("an HTTP/2 answer");
        assert_eq!(resp.version(), hyper::Version::HTTP_2);
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        let body = String::from_utf8_lossy(&body);
        match path {
            "/v1/models" => assert_eq!(status, 200, "{body}"),
            _ => {
                assert_eq!(status, 404, "{body}");
                assert!(body.contains("\"unknown_url\""), "{body}");
            }
        }
    }

    // Half a preface, then silence: cut off like a slow HTTP/1.1 head.
    let result = tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.write_all(b"PRI * HTTP/2.0\r\n").expect("write");
        let (_, closed) = read_to_close(&mut s, Duration::from_secs(3));
        assert!(
            closed,
            "a client that never finished its preface stayed connected"
        );
        // HTTP/1.1 still works on the same listener.
        let mut ok = send_raw(
            addr,
            "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        let (answer, _) = read_to_close(&mut ok, Duration::from_secs(5));
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    });
    result.await.expect("client thread");
}
