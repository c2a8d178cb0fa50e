//! A TLS listener. A background task accepts TCP connections and runs each
//! handshake on its own task (a slow or hostile client holds up nobody);
//! only connections whose handshake succeeded, and so whose client
//! certificate the port admits, come out of [`TlsListener::accept`]. A
//! refused peer never gets a byte of the application protocol read. At most
//! [`MAX_HANDSHAKES`] handshakes run at once: a connection that comes while
//! they all do is closed at once, so a flood of idle or slow connections
//! costs a bounded amount of memory and CPU (each lasts at most
//! [`HANDSHAKE_TIMEOUT`]).

use crate::{Role, Scope, Wire};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// Longest a client may take to complete its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Most handshakes a port runs at once.
pub const MAX_HANDSHAKES: usize = 256;

/// Who is on the other end of an accepted connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Its address.
    pub addr: SocketAddr,
    /// The role its certificate names (one the port admits; `None` only
    /// on a port without TLS).
    pub role: Option<Role>,
    /// What its certificate limits it to beyond the role (unscoped on a
    /// port without TLS, where no route that needs a role is served).
    pub scope: Scope,
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, TlsListener>> for Peer {
    fn connect_info(stream: axum::serve::IncomingStream<'_, TlsListener>) -> Self {
        Peer {
            addr: *stream.remote_addr(),
            role: peer_role(stream.io()),
            scope: peer_scope(stream.io()),
        }
    }
}

/// The scope of the certificate the peer of `tls` presented.
pub fn peer_scope(tls: &TlsStream<Wire>) -> Scope {
    tls.get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        // Every verifier refuses a certificate whose scope cannot be read,
        // so an accepted peer's always can.
        .and_then(Scope::of)
        .unwrap_or_default()
}

/// The role named by the certificate the peer of `tls` presented.
pub fn peer_role(tls: &TlsStream<Wire>) -> Option<Role> {
    tls.get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .and_then(crate::verify::role_of)
}

/// Accepted, authenticated connections.
#[derive(Debug)]
pub struct TlsListener {
    local: SocketAddr,
    accepted: mpsc::Receiver<(TlsStream<Wire>, SocketAddr)>,
}

impl TlsListener {
    /// Starts accepting on `listener` with `acceptor`. Must be called in a
    /// tokio runtime; the accepting task ends when this is dropped.
    pub fn new(listener: TcpListener, acceptor: TlsAcceptor) -> std::io::Result<TlsListener> {
        TlsListener::with_handshake_limit(listener, acceptor, MAX_HANDSHAKES)
    }

    /// As [`TlsListener::new`], running at most `limit` handshakes at once.
    pub fn with_handshake_limit(
        listener: TcpListener,
        acceptor: TlsAcceptor,
        limit: usize,
    ) -> std::io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let (tx, accepted) = mpsc::channel(64);
        let running = std::sync::Arc::new(tokio::sync::Semaphore::new(limit.max(1)));
        tokio::spawn(async move {
            loop {
                let (tcp, addr) = match listener.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if tx.is_closed() {
                    return;
                }
                let Ok(permit) = std::sync::Arc::clone(&running).try_acquire_owned() else {
                    // Every handshake slot is taken: shed this one now.
                    tracing::warn!(peer = %addr, "TLS handshake shed: too many at once");
                    drop(tcp);
                    continue;
                };
                let _ = tcp.set_nodelay(true);
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    let _permit = permit;
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(crate::wire(tcp)))
                        .await
                    {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, addr)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::warn!(peer = %addr, error = %e, "TLS handshake refused");
                        }
                        Err(_) => {
                            tracing::warn!(peer = %addr, "TLS handshake timed out");
                        }
                    }
                });
            }
        });
        Ok(TlsListener { local, accepted })
    }

    /// The next authenticated connection and its peer's address.
    pub async fn accept(&mut self) -> (TlsStream<Wire>, SocketAddr) {
        match self.accepted.recv().await {
            Some(c) => c,
            // The accepting task never ends while this listener lives.
            None => std::future::pending().await,
        }
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<Wire>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        TlsListener::accept(self).await
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// The role of the certificate on the connection a request came in on:
/// `None` on a port without TLS (and for a request that came through no
/// connection at all, such as a test's `oneshot`), which every route that
/// needs a role refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallerRole(pub Option<Role>);

impl CallerRole {
    /// The role in `extensions` (where `axum::serve` with connect info puts
    /// the [`Peer`]).
    pub fn of(extensions: &axum::http::Extensions) -> CallerRole {
        CallerRole(
            extensions
                .get::<axum::extract::ConnectInfo<Peer>>()
                .and_then(|c| c.0.role),
        )
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for CallerRole {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<CallerRole, std::convert::Infallible> {
        Ok(CallerRole::of(&parts.extensions))
    }
}

/// The scope of the certificate on the connection a request came in on
/// (unscoped where there is no such connection; every route that needs a
/// scope needs a role too, and refuses those).
pub fn caller_scope(extensions: &axum::http::Extensions) -> Scope {
    extensions
        .get::<axum::extract::ConnectInfo<Peer>>()
        .map(|c| c.0.scope.clone())
        .unwrap_or_default()
}
