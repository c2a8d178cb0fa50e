//! How page bytes travel: the [`Transport`] trait, grants and slots, and
//! the TCP implementation.
//!
//! A sender never names memory. It holds a [`Grant`] (built from the decode
//! worker's request) and can only obtain [`Slot`]s from it; a slot carries
//! its transfer id, index and granted generation, so a page can be written
//! only to a slot of the transfer it was granted for. The receiver maps
//! (transfer, slot) to physical pages through its own table.
//!
//! [`TcpTransport`] writes block while the peer does not read (TCP
//! backpressure), up to a write timeout. `SlowTransport`, which delays every
//! page, exists only with the `test-hooks` feature.

use crate::checksum::{Checksums, page_crc};
use crate::mac::FrameKey;
use crate::mac::{TAG_LEN, tag_checksum};
use crate::wire::{Message, PageHeader};
use bulkhead_kv::{Generation, TransferId};
use std::future::Future;
use std::time::Duration;
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// The landing slots a decode worker granted for one transfer, and the key
/// it drew for the transfer's tags.
#[derive(Debug, Clone)]
pub struct Grant {
    transfer: TransferId,
    generations: Vec<Generation>,
    key: FrameKey,
}

/// One landing slot of a grant. Only [`Grant::slot`] makes one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    transfer: TransferId,
    index: u32,
    generation: Generation,
}

/// Why a transport could not deliver.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The connection failed or closed.
    #[error("transport I/O: {0}")]
    Io(#[from] std::io::Error),
    /// A write did not finish in time (the peer stopped reading).
    #[error("transport write timed out after {0:?}")]
    Timeout(Duration),
    /// The transport cannot work on this host.
    #[error("{0}")]
    Unavailable(String),
}

/// What writing a page gives: the checksum it sent, or why it could not.
pub type Written = Result<u64, TransportError>;

/// Moves pages from a prefill worker into a decode worker's granted slots,
/// and control frames after them, in order.
pub trait Transport: Send {
    /// Writes `page` into `slot`, tagged under the transfer's `key`;
    /// returns the checksum it sent.
    fn write_page(
        &mut self,
        slot: Slot,
        page: &[u8],
        key: &FrameKey,
    ) -> impl Future<Output = Written> + Send;

    /// Sends a control frame, ordered after every page written before it.
    fn send(&mut self, msg: &Message) -> impl Future<Output = Result<(), TransportError>> + Send;
}

impl Grant {
    /// The grant of a decode worker's prefill request.
    pub fn new(transfer: TransferId, generations: Vec<Generation>, key: FrameKey) -> Self {
        Grant {
            transfer,
            generations,
            key,
        }
    }

    /// The transfer's key.
    pub fn key(&self) -> &FrameKey {
        &self.key
    }

    /// The transfer.
    pub fn transfer(&self) -> TransferId {
        self.transfer
    }

    /// Slots granted.
    pub fn len(&self) -> usize {
        self.generations.len()
    }

    /// Whether no slot was granted.
    pub fn is_empty(&self) -> bool {
        self.generations.is_empty()
    }

    /// Slot `index`, if granted.
    pub fn slot(&self, index: usize) -> Option<Slot> {
        Some(Slot {
            transfer: self.transfer,
            index: u32::try_from(index).ok()?,
            generation: *self.generations.get(index)?,
        })
    }
}

impl Slot {
    /// The header of `page` sent into this slot: its tag under `key` (and
    /// the tag's first 64 bits as its checksum), or in a benchmark its CRC
    /// or nothing.
    pub fn header(&self, checksums: Checksums, page: &[u8], key: &FrameKey) -> PageHeader {
        let (checksum, mac) = match checksums {
            Checksums::On => {
                let tag = key.page_tag(self.index, self.generation, page);
                (tag_checksum(&tag), tag)
            }
            Checksums::CrcOnlyForBenchmark => (page_crc(page), [0; TAG_LEN]),
            Checksums::OffForBenchmark => (0, [0; TAG_LEN]),
        };
        PageHeader {
            transfer: self.transfer,
            slot: self.index,
            generation: self.generation,
            checksum,
            mac,
        }
    }

    /// The slot's index in its grant.
    pub fn index(&self) -> usize {
        self.index as usize
    }

    /// The granted generation.
    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// The transfer.
    pub fn transfer(&self) -> TransferId {
        self.transfer
    }
}

/// Length-prefixed frames over a TCP stream (or any byte stream). Writes
/// block while the peer does not read (TCP backpressure), up to `timeout`.
#[derive(Debug)]
pub struct TcpTransport<W> {
    writer: W,
    checksums: Checksums,
    timeout: Duration,
}

impl<W: AsyncWrite + Unpin + Send> TcpTransport<W> {
    /// A transport writing to `writer`.
    pub fn new(writer: W, checksums: Checksums, timeout: Duration) -> Self {
        TcpTransport {
            writer,
            checksums,
            timeout,
        }
    }

    async fn write_all(&mut self, bytes: &[u8]) -> Result<(), TransportError> {
        tokio::time::timeout(self.timeout, self.writer.write_all(bytes))
            .await
            .map_err(|_| TransportError::Timeout(self.timeout))??;
        Ok(())
    }
}

impl<W: AsyncWrite + Unpin + Send> Transport for TcpTransport<W> {
    async fn write_page(&mut self, slot: Slot, page: &[u8], key: &FrameKey) -> Written {
        let header = slot.header(self.checksums, page, key);
        let checksum = header.checksum;
        // Header and payload in one vectored write: one syscall per page.
        let head = header.encode(page.len());
        let mut frame = bytes::Buf::chain(&head[..], page);
        tokio::time::timeout(self.timeout, self.writer.write_all_buf(&mut frame))
            .await
            .map_err(|_| TransportError::Timeout(self.timeout))??;
        Ok(checksum)
    }

    async fn send(&mut self, msg: &Message) -> Result<(), TransportError> {
        self.write_all(&msg.encode()).await?;
        self.writer.flush().await?;
        Ok(())
    }
}

/// A transport that waits `delay` before every frame: a deliberately slow
/// link, for tests of aborts and crashes in the middle of a transfer. Only
/// in builds with the `test-hooks` feature. Counts the frames it delayed,
/// so a test can tell the delay was in force.
#[cfg(feature = "test-hooks")]
#[derive(Debug)]
pub struct SlowTransport<T> {
    inner: T,
    delay: Duration,
    delayed: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

#[cfg(feature = "test-hooks")]
impl<T: Transport> SlowTransport<T> {
    /// Wraps `inner`; every delayed frame adds one to `delayed`.
    pub fn new(
        inner: T,
        delay: Duration,
        delayed: std::sync::Arc<std::sync::atomic::AtomicU64>,
    ) -> Self {
        SlowTransport {
            inner,
            delay,
            delayed,
        }
    }
}

/// Waits `delay`, then counts one delayed frame.
#[cfg(feature = "test-hooks")]
async fn hold_back(delay: Duration, delayed: &std::sync::atomic::AtomicU64) {
    tokio::time::sleep(delay).await;
    delayed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

#[cfg(feature = "test-hooks")]
impl<T: Transport> Transport for SlowTransport<T> {
    async fn write_page(&mut self, slot: Slot, page: &[u8], key: &FrameKey) -> Written {
        hold_back(self.delay, &self.delayed).await;
        self.inner.write_page(slot, page, key).await
    }

    async fn send(&mut self, msg: &Message) -> Result<(), TransportError> {
        hold_back(self.delay, &self.delayed).await;
        self.inner.send(msg).await
    }
}
