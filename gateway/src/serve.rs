//! The gateway's listener: what a connection may cost before it has proved
//! anything. At most `max_connections` connections at once and at most
//! `max_per_address` from one address (past either, a new connection is
//! closed at once); a request's headers must arrive within
//! `header_timeout` and its body within `body_timeout`, else the connection
//! is closed (headers) or the request refused (body). The accept loop is
//! the one owner of the connection counts; each connection's task tells it
//! when it ends. A head hyper refuses itself (431, 400) is answered in the
//! API's JSON shape (`head_errors`).

mod head_errors;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
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

/// Largest buffer for a request's headers (hyper's minimum is 8 KiB).
pub(crate) const MAX_HEADER_BYTES: usize = 64 << 10;

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
                    let mut http = hyper::server::conn::http1::Builder::new();
                    http.timer(TokioTimer::new())
                        .header_read_timeout(limits.header_timeout)
                        .max_buf_size(MAX_HEADER_BYTES);
                    let io = TokioIo::new(head_errors::HeadErrors::new(stream));
                    let _ = http.serve_connection(io, service).await;
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
