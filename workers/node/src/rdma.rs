//! Setting up the RDMA page path on a connection whose hellos said `rdma`
//! (feature `rdma`): the queue-pair endpoints are exchanged over the same
//! TCP connection, which then carries decode's control frames; pages and
//! prefill's frames travel as RDMA SENDs, in order.

use bulkhead_transfer::Checksums;
use bulkhead_transfer::TransportError;
use bulkhead_transfer::rdma::{RdmaReceiver, RdmaTransport};
use tokio::net::TcpStream;

/// Runs `f` with a blocking clone of `sock`, then hands `sock` back.
async fn with_blocking<T: Send + 'static>(
    sock: TcpStream,
    f: impl FnOnce(std::net::TcpStream) -> Result<T, TransportError> + Send + 'static,
) -> Result<(TcpStream, T), TransportError> {
    let std = sock.into_std()?;
    std.set_nonblocking(false)?;
    let control = std.try_clone()?;
    let value = tokio::task::spawn_blocking(move || f(control))
        .await
        .map_err(|_| TransportError::Unavailable("the RDMA setup thread failed".into()))??;
    std.set_nonblocking(true)?;
    Ok((TcpStream::from_std(std)?, value))
}

/// The prefill side: an RDMA sender on `device`.
pub(crate) async fn sender(
    sock: TcpStream,
    device: Option<String>,
) -> Result<(TcpStream, RdmaTransport), TransportError> {
    with_blocking(sock, move |c| {
        RdmaTransport::connect(device.as_deref(), c, Checksums::On)
    })
    .await
}

/// The decode side: an RDMA receiver on `device` with buffers of
/// `frame_bytes`.
pub(crate) async fn receiver(
    sock: TcpStream,
    device: Option<String>,
    frame_bytes: usize,
) -> Result<(TcpStream, RdmaReceiver), TransportError> {
    with_blocking(sock, move |c| {
        RdmaReceiver::connect(device.as_deref(), c, 16, frame_bytes)
    })
    .await
}
