//! A link that breaks page frames on purpose, for the chaos soak
//! (`bulkhead bench chaos`): a share of the frames a prefill worker sends
//! is corrupted (tagged under a key the decode worker never drew), delayed,
//! dropped, duplicated or reordered (held back behind the next frame).
//! [`ChaosCounts`] says how many of each, so a soak can show every fault
//! was injected. The transport exists only with the `test-hooks` feature.

use std::sync::atomic::{AtomicU64, Ordering};

/// Frames broken so far, by kind.
#[derive(Debug, Default)]
pub struct ChaosCounts {
    /// Sent with a tag the receiver cannot verify.
    pub corrupted: AtomicU64,
    /// Held back a while before sending.
    pub delayed: AtomicU64,
    /// Never sent.
    pub dropped: AtomicU64,
    /// Sent twice.
    pub duplicated: AtomicU64,
    /// Sent after the frame that followed it.
    pub reordered: AtomicU64,
}

impl ChaosCounts {
    /// Each kind and its count.
    pub fn by_kind(&self) -> [(&'static str, u64); 5] {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        [
            ("corrupted", g(&self.corrupted)),
            ("delayed", g(&self.delayed)),
            ("dropped", g(&self.dropped)),
            ("duplicated", g(&self.duplicated)),
            ("reordered", g(&self.reordered)),
        ]
    }
}

#[cfg(feature = "test-hooks")]
pub use link::ChaosTransport;

#[cfg(feature = "test-hooks")]
mod link {
    use super::ChaosCounts;
    use crate::checksum::Checksums;
    use crate::mac::FrameKey;
    use crate::transport::{Slot, Transport, TransportError};
    use crate::wire::Message;
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    /// Breaks `percent` of the page frames `inner` sends, one fault each.
    #[derive(Debug)]
    pub struct ChaosTransport<T> {
        inner: T,
        percent: u64,
        rng: u64,
        /// A page held back, to go after the next frame.
        held: Option<(Slot, Vec<u8>, FrameKey)>,
        counts: Arc<ChaosCounts>,
    }

    impl<T: Transport> ChaosTransport<T> {
        /// Wraps `inner`; `counts` records every fault.
        pub fn new(inner: T, percent: u8, counts: Arc<ChaosCounts>) -> Self {
            let seed = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1;
            ChaosTransport {
                inner,
                percent: u64::from(percent.min(100)),
                rng: seed,
                held: None,
                counts,
            }
        }

        fn next(&mut self) -> u64 {
            // xorshift64*
            self.rng ^= self.rng >> 12;
            self.rng ^= self.rng << 25;
            self.rng ^= self.rng >> 27;
            self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }

        /// Sends the page held back, if any.
        async fn release(&mut self) -> Result<(), TransportError> {
            if let Some((slot, page, key)) = self.held.take() {
                self.inner.write_page(slot, &page, &key).await?;
            }
            Ok(())
        }
    }

    impl<T: Transport> Transport for ChaosTransport<T> {
        async fn write_page(
            &mut self,
            slot: Slot,
            page: &[u8],
            key: &FrameKey,
        ) -> crate::transport::Written {
            let fault = (self.next() % 100 < self.percent).then(|| self.next() % 5);
            let sum = match fault {
                Some(0) => {
                    self.counts.corrupted.fetch_add(1, Ordering::Relaxed);
                    let (_, wrong) = FrameKey::generate();
                    self.inner.write_page(slot, page, &wrong).await?;
                    // The digest covers what prefill meant to send.
                    slot.header(Checksums::On, page, key).checksum
                }
                Some(1) => {
                    self.counts.delayed.fetch_add(1, Ordering::Relaxed);
                    let ms = self.next() % 200;
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    self.inner.write_page(slot, page, key).await?
                }
                Some(2) => {
                    self.counts.dropped.fetch_add(1, Ordering::Relaxed);
                    slot.header(Checksums::On, page, key).checksum
                }
                Some(3) => {
                    self.counts.duplicated.fetch_add(1, Ordering::Relaxed);
                    self.inner.write_page(slot, page, key).await?;
                    self.inner.write_page(slot, page, key).await?
                }
                Some(_) if self.held.is_none() => {
                    self.counts.reordered.fetch_add(1, Ordering::Relaxed);
                    self.held = Some((slot, page.to_vec(), key.clone()));
                    return Ok(slot.header(Checksums::On, page, key).checksum);
                }
                _ => self.inner.write_page(slot, page, key).await?,
            };
            self.release().await?;
            Ok(sum)
        }

        async fn send(&mut self, msg: &Message) -> Result<(), TransportError> {
            self.inner.send(msg).await?;
            self.release().await
        }
    }
}
