//! The routing watch: one task long-polls the control plane's routing table
//! and publishes each new version it applies; handlers read the latest.
//! Every poll tells the control plane which version this gateway has
//! applied, which is how a visibility flip learns that it is in force here.
//!
//! Fail closed: a gateway that has not heard from the control plane for the
//! lease the control plane set refuses requests until it hears again. That
//! is what lets the control plane acknowledge a flip after at most one lease
//! even if a gateway is cut off.
//!
//! A flip also ends the streams in flight that it withdraws (unless it was
//! planned): each stream is tracked here, ends itself when an applied table
//! withdraws its model, and the watch reports the table applied only once
//! those streams have ended (or [`CUT_WAIT`] passed), so the flip's
//! acknowledgement follows the cut.
//!
//! Freshness counts from when the last answered poll was sent, not when
//! its answer arrived, so a gateway stops serving within one lease of a flip
//! even if an answer given before it arrives late and nothing follows.

use crate::table::Table;
use bulkhead_control_api::{Client, ModelSlug, RoutingTable};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::Instrument;

/// One applied routing table.
#[derive(Debug)]
pub struct Snapshot {
    /// The indexed table.
    pub table: Table,
    /// The lease the control plane set.
    pub lease: Duration,
}

/// Why there is no table to serve from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WatchError {
    /// No table yet.
    #[error("the gateway has no routing table yet")]
    NotReady,
    /// The last one is older than the lease.
    #[error("the gateway lost contact with the control plane")]
    Stale,
}

/// Longest a new table's report waits for the streams it ends: a stream
/// ends at its next read, which a client that stopped reading delays.
pub(crate) const CUT_WAIT: Duration = Duration::from_secs(5);

/// Streams in flight: their model and account, by a local id.
type Live = BTreeMap<u64, (ModelSlug, String)>;

/// The handle handlers read the table through; cheap to clone.
#[derive(Debug, Clone)]
pub struct RoutingWatch {
    rx: watch::Receiver<Option<Arc<Snapshot>>>,
    /// The control plane, for reads a handler makes there (usage).
    client: Client,
    heard_ms: Arc<AtomicU64>,
    epoch: Instant,
    streams: Arc<watch::Sender<Live>>,
    next_stream: Arc<AtomicU64>,
}

/// A stream in flight, tracked until dropped.
#[derive(Debug)]
pub(crate) struct Tracked {
    id: u64,
    streams: Arc<watch::Sender<Live>>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.streams.send_modify(|live| {
            live.remove(&self.id);
        });
    }
}

impl RoutingWatch {
    /// Starts polling the control plane as gateway instance `instance`.
    pub fn start(client: Client, instance: String) -> RoutingWatch {
        let (tx, rx) = watch::channel(None);
        let heard_ms = Arc::new(AtomicU64::new(0));
        let epoch = Instant::now();
        let streams = Arc::new(watch::Sender::new(Live::new()));
        tokio::spawn(poll(
            client.clone(),
            instance,
            tx,
            Arc::clone(&heard_ms),
            epoch,
            Arc::clone(&streams),
        ));
        RoutingWatch {
            rx,
            client,
            heard_ms,
            epoch,
            streams,
            next_stream: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The control plane client the table is polled with.
    pub(crate) fn control_plane(&self) -> &Client {
        &self.client
    }

    /// Tracks a stream of `slug` for `account` until the guard drops.
    pub(crate) fn track(&self, slug: &ModelSlug, account: &str) -> Tracked {
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        self.streams.send_modify(|live| {
            live.insert(id, (slug.clone(), account.to_owned()));
        });
        Tracked {
            id,
            streams: Arc::clone(&self.streams),
        }
    }

    /// Resolves once an applied table withdraws `slug` from `account`
    /// (see [`Table::ends_stream`]); never while no new table arrives.
    pub(crate) fn withdrawn(
        &self,
        slug: ModelSlug,
        account: String,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.rx.clone();
        async move {
            loop {
                let ends = rx
                    .borrow_and_update()
                    .as_ref()
                    .is_some_and(|s| s.table.ends_stream(&slug, &account));
                if ends {
                    return;
                }
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        }
    }

    /// The table to serve from, unless there is none or it is stale.
    pub fn current(&self) -> Result<Arc<Snapshot>, WatchError> {
        let snap = self.rx.borrow().clone().ok_or(WatchError::NotReady)?;
        let heard = Duration::from_millis(self.heard_ms.load(Ordering::Acquire));
        if self.epoch.elapsed().saturating_sub(heard) > snap.lease {
            return Err(WatchError::Stale);
        }
        Ok(snap)
    }

    /// Waits up to `limit` for the first table.
    pub async fn ready(&self, limit: Duration) -> bool {
        let mut rx = self.rx.clone();
        tokio::time::timeout(limit, rx.wait_for(Option::is_some))
            .await
            .is_ok()
    }

    /// Resolves once an applied table no longer routes `slug` to `node`
    /// (its heartbeat lapsed, it was removed or no longer fits); never while
    /// no new table arrives (a control plane that is down cuts nothing).
    pub(crate) fn node_left(
        &self,
        slug: bulkhead_control_api::ModelSlug,
        node: i64,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.rx.clone();
        async move {
            loop {
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
                let gone = rx
                    .borrow_and_update()
                    .as_ref()
                    .is_some_and(|s| !s.table.workers(&slug).iter().any(|n| n.id == node));
                if gone {
                    return;
                }
            }
        }
    }

    /// Waits until the applied table has at least `version`.
    pub async fn applied(&self, version: u64, limit: Duration) -> bool {
        let mut rx = self.rx.clone();
        let reached = rx.wait_for(|s| s.as_ref().is_some_and(|s| s.table.version() >= version));
        tokio::time::timeout(limit, reached).await.is_ok()
    }
}

async fn poll(
    client: Client,
    instance: String,
    tx: watch::Sender<Option<Arc<Snapshot>>>,
    heard_ms: Arc<AtomicU64>,
    epoch: Instant,
    streams: Arc<watch::Sender<Live>>,
) {
    let mut applied = 0u64;
    let mut wait_ms = 0u64;
    let mut backoff = Duration::from_millis(100);
    let mut failing = false;
    let mut previous: Option<Arc<Snapshot>> = None;
    loop {
        let path =
            format!("/admin/v1/routing?gateway={instance}&version={applied}&wait_ms={wait_ms}");
        // Freshness counts from when the poll was sent, not answered: an
        // answer given before a flip was asked for before it, so this
        // gateway stops serving within one lease of the flip even if that
        // answer arrives late and nothing follows it.
        let sent = u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        // Not traced by default: one every few seconds would bury the
        // tenants' traces (`BULKHEAD_TRACE_POLLS=true` traces it).
        let span = if bulkhead_telemetry::trace_polls() {
            tracing::info_span!(
                target: "bulkhead::gateway",
                "routing.poll",
                otel.kind = "client",
                bulkhead.routing.version = bulkhead_telemetry::int(applied),
            )
        } else {
            tracing::debug_span!(
                target: "bulkhead::gateway",
                "routing.poll",
                otel.kind = "client",
                bulkhead.routing.version = bulkhead_telemetry::int(applied),
            )
        };
        match client.get::<RoutingTable>(&path).instrument(span).await {
            Ok(t) => {
                heard_ms.store(sent, Ordering::Release);
                if failing {
                    tracing::info!(target: "bulkhead::gateway", "routing table reachable again");
                    failing = false;
                }
                backoff = Duration::from_millis(100);
                // Held polls stay well inside the client's 30 s timeout.
                wait_ms = (t.lease_ms / 3).min(20_000);
                // Every answer is applied, changed version or not: node
                // routability also changes with time (a missed heartbeat),
                // which is no write and publishes no version.
                applied = t.version;
                let lease = Duration::from_millis(t.lease_ms);
                let snap = Arc::new(Snapshot {
                    table: Table::new(t),
                    lease,
                });
                // A flip is a state change operators read in the log.
                if let Some(before) = &previous {
                    for (slug, visibility) in snap.table.visibility_changes(&before.table) {
                        tracing::info!(
                            target: "bulkhead::gateway",
                            model = %slug,
                            %visibility,
                            version = applied,
                            "model visibility applied"
                        );
                    }
                }
                previous = Some(Arc::clone(&snap));
                if tx.send(Some(Arc::clone(&snap))).is_err() {
                    return; // every handle is gone
                }
                // The next poll reports this table applied: first let the
                // streams it withdraws end (each watches the table itself).
                let mut live = streams.subscribe();
                let cut = live.wait_for(|live| {
                    live.values()
                        .all(|(slug, account)| !snap.table.ends_stream(slug, account))
                });
                if tokio::time::timeout(CUT_WAIT.min(lease / 2), cut)
                    .await
                    .is_err()
                {
                    tracing::warn!(
                        target: "bulkhead::gateway",
                        "streams of a withdrawn model did not end in time; reporting the table applied"
                    );
                }
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(target: "bulkhead::gateway", error = %e, "routing table unreachable");
                    failing = true;
                }
                if tx.is_closed() {
                    return;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}
