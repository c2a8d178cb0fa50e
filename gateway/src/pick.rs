//! Picking a worker for a request: among the routable workers of the model,
//! the one with the most free KV pages, then the shortest queue; ties go
//! round-robin so equal workers share the load. Never an unroutable node:
//! the table holds only routable ones.

use bulkhead_control_api::NodeView;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Round-robin counter shared by the handlers.
#[derive(Debug, Default)]
pub(crate) struct Picker {
    next: AtomicUsize,
}

impl Picker {
    /// The worker to send the next request to, if any.
    pub(crate) fn pick<'a>(&self, workers: &'a [NodeView]) -> Option<&'a NodeView> {
        let score = |n: &NodeView| {
            n.load
                .map_or((0, 0), |l| (l.free_pages, u64::MAX - l.queue_depth))
        };
        let best = workers.iter().map(score).max()?;
        let top: Vec<&NodeView> = workers.iter().filter(|n| score(n) == best).collect();
        let i = self.next.fetch_add(1, Ordering::Relaxed) % top.len();
        Some(top[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bulkhead_control_api::{NodeLoad, NodeRole, Parallelism, RegisterNode, Timestamp};

    fn node(name: &str, free: u64, queue: u64) -> NodeView {
        NodeView {
            id: 1,
            registration: RegisterNode {
                name: name.to_owned(),
                role: NodeRole::Decode,
                model: "@cf/a/b".parse().unwrap(),
                address: name.to_owned(),
                transfer_address: None,
                kv_pool_tokens: 1,
                weights_sha256: String::new(),
                quantization: String::new(),
                page_size: 16,
                kv_budget_bytes: 1,
                parallelism: Parallelism::default(),
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
    fn most_free_pages_then_shortest_queue_then_round_robin() {
        let p = Picker::default();
        let ws = [node("a", 10, 0), node("b", 50, 3), node("c", 50, 1)];
        assert_eq!(p.pick(&ws).unwrap().registration.name, "c");
        let even = [node("a", 5, 0), node("b", 5, 0)];
        let picks: Vec<String> = (0..4)
            .map(|_| p.pick(&even).unwrap().registration.name.clone())
            .collect();
        assert!(picks.contains(&"a".to_owned()) && picks.contains(&"b".to_owned()));
        assert!(p.pick(&[]).is_none());
    }
}
