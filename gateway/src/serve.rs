//! The gateway's listener: what a connection may cost before it has proved
//! anything. At most `max_connections` connections at once and at most
//! `max_per_address` from one address (past either, a new connection is
//! closed at once); a request's headers must arrive within
//! `header_timeout` and its body within `body_timeout`, else the connection
//! is closed (headers) or the request refused (body). The accept loop is
//! the one owner of the connection counts; each connection's task tells it
//! when it ends. A head hyper refuses itself (431, 400) is answered in the
//! API's JSON shape (`head_errors`).
//!
//! A connection speaks HTTP/1.1, or HTTP/2 in clear text when it opens with
//! HTTP/2's preface (h2c with prior knowledge, as `curl
//! --http2-prior-knowledge` and gRPC-style clients do). Which one is read
//! from the connection's first bytes, within `header_timeout`; an HTTP/2
//! connection's header block is bounded as HTTP/1.1's is, and its streams
//! at once by `MAX_STREAMS`.

mod head_errors;

use crate::bounds::MAX_HEADER_BYTES;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// What one connection may cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Connections open at once, from everyone.
    pub max_connections: usize,
    /// Connections open at once from one address.
    pub max_per_address: usize,
    /// Longest a request's headers may take to arrive.
    pub header_timeout: Duration,
    /// Longest a request's body may take to arrive.
    pub body_timeout: Duration,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            max_connections: 4096,
            max_per_address: 256,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
        }
    }
}

/// Requests open at once on one HTTP/2 connection.
const MAX_STREAMS: u32 = 256;

/// What every HTTP/2 connection opens with (RFC 9113, section 3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether the connection opens with HTTP/2's preface: peeks (reads
/// nothing) until the first bytes decide, within `limit`. `None` when the
/// client sent nothing decisive in time or went away.
async fn opens_with_h2_preface(stream: &tokio::net::TcpStream, limit: Duration) -> Option<bool> {
    let peek = async {
        let mut buf = [0u8; H2_PREFACE.len()];
        loop {
            let n = stream.peek(&mut buf).await.ok()?;
            if n == 0 {
                return None;
            }
            if buf[..n] != H2_PREFACE[..n] {
                return Some(false);
            }
            if n == H2_PREFACE.len() {
                return Some(true);
            }
            // Part of the preface: wait for more bytes.
            stream.readable().await.ok()?;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::time::timeout(limit, peek).await.ok().flatten()
}

/// Serves `router` on `listener` within `limits` until `shutdown`
/// completes; then stops accepting and waits up to 10 s for open
/// connections to finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let router = router.layer(tower_http::timeout::RequestBodyTimeoutLayer::new(
        limits.body_timeout,
    ));
    let (closed_tx, mut closed) = mpsc::unbounded_channel::<IpAddr>();
    let mut per_address: HashMap<IpAddr, usize> = HashMap::new();
    let mut open = 0usize;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            Some(ip) = closed.recv() => {
                open -= 1;
                if let Some(n) = per_address.get_mut(&ip) {
                    *n -= 1;
                    if *n == 0 {
                        per_address.remove(&ip);
                    }
                }
            }
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of descriptors and the like: back off briefly.
                        tracing::warn!(target: "bulkhead::gateway", error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let ip = peer.ip();
                let from_ip = per_address.get(&ip).copied().unwrap_or(0);
                if open >= limits.max_connections || from_ip >= limits.max_per_address {
                    crate::metrics::connection_refused(if open >= limits.max_connections {
                        "max_connections"
                    } else {
                        "max_per_address"
                    });
                    drop(stream);
                    continue;
                }
                open += 1;
                *per_address.entry(ip).or_default() += 1;
                let _ = stream.set_nodelay(true);
                let service = TowerToHyperService::new(router.clone());
                let done = closed_tx.clone();
                tokio::spawn(async move {
                    match opens_with_h2_preface(&stream, limits.header_timeout).await {
                        Some(false) => {
                            let mut http = hyper::server::conn::http1::Builder::new();
                            http.timer(TokioTimer::new())
                                .header_read_timeout(limits.header_timeout)
                                .max_buf_size(MAX_HEADER_BYTES);
                            let io = TokioIo::new(head_errors::HeadErrors::new(stream));
                            let _ = http.serve_connection(io, service).await;
                        }
                        Some(true) => {
                            let mut http =
                                hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                            http.timer(TokioTimer::new())
                                .max_header_list_size(MAX_HEADER_BYTES as u32)
                                .max_concurrent_streams(MAX_STREAMS)
                                .keep_alive_interval(Some(limits.header_timeout))
                                .keep_alive_timeout(limits.header_timeout);
                            let _ = http.serve_connection(TokioIo::new(stream), service).await;
                        }
                        // Silent past the header timeout, or gone.
                        None => {}
                    }
                    let _ = done.send(ip);
                });
            }
        }
    }
    drop(listener);
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while open > 0 {
        match tokio::time::timeout_at(until, closed.recv()).await {
            Ok(Some(_)) => open -= 1,
            _ => break,
        }
    }
    Ok(())
}
