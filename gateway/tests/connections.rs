//! The gateway's listener over a real socket: connections past the
//! per-address cap are closed at once, a client that never finishes its
//! headers is cut off after the header timeout, and a body that stalls is
//! refused in the API's shape; other clients are served throughout.

mod support;

use bulkhead_gateway::ConnLimits;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use support::{Platform, bearer, platform, serve_on_loopback};

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
        // A body that stalls is refused in the API's shape.
        let mut stall = TcpStream::connect(addr).expect("connect");
        write!(
            stall,
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: {token}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"model\""
        )
        .expect("write");
        let (answer, _) = read_to_close(&mut stall, Duration::from_secs(3));
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        assert!(answer.contains("\"invalid_request_error\""), "{answer}");
        // Everyone else is served.
        let mut ok = TcpStream::connect(addr).expect("connect");
        write!(
            ok,
            "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: {token}\r\nConnection: close\r\n\r\n"
        )
        .expect("write");
        let (answer, closed) = read_to_close(&mut ok, Duration::from_secs(5));
        assert!(closed);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    });
    result.await.expect("client thread");
}
