//! Setting up the RDMA page path on a connection whose hellos said `rdma`
//! (feature `rdma`): the queue-pair endpoints are exchanged over the same
//! mutual-TLS connection, which then carries decode's control frames; pages
//! and prefill's frames travel as RDMA SENDs, in order.

use bulkhead_transfer::Checksums;
use bulkhead_transfer::TransportError;
use bulkhead_transfer::rdma::{Exchange, RdmaReceiver, RdmaTransport};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Longest endpoint line accepted.
const MAX_LINE: usize = 4096;

/// Runs `f` on a blocking thread, swapping its endpoint line for the peer's
/// over `sock`.
async fn with_exchange<S, T>(
    sock: &mut S,
    f: impl FnOnce(Exchange) -> Result<T, TransportError> + Send + 'static,
) -> Result<T, TransportError>
where
    S: AsyncRead + AsyncWrite + Unpin,
    T: Send + 'static,
{
    let gone = || std::io::Error::other("the transfer connection is gone");
    let (local_tx, local_rx) = tokio::sync::oneshot::channel::<String>();
    let (remote_tx, remote_rx) = std::sync::mpsc::channel::<std::io::Result<String>>();
    let exchange: Exchange = Box::new(move |line| {
        local_tx.send(line).map_err(|_| gone())?;
        remote_rx.recv().map_err(|_| gone())?
    });
    let task = tokio::task::spawn_blocking(move || f(exchange));
    // The verbs thread may fail before it has a line to send.
    if let Ok(line) = local_rx.await {
        let swapped = async {
            sock.write_all(line.as_bytes()).await?;
            sock.write_all(b"\n").await?;
            sock.flush().await?;
            read_line(sock).await
        }
        .await;
        let _ = remote_tx.send(swapped);
    }
    task.await
        .map_err(|_| TransportError::Unavailable("the RDMA setup thread failed".into()))?
}

/// One line, read byte by byte so nothing after it is consumed.
async fn read_line<S: AsyncRead + Unpin>(sock: &mut S) -> std::io::Result<String> {
    let mut line = Vec::new();
    loop {
        let b = sock.read_u8().await?;
        if b == b'\n' {
            return String::from_utf8(line).map_err(std::io::Error::other);
        }
        if line.len() >= MAX_LINE {
            return Err(std::io::Error::other("endpoint line too long"));
        }
        line.push(b);
    }
}

/// The prefill side: an RDMA sender on `device`.
pub(crate) async fn sender<S: AsyncRead + AsyncWrite + Unpin>(
    sock: &mut S,
    device: Option<String>,
) -> Result<RdmaTransport, TransportError> {
    with_exchange(sock, move |x| {
        RdmaTransport::connect(device.as_deref(), x, Checksums::On)
    })
    .await
}

/// The decode side: an RDMA receiver on `device` with buffers of
/// `frame_bytes`.
pub(crate) async fn receiver<S: AsyncRead + AsyncWrite + Unpin>(
    sock: &mut S,
    device: Option<String>,
    frame_bytes: usize,
) -> Result<RdmaReceiver, TransportError> {
    with_exchange(sock, move |x| {
        RdmaReceiver::connect(device.as_deref(), x, 16, frame_bytes)
    })
    .await
}
