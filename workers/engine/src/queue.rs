//! The prefill work queued on an engine, priced by its measured speed, so
//! that admission counts the work ahead of a prompt and not only the prompt
//! (a prompt that fits the deadline alone may not fit behind ten others).
//!
//! [`PrefillQueue`] is a gauge of the microseconds of prompt computation
//! admitted and not yet done. Admission reserves a prompt's cost on the
//! caller's thread ([`PrefillQueue::reserve`]): refused, with how long to
//! wait, when the work ahead plus its own would overrun the deadline. The
//! [`QueueCharge`] travels with the request to the engine thread, is paid
//! down as chunks are computed (or found in the prefix cache), and whatever
//! is left is given back when it is dropped: a request cancelled, failed or
//! refused later never leaves its cost behind.

use crate::speed::PrefillSpeed;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The gauge: queued prefill work, in microseconds at the measured speed.
#[derive(Debug)]
pub(crate) struct PrefillQueue {
    queued_us: AtomicU64,
    deadline_us: u64,
}

/// A refusal: the work ahead and how long until this prompt would fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QueueFull {
    /// Queued work ahead of the prompt, in milliseconds.
    pub(crate) queued_ms: u64,
    /// How long until enough of it is done for the prompt to fit.
    pub(crate) retry_after_ms: u64,
}

/// One request's share of the gauge, given back as it is computed and
/// whatever is left when it is dropped.
#[derive(Debug)]
pub(crate) struct QueueCharge {
    queue: Arc<PrefillQueue>,
    left_us: u64,
}

impl PrefillQueue {
    /// An empty queue whose prompts must be done within `deadline`.
    pub(crate) fn new(deadline: Duration) -> Arc<PrefillQueue> {
        Arc::new(PrefillQueue {
            queued_us: AtomicU64::new(0),
            deadline_us: u64::try_from(deadline.as_micros()).unwrap_or(u64::MAX),
        })
    }

    /// Work queued now, in microseconds.
    pub(crate) fn queued_us(&self) -> u64 {
        self.queued_us.load(Ordering::Acquire)
    }

    /// Reserves `cost_us` of prefill if the work queued ahead plus it is
    /// done within the deadline, or if nothing is queued (a prompt alone is
    /// held to the deadline by its length limit).
    pub(crate) fn reserve(self: &Arc<Self>, cost_us: u64) -> Result<QueueCharge, QueueFull> {
        let mut queued = self.queued_us.load(Ordering::Acquire);
        loop {
            let total = queued.saturating_add(cost_us);
            if queued > 0 && total > self.deadline_us {
                return Err(QueueFull {
                    queued_ms: queued / 1000,
                    retry_after_ms: (total - self.deadline_us).div_ceil(1000),
                });
            }
            match self.queued_us.compare_exchange_weak(
                queued,
                total,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Ok(QueueCharge {
                        queue: Arc::clone(self),
                        left_us: cost_us,
                    });
                }
                Err(now) => queued = now,
            }
        }
    }
}

/// Microseconds to prefill tokens `done..n` of a prompt of `n` at `speed`.
pub(crate) fn remaining_us(speed: &PrefillSpeed, n: usize, done: usize) -> u64 {
    let secs = speed.prompt_secs(n) - speed.prompt_secs(done.min(n));
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let us = (secs.max(0.0) * 1e6).ceil() as u64;
    us
}

impl QueueCharge {
    /// What is left of it is now `left_us` (never more than before).
    pub(crate) fn pay_down_to(&mut self, left_us: u64) {
        if left_us < self.left_us {
            self.queue
                .queued_us
                .fetch_sub(self.left_us - left_us, Ordering::AcqRel);
            self.left_us = left_us;
        }
    }
}

impl Drop for QueueCharge {
    fn drop(&mut self) {
        self.pay_down_to(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_work_ahead_counts_and_every_charge_comes_back() {
        let q = PrefillQueue::new(Duration::from_secs(10));
        // Alone, even a prompt over the deadline is the length limit's
        // business, not the queue's.
        let big = q.reserve(12_000_000).expect("alone");
        assert_eq!(
            q.reserve(1).expect_err("behind it"),
            QueueFull {
                queued_ms: 12_000,
                retry_after_ms: 2_001,
            }
        );
        drop(big);
        assert_eq!(q.queued_us(), 0);
        let mut a = q.reserve(6_000_000).expect("first");
        let b = q.reserve(4_000_000).expect("fits exactly");
        let refused = q.reserve(500_000).expect_err("over the deadline");
        assert_eq!(refused.queued_ms, 10_000);
        assert_eq!(refused.retry_after_ms, 500);
        a.pay_down_to(1_000_000);
        assert_eq!(q.queued_us(), 5_000_000);
        a.pay_down_to(2_000_000); // never back up
        assert_eq!(q.queued_us(), 5_000_000);
        let c = q.reserve(500_000).expect("room again");
        drop((a, b, c));
        assert_eq!(q.queued_us(), 0);
    }
}
