//! Dialling a Bulkhead component: TCP, then the TLS handshake presenting
//! this component's identity and checking the server's role. [`Connector`]
//! plugs into hyper's pooled client; [`dial`] gives a bare stream (the KV
//! transfer connection).

use crate::identity::sni;
use crate::{Identity, Role, TrustError, Wire};
use hyper::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// Longest a connection (TCP and handshake) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Connects to `addr` (`host:port`) expecting a server of one of `expect`.
pub async fn dial(
    tls: &tokio_rustls::TlsConnector,
    expect: Role,
    addr: &str,
) -> io::Result<TlsStream<Wire>> {
    let fut = async {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        tls.connect(sni(expect), crate::wire(tcp)).await
    };
    tokio::time::timeout(CONNECT_TIMEOUT, fut)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, format!("connecting to {addr}")))?
}

/// A hyper connector that dials with TLS. URIs are `https://host:port/…`
/// (an `http` URI is dialled the same way: every internal hop is TLS).
#[derive(Clone)]
pub struct Connector {
    tls: tokio_rustls::TlsConnector,
    expect: Role,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("expect", &self.expect)
            .finish_non_exhaustive()
    }
}

impl Connector {
    /// Dials with `identity`, accepting a server of one of `expect`.
    pub fn new(identity: &Identity, expect: &[Role]) -> Result<Connector, TrustError> {
        let first = *expect
            .first()
            .ok_or_else(|| TrustError::Certificate("no role to expect".to_owned()))?;
        Ok(Connector {
            tls: identity.connector(expect)?,
            expect: first,
        })
    }
}

impl Connector {
    /// Dials with `identity`, accepting a server of one of `expect` whose
    /// certificate may serve `model`: a worker scoped to another model is
    /// refused in the handshake, before a byte of a request is sent.
    pub fn for_model(
        identity: &Identity,
        expect: &[Role],
        model: &str,
    ) -> Result<Connector, TrustError> {
        let first = *expect
            .first()
            .ok_or_else(|| TrustError::Certificate("no role to expect".to_owned()))?;
        Ok(Connector {
            tls: identity.connector_for_model(expect, model)?,
            expect: first,
        })
    }
}

impl tower_service::Service<Uri> for Connector {
    type Response = TlsConnection;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TlsConnection>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let (tls, expect) = (self.tls.clone(), self.expect);
        Box::pin(async move {
            let authority = uri
                .authority()
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "URI without host"))?;
            let port = authority.port_u16().unwrap_or(443);
            let addr = format!("{}:{port}", authority.host());
            let s = dial(&tls, expect, &addr).await?;
            Ok(TlsConnection(TokioIo::new(s)))
        })
    }
}

/// A TLS connection hyper can use.
#[derive(Debug)]
pub struct TlsConnection(TokioIo<TlsStream<Wire>>);

impl Connection for TlsConnection {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl Read for TlsConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl Write for TlsConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
