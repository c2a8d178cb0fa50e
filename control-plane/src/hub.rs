//! The routing hub: the routing table's version, which gateways are live
//! and which version each has applied. One task owns that state and is fed
//! by a closed enum of events; handlers talk to it through [`Hub`].
//!
//! Gateways long-poll `GET /admin/v1/routing?gateway=ID&version=V`, where V
//! is the version they have applied. A change that must be in force
//! everywhere before it is acknowledged (a visibility flip) publishes a new
//! version and waits until every gateway seen within the lease has applied
//! it, or until the lease has run out: a gateway that has not heard from the
//! control plane for a lease stops admitting requests on its own.
//!
//! A hub younger than a lease (a restarted control plane) may not know every
//! live gateway, so it waits the lease out; a version a gateway reports that
//! this hub never served counts as not applied. Every successful admin write
//! publishes a version (middleware in `http`); visibility and allowlist changes
//! also wait for it ([`Hub::publish_and_wait`]).

use bulkhead_control_api::{ModelSlug, Propagation};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, watch};

/// A handle on the hub task; cheap to clone.
#[derive(Debug, Clone)]
pub struct Hub {
    events: mpsc::UnboundedSender<Event>,
    version: watch::Receiver<u64>,
    planned: watch::Receiver<Arc<BTreeSet<ModelSlug>>>,
    lease: Duration,
}

enum Event {
    /// Whether `slug`'s latest flip was a planned withdrawal.
    Plan { slug: ModelSlug, planned: bool },
    /// A gateway polled, having applied `applied`.
    Seen { gateway: String, applied: u64 },
    /// Something changed: a new version.
    Publish { reply: oneshot::Sender<u64> },
    /// Answer when every live gateway has applied `version`.
    Await {
        version: u64,
        reply: oneshot::Sender<Propagation>,
    },
}

struct Waiter {
    version: u64,
    started: Instant,
    gateways: Vec<String>,
    reply: oneshot::Sender<Propagation>,
}

struct GatewayState {
    applied: u64,
    last_seen: Instant,
}

impl Hub {
    /// Starts the hub task on the current runtime. Versions start at the
    /// current Unix time in milliseconds, so they keep increasing across
    /// restarts of the control plane.
    pub fn start(lease: Duration) -> Hub {
        let first = u64::try_from(bulkhead_control_api::Timestamp::now().millis()).unwrap_or(1);
        let (version_tx, version) = watch::channel(first);
        let (planned_tx, planned) = watch::channel(Arc::new(BTreeSet::new()));
        let (events, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(rx, version_tx, planned_tx, lease));
        Hub {
            events,
            version,
            planned,
            lease,
        }
    }

    /// Records whether `slug`'s flip is a planned withdrawal (its streams
    /// may finish). Call before publishing the flip. Held in memory: after
    /// a restart every withdrawal ends streams, the safe default.
    pub fn plan(&self, slug: &ModelSlug, planned: bool) {
        let _ = self.events.send(Event::Plan {
            slug: slug.clone(),
            planned,
        });
    }

    /// Models whose latest flip was a planned withdrawal.
    pub fn planned(&self) -> Vec<ModelSlug> {
        self.planned.borrow().iter().cloned().collect()
    }

    /// The lease gateways are told.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The current version.
    pub fn version(&self) -> u64 {
        *self.version.borrow()
    }

    /// Records a poll and waits up to `wait` for a version other than
    /// `applied`; returns the version to serve.
    pub async fn poll(&self, gateway: &str, applied: u64, wait: Duration) -> u64 {
        let _ = self.events.send(Event::Seen {
            gateway: gateway.to_owned(),
            applied,
        });
        let mut rx = self.version.clone();
        if *rx.borrow_and_update() == applied {
            let _ = tokio::time::timeout(wait, rx.changed()).await;
        }
        *rx.borrow()
    }

    /// Publishes a new version (call after the change committed).
    pub async fn publish(&self) -> u64 {
        let (reply, rx) = oneshot::channel();
        let _ = self.events.send(Event::Publish { reply });
        rx.await.unwrap_or_else(|_| self.version())
    }

    /// Publishes a new version and waits until every live gateway applied it
    /// (or the lease ran out).
    pub async fn publish_and_wait(&self) -> Propagation {
        let version = self.publish().await;
        let (reply, rx) = oneshot::channel();
        let _ = self.events.send(Event::Await { version, reply });
        rx.await.unwrap_or(Propagation {
            version,
            gateways: 0,
            applied: 0,
            waited_ms: 0,
            lease_ms: u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX),
        })
    }
}

async fn run(
    mut rx: mpsc::UnboundedReceiver<Event>,
    version: watch::Sender<u64>,
    planned: watch::Sender<Arc<BTreeSet<ModelSlug>>>,
    lease: Duration,
) {
    let born = Instant::now();
    let mut gateways: HashMap<String, GatewayState> = HashMap::new();
    let mut waiters: Vec<Waiter> = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    loop {
        tokio::select! {
            ev = rx.recv() => match ev {
                None => return,
                Some(Event::Plan { slug, planned: keep }) => {
                    planned.send_if_modified(|set| {
                        if set.contains(&slug) == keep {
                            return false;
                        }
                        let mut next = (**set).clone();
                        if keep {
                            next.insert(slug);
                        } else {
                            next.remove(&slug);
                        }
                        *set = Arc::new(next);
                        true
                    });
                }
                Some(Event::Seen { gateway, applied }) => {
                    // A version above the current one was never served by
                    // this hub (a clock that went back across a restart, or
                    // a caller making it up): it proves nothing.
                    let applied = if applied > *version.borrow() { 0 } else { applied };
                    // A gateway heard from while a change waits is waited
                    // for too: after a restart, gateways of the previous
                    // control plane come back only after the change began.
                    for w in waiters.iter_mut().filter(|w| !w.gateways.contains(&gateway)) {
                        w.gateways.push(gateway.clone());
                    }
                    gateways.insert(gateway, GatewayState { applied, last_seen: Instant::now() });
                }
                Some(Event::Publish { reply }) => {
                    let now = u64::try_from(bulkhead_control_api::Timestamp::now().millis()).unwrap_or(0);
                    version.send_modify(|v| *v = (*v + 1).max(now));
                    let _ = reply.send(*version.borrow());
                }
                Some(Event::Await { version, reply }) => {
                    gateways.retain(|_, g| g.last_seen.elapsed() <= lease);
                    waiters.push(Waiter {
                        version,
                        started: Instant::now(),
                        gateways: gateways.keys().cloned().collect(),
                        reply,
                    });
                }
            },
            _ = tick.tick(), if !waiters.is_empty() => {}
        }
        waiters = settle(waiters, &gateways, lease, born.elapsed() >= lease);
    }
}

/// Answers the waiters whose gateways have all applied their version, or
/// whose lease ran out; keeps the others. Until the hub is a lease old it
/// may not know every live gateway (the control plane restarted; gateways
/// that served the old one are still within their lease), so until then a
/// waiter is answered only when its lease runs out.
fn settle(
    waiters: Vec<Waiter>,
    gateways: &HashMap<String, GatewayState>,
    lease: Duration,
    knows_every_gateway: bool,
) -> Vec<Waiter> {
    let mut pending = Vec::with_capacity(waiters.len());
    for w in waiters {
        let applied = w
            .gateways
            .iter()
            .filter(|g| gateways.get(*g).is_some_and(|s| s.applied >= w.version))
            .count();
        let all = applied == w.gateways.len() && knows_every_gateway;
        if all || w.started.elapsed() >= lease {
            let _ = w.reply.send(Propagation {
                version: w.version,
                gateways: w.gateways.len(),
                applied,
                waited_ms: u64::try_from(w.started.elapsed().as_millis()).unwrap_or(u64::MAX),
                lease_ms: u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
            });
        } else {
            pending.push(w);
        }
    }
    pending
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_change_waits_for_every_live_gateway() {
        let hub = Hub::start(Duration::from_millis(1500));
        // A new hub does not know every gateway yet: let a lease pass.
        tokio::time::sleep(Duration::from_millis(1600)).await;
        let v0 = hub.version();
        // Two gateways have applied v0 and are polling.
        let a = tokio::spawn({
            let hub = hub.clone();
            async move { hub.poll("a", v0, Duration::from_secs(1)).await }
        });
        let b = tokio::spawn({
            let hub = hub.clone();
            async move { hub.poll("b", v0, Duration::from_secs(1)).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let flip = tokio::spawn({
            let hub = hub.clone();
            async move { hub.publish_and_wait().await }
        });
        let v1 = a.await.unwrap();
        assert_eq!(b.await.unwrap(), v1);
        assert!(v1 > v0);
        // Only `a` applies: the flip is not answered yet.
        let a2 = tokio::spawn({
            let hub = hub.clone();
            async move { hub.poll("a", v1, Duration::from_millis(200)).await }
        });
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(!flip.is_finished());
        let _ = hub.poll("b", v1, Duration::ZERO).await;
        let p = flip.await.unwrap();
        assert_eq!((p.version, p.gateways, p.applied), (v1, 2, 2));
        a2.await.unwrap();
    }

    #[tokio::test]
    async fn a_silent_gateway_delays_a_change_by_at_most_the_lease() {
        let hub = Hub::start(Duration::from_millis(300));
        let _ = hub.poll("gone", hub.version(), Duration::ZERO).await;
        let p = hub.publish_and_wait().await;
        assert_eq!((p.gateways, p.applied), (1, 0));
        assert!(p.waited_ms >= 250, "{p:?}");
    }
}

#[cfg(test)]
mod restart {
    use super::*;

    #[tokio::test]
    async fn a_young_hub_waits_a_lease_and_ignores_versions_it_never_served() {
        let hub = Hub::start(Duration::from_millis(600));
        // A gateway of the previous control plane reports a version from the future.
        let _ = hub.poll("old", u64::MAX, Duration::ZERO).await;
        let p = hub.publish_and_wait().await;
        assert_eq!((p.gateways, p.applied), (1, 0), "{p:?}");
        assert!(p.waited_ms >= 550, "answered only after a lease: {p:?}");
    }

    #[tokio::test]
    async fn a_gateway_that_comes_back_after_a_restart_is_waited_for() {
        let hub = Hub::start(Duration::from_millis(600));
        // The flip arrives before any gateway has polled the new control plane.
        let flip = tokio::spawn({
            let hub = hub.clone();
            async move { hub.publish_and_wait().await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        // A gateway of the previous control plane polls, then applies.
        let v = hub.poll("back", 1, Duration::ZERO).await;
        let _ = hub.poll("back", v, Duration::ZERO).await;
        let p = flip.await.unwrap();
        assert_eq!((p.version, p.gateways, p.applied), (v, 1, 1), "{p:?}");
        assert!(
            p.waited_ms >= 450,
            "a young hub answers after a lease: {p:?}"
        );
    }
}
