//! Picking a worker for a request: among the routable workers of the model,
//! the one with the most free KV pages per request this gateway already has
//! in flight on it, then the shortest queue; ties go round-robin. A request
//! that continues a conversation ([`AffinityKey`]) goes instead to the
//! worker its key ranks highest among those whose load is near the best
//! (at least half the best's free pages per request, at most one more in
//! its queue), so its turns meet their cached prefix while load still
//! decides between a busy worker and an idle one. The
//! in-flight count keeps one gateway from sending every request between two
//! heartbeats to the same worker. Never an unroutable node: the table holds
//! only routable ones. A worker this gateway failed to reach is skipped for
//! [`SHUN`] (before the control plane's TTL would notice), unless every
//! worker of the model is shunned.
//!
//! A request never goes twice to the same worker; its `NodeLease` gives the
//! in-flight count back when dropped.

use crate::affinity::AffinityKey;
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
    /// never one in `tried`; a shunned one only if all the others are;
    /// with an affinity key, the one it ranks highest among those near the
    /// best load.
    pub(crate) fn pick<'a>(
        self: &Arc<Self>,
        workers: &'a [NodeView],
        tried: &[i64],
        affinity: Option<AffinityKey>,
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
        let chosen = match affinity {
            Some(key) => {
                // Near the best: half its free pages per request, one more
                // request queued (scores count the queue down from MAX).
                let near = |s: (u64, u64)| {
                    s.0.saturating_mul(2) >= best.0 && s.1.saturating_add(1) >= best.1
                };
                workers
                    .into_iter()
                    .filter(|n| near(score(n)))
                    .max_by_key(|n| key.weight(n.id))?
            }
            None => {
                let top: Vec<&NodeView> =
                    workers.into_iter().filter(|n| score(n) == best).collect();
                top[self.next.fetch_add(1, Ordering::Relaxed) % top.len()]
            }
        };
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
        let (n, first) = p.pick(&ws, &[], None).unwrap();
        assert_eq!(n.id, 3, "most free pages, then shortest queue");
        // With one request in flight on 3, 2 (50 free, queue 3) beats 3 (25 per request).
        let (n, second) = p.pick(&ws, &[], None).unwrap();
        assert_eq!(n.id, 2);
        drop((first, second));
        assert_eq!(p.pick(&ws, &[], None).unwrap().0.id, 3, "leases given back");
        assert_eq!(
            p.pick(&ws, &[3], None).unwrap().0.id,
            2,
            "a tried worker is not picked again"
        );
        p.unreachable(3);
        assert_eq!(
            p.pick(&ws, &[], None).unwrap().0.id,
            2,
            "an unreachable worker is skipped"
        );
        p.unreachable(2);
        p.unreachable(1);
        assert!(
            p.pick(&ws, &[], None).is_some(),
            "when every worker is shunned, one is still tried"
        );
        let even = [node(1, 5, 0), node(2, 5, 0)];
        let q = Arc::new(Picker::default());
        let ids: Vec<i64> = (0..4)
            .map(|_| q.pick(&even, &[], None).unwrap().0.id)
            .collect();
        assert!(ids.contains(&1) && ids.contains(&2), "{ids:?}");
        assert!(p.pick(&[], &[], None).is_none());
        assert!(p.pick(&even, &[1, 2], None).is_none());
    }

    fn key(account: &str, session: &str) -> AffinityKey {
        let body: bulkhead_worker_api::GenerateBody =
            serde_json::from_value(serde_json::json!({"prompt": "the same prompt"})).unwrap();
        let ns = crate::affinity::Namespace {
            account,
            tenant: 1,
            model: "@cf/a/b",
            config_version: Some(1),
        };
        AffinityKey::of(ns, Some(session), &body).unwrap()
    }

    #[test]
    fn a_conversation_sticks_to_one_worker_unless_it_is_much_busier() {
        let p = Arc::new(Picker::default());
        let ws: Vec<NodeView> = (1..=8).map(|id| node(id, 50, 0)).collect();
        let k = key("a", "chat-1");
        let home = p.pick(&ws, &[], Some(k)).unwrap().0.id;
        for _ in 0..10 {
            let (n, _lease) = p.pick(&ws, &[], Some(k)).unwrap();
            assert_eq!(n.id, home, "every turn goes home");
        }
        // Home one request busier than the rest: still near the best.
        let mut busy = ws.clone();
        busy[(home - 1) as usize] = node(home, 50, 1);
        assert_eq!(p.pick(&busy, &[], Some(k)).unwrap().0.id, home);
        // Two more queued, or under half the best's free pages: load wins.
        busy[(home - 1) as usize] = node(home, 50, 2);
        assert_ne!(p.pick(&busy, &[], Some(k)).unwrap().0.id, home);
        busy[(home - 1) as usize] = node(home, 24, 0);
        assert_ne!(p.pick(&busy, &[], Some(k)).unwrap().0.id, home);
        // A worker tried already is skipped; the key's next choice serves.
        let next = p.pick(&ws, &[home], Some(k)).unwrap().0.id;
        assert_ne!(next, home);
    }

    #[test]
    fn another_tenants_identical_conversation_gets_no_affinity_to_it() {
        // Another account's identical prompt and session name are placed
        // by a key of their own: across accounts they spread over the
        // workers rather than following account a's conversation.
        let p = Arc::new(Picker::default());
        let ws: Vec<NodeView> = (1..=8).map(|id| node(id, 50, 0)).collect();
        let home = p.pick(&ws, &[], Some(key("a", "chat-1"))).unwrap().0.id;
        let others: std::collections::HashSet<i64> = (0..32)
            .map(|i| {
                let k = key(&format!("account-{i}"), "chat-1");
                assert_ne!(k, key("a", "chat-1"));
                p.pick(&ws, &[], Some(k)).unwrap().0.id
            })
            .collect();
        assert!(others.len() >= 4, "{others:?}");
        assert!(others.iter().any(|id| *id != home));
    }
}
