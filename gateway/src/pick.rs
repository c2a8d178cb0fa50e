//! Picking a worker for a request: among the routable workers of the model,
//! the one with the most free KV pages per request this gateway already has
//! in flight on it, then the shortest queue; ties go round-robin. The
//! in-flight count keeps one gateway from sending every request between two
//! heartbeats to the same worker. Never an unroutable node: the table holds
//! only routable ones. A worker this gateway failed to reach is skipped for
//! [`SHUN`] (before the control plane's TTL would notice), unless every
//! worker of the model is shunned.
//!
//! A request never goes twice to the same worker; its `NodeLease` gives the
//! in-flight count back when dropped.

use bulkhead_control_api::NodeView;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a worker that could not be reached is skipped.
pub(crate) const SHUN: Duration = Duration::from_secs(5);

/// Round-robin counter, this gateway's requests in flight per worker, and
/// the workers it recently failed to reach.
#[derive(Debug, Default)]
pub(crate) struct Picker {
    next: AtomicUsize,
    in_flight: Mutex<HashMap<i64, u64>>,
    shunned: Mutex<HashMap<i64, Instant>>,
}

/// A request's claim on a worker; released when dropped.
#[derive(Debug)]
pub(crate) struct NodeLease {
    picker: Arc<Picker>,
    node: i64,
}

impl Drop for NodeLease {
    fn drop(&mut self) {
        let mut m = self
            .picker
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.node) {
            *n = n.saturating_sub(1);
        }
    }
}

impl Picker {
    /// Skips `node` for [`SHUN`]: this gateway could not reach it.
    pub(crate) fn unreachable(&self, node: i64) {
        let mut s = self.shunned.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        s.retain(|_, until| *until > now);
        s.insert(node, now + SHUN);
    }

    /// The worker to send the next request to, if any, with its lease:
    /// never one in `tried`; a shunned one only if all the others are.
    pub(crate) fn pick<'a>(
        self: &Arc<Self>,
        workers: &'a [NodeView],
        tried: &[i64],
    ) -> Option<(&'a NodeView, NodeLease)> {
        let candidates: Vec<&NodeView> =
            workers.iter().filter(|n| !tried.contains(&n.id)).collect();
        let healthy: Vec<&NodeView> = {
            let s = self.shunned.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            candidates
                .iter()
                .copied()
                .filter(|n| s.get(&n.id).is_none_or(|until| *until <= now))
                .collect()
        };
        let workers = if healthy.is_empty() {
            candidates
        } else {
            healthy
        };
        let mut m = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        let score = |n: &NodeView| {
            let mine = m.get(&n.id).copied().unwrap_or(0);
            n.load.map_or((0, 0), |l| {
                (l.free_pages / (1 + mine), u64::MAX - l.queue_depth - mine)
            })
        };
        let best = workers.iter().map(|n| score(n)).max()?;
        let top: Vec<&NodeView> = workers.into_iter().filter(|n| score(n) == best).collect();
        let chosen = top[self.next.fetch_add(1, Ordering::Relaxed) % top.len()];
        *m.entry(chosen.id).or_insert(0) += 1;
        Some((
            chosen,
            NodeLease {
                picker: Arc::clone(self),
                node: chosen.id,
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bulkhead_control_api::{NodeLoad, NodeRole, Parallelism, RegisterNode, Timestamp};

    fn node(id: i64, free: u64, queue: u64) -> NodeView {
        NodeView {
            id,
            registration: RegisterNode {
                name: format!("n{id}"),
                role: NodeRole::Decode,
                model: "@cf/a/b".parse().unwrap(),
                address: String::new(),
                transfer_address: None,
                kv_pool_tokens: 1,
                weights_sha256: String::new(),
                quantization: String::new(),
                page_size: 16,
                kv_budget_bytes: 1,
                parallelism: Parallelism::default(),
                prefill: None,
            },
            load: Some(NodeLoad {
                free_pages: free,
                total_pages: 100,
                queue_depth: queue,
            }),
            registered_at: Timestamp::from_millis(0),
            last_seen_at: Timestamp::from_millis(0),
            routable: true,
            unroutable_reason: None,
        }
    }

    #[test]
    fn load_then_own_requests_then_round_robin() {
        let p = Arc::new(Picker::default());
        let ws = [node(1, 10, 0), node(2, 50, 3), node(3, 50, 1)];
        let (n, first) = p.pick(&ws, &[]).unwrap();
        assert_eq!(n.id, 3, "most free pages, then shortest queue");
        // With one request in flight on 3, 2 (50 free, queue 3) beats 3 (25 per request).
        let (n, second) = p.pick(&ws, &[]).unwrap();
        assert_eq!(n.id, 2);
        drop((first, second));
        assert_eq!(p.pick(&ws, &[]).unwrap().0.id, 3, "leases given back");
        assert_eq!(
            p.pick(&ws, &[3]).unwrap().0.id,
            2,
            "a tried worker is not picked again"
        );
        p.unreachable(3);
        assert_eq!(
            p.pick(&ws, &[]).unwrap().0.id,
            2,
            "an unreachable worker is skipped"
        );
        p.unreachable(2);
        p.unreachable(1);
        assert!(
            p.pick(&ws, &[]).is_some(),
            "when every worker is shunned, one is still tried"
        );
        let even = [node(1, 5, 0), node(2, 5, 0)];
        let q = Arc::new(Picker::default());
        let ids: Vec<i64> = (0..4).map(|_| q.pick(&even, &[]).unwrap().0.id).collect();
        assert!(ids.contains(&1) && ids.contains(&2), "{ids:?}");
        assert!(p.pick(&[], &[]).is_none());
        assert!(p.pick(&even, &[1, 2]).is_none());
    }
}
