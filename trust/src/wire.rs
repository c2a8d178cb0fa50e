//! The byte stream under every TLS connection: TCP with a read buffer.
//!
//! rustls asks its transport for at most 4 KiB a read, so a TLS stream
//! straight over a socket makes four or five `read` system calls for every
//! 16 KiB record: a KV transfer of 100 MB spends more time in them than in
//! AES-GCM. [`Wire`] reads the socket in [`WIRE_READ_BUFFER`] pieces and
//! serves rustls's small reads from memory; writes pass straight through.

use tokio::io::BufReader;
use tokio::net::TcpStream;

/// Bytes one `read` system call on a TLS connection's socket may take
/// (`bench transfer` on a two-core EPYC, mTLS: 64 KiB moved 1.25–1.61 GB/s
/// where rustls's own 4 KiB reads moved 0.84–0.96; 32 and 128 KiB measured
/// no better than 4). At most [`crate::listen::MAX_HANDSHAKES`] of them are allocated for
/// connections still in their handshake.
pub const WIRE_READ_BUFFER: usize = 64 << 10;

/// A TCP stream as TLS runs over it.
pub type Wire = BufReader<TcpStream>;

/// `tcp` as TLS runs over it.
pub fn wire(tcp: TcpStream) -> Wire {
    BufReader::with_capacity(WIRE_READ_BUFFER, tcp)
}
