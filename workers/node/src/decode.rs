//! The decode role: admits requests against the limits of the pair it
//! chooses, lands their prompt KV from a prefill worker, and generates.
//!
//! A decode worker links to every prefill worker of its model in the fleet
//! (`link.rs`: one link task and one receiver per connection). For each
//! request it picks, among the links connected to a compatible peer, the
//! one with the fewest transfers in flight from here (ties in turn), and
//! admits against min(context window, that prefill's pool, this pool). A
//! prefill worker that goes away takes only the transfers open on its link
//! with it; the fleet (`set_prefills`) retires its link, which takes no new
//! transfer and closes once idle.

pub mod landing;
mod link;

use bulkhead_engine::{Engine, GenerateRequest, RequestHandle};
use bulkhead_kv::{AdmissionError, CacheScope, Limits, TenantId, TransferId};
use bulkhead_transfer::{Hello, TransferCounters};
use link::{LinkEvent, LinkHandle, Opening};
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::watch;

/// How a decode worker talks to its prefill workers.
#[derive(Debug, Clone)]
pub struct DecodeOptions {
    /// Prefill transfer addresses to link to at start; `set_prefills`
    /// changes the set later (a pinned pair never calls it).
    pub prefill: Vec<String>,
    /// Longest a transfer may go without a sign of life (its request, or
    /// the prefill worker's last progress report) before it is aborted.
    pub transfer_timeout: Duration,
    /// Longest to wait for an abort's acknowledgement before the connection
    /// is closed (closing fences every write on it).
    pub ack_timeout: Duration,
    /// How pages travel.
    pub transport: crate::TransportKind,
    /// This worker's decode identity: transfer connections are mutual TLS
    /// and accept only a prefill certificate.
    pub identity: bulkhead_trust::Identity,
    /// The model it serves: a prefill worker whose certificate is scoped
    /// to another model is refused in the handshake.
    pub model: String,
}

/// Why a request could not be started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// Admission refused it (terminal; nothing allocated or sent).
    #[error(transparent)]
    Rejected(#[from] AdmissionError),
    /// No prefill worker is reachable now.
    #[error("no prefill worker is available")]
    Unavailable,
}

/// The decode side of disaggregated serving.
#[derive(Debug, Clone)]
pub struct DecodeWorker {
    engine: Arc<Engine>,
    hello: Hello,
    options: DecodeOptions,
    /// Every link made so far (a link is retired, never removed, so its
    /// counters stay in the totals).
    links: Arc<watch::Sender<Vec<Arc<LinkHandle>>>>,
    turn: Arc<AtomicUsize>,
}

/// Counts one transfer against its link until dropped.
#[derive(Debug)]
pub(crate) struct LoadGuard(Arc<AtomicUsize>);

impl LoadGuard {
    fn new(load: &Arc<AtomicUsize>) -> LoadGuard {
        load.fetch_add(1, Ordering::Relaxed);
        LoadGuard(Arc::clone(load))
    }
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl DecodeWorker {
    /// Starts a link to each of `options.prefill` (connecting at once, and
    /// again after a connection is lost). Call inside a tokio runtime.
    pub fn start(engine: Arc<Engine>, hello: Hello, options: DecodeOptions) -> Self {
        let (links, _) = watch::channel(Vec::new());
        let worker = DecodeWorker {
            engine,
            hello,
            options,
            links: Arc::new(links),
            turn: Arc::default(),
        };
        worker.set_prefills(&worker.options.prefill.clone());
        worker
    }

    /// Makes `addresses` the fleet's prefill workers: a link to each new
    /// one; links to the others retire (no new transfer; closed once their
    /// open transfers end); a returning address gets its link back.
    pub fn set_prefills(&self, addresses: &[String]) {
        self.links.send_modify(|links| {
            for l in links.iter() {
                let _ = l
                    .events
                    .send(LinkEvent::Want(addresses.contains(&l.address)));
            }
            for a in addresses {
                if !links.iter().any(|l| &l.address == a) {
                    links.push(Arc::new(link::start(
                        Arc::clone(&self.engine),
                        self.hello,
                        self.options.clone(),
                        a.clone(),
                    )));
                }
            }
        });
    }

    /// The engine.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Bytes of one KV page on the wire.
    pub fn page_bytes(&self) -> usize {
        crate::hello::page_bytes(&self.hello)
    }

    /// Transfer counters (all links, all connections so far).
    pub fn counters(&self) -> TransferCounters {
        self.links
            .borrow()
            .iter()
            .fold(TransferCounters::default(), |sum, l| {
                sum + *l.counters.borrow()
            })
    }

    /// Prefill workers linked now: (transfer address, transfers in flight).
    pub fn prefills(&self) -> Vec<(String, usize)> {
        self.links
            .borrow()
            .iter()
            .filter(|l| l.peer.borrow().is_some())
            .map(|l| (l.address.clone(), l.load.load(Ordering::Relaxed)))
            .collect()
    }

    /// The largest limits a request could be admitted under now: this
    /// engine's narrowed by the roomiest linked prefill worker (`None`
    /// while none is linked).
    pub fn limits(&self) -> Option<Limits> {
        let own = self.engine.info().limits;
        self.links
            .borrow()
            .iter()
            .filter_map(|l| own.narrow(&(*l.peer.borrow())?))
            .max_by_key(Limits::pool_tokens)
    }

    /// Waits until some prefill worker has introduced itself, up to `wait`.
    pub async fn ready(&self, wait: Duration) -> bool {
        let until = tokio::time::Instant::now() + wait;
        while self.limits().is_none() {
            if tokio::time::Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }

    /// The link for a new transfer: connected to a compatible peer, fewest
    /// transfers in flight from here. Ties go, for a request with a cache
    /// scope (and a prompt of at least [`AFFINITY_MIN_PAGES`] pages), to
    /// the link its own namespace hashes highest with
    /// (rendezvous hashing: a tenant's prompts keep meeting the prefill
    /// worker that cached them; no other namespace is weighed), else in
    /// turn.
    fn pick(&self, cache: Option<&CacheScope>) -> Option<Arc<LinkHandle>> {
        let links = self.links.borrow();
        // Each link's load read once: transfers start and end on other
        // threads meanwhile, and a second read could leave no link tied
        // with the least one seen.
        let ready: Vec<(&Arc<LinkHandle>, usize)> = links
            .iter()
            .filter(|l| l.peer.borrow().is_some())
            .map(|l| (l, l.load.load(Ordering::Relaxed)))
            .collect();
        let least = ready.iter().map(|(_, load)| *load).min()?;
        let tied: Vec<&Arc<LinkHandle>> = ready
            .iter()
            .filter(|(_, load)| *load == least)
            .map(|(l, _)| *l)
            .collect();
        if let Some(scope) = cache {
            let score = |l: &LinkHandle| {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                scope.own().digest().hash(&mut h);
                l.address.hash(&mut h);
                h.finish()
            };
            return tied.iter().max_by_key(|l| score(l)).map(|l| Arc::clone(l));
        }
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        Some(Arc::clone(tied[turn % tied.len()]))
    }

    /// Picks a prefill worker, admits `request` against the pair's limits
    /// and starts its transfer once its pages are allocated. A rejection
    /// here happens before any page, bootstrap or transfer exists.
    /// `context` is the gateway's signed context of the call, forwarded as
    /// it came: prefill verifies it and takes the tenant from it.
    pub fn submit(
        &self,
        tenant: TenantId,
        request: GenerateRequest,
        context: String,
    ) -> Result<RequestHandle, SubmitError> {
        // Affinity only where a cache hit would save real work: short
        // prompts spread over the fleet in turn.
        let worth =
            request.prompt.len() >= AFFINITY_MIN_PAGES * self.engine.info().limits.page_size();
        let link = self
            .pick(request.cache.as_ref().filter(|_| worth))
            .ok_or(SubmitError::Unavailable)?;
        let peer = (*link.peer.borrow()).ok_or(SubmitError::Unavailable)?;
        let load = LoadGuard::new(&link.load);
        let transfer = TransferId::new(random_u64());
        let prompt = request.prompt.clone();
        let max_tokens = request.sampling.max_tokens;
        let cache = request.cache;
        let (handle, grant) = self
            .engine
            .submit_landing(tenant, request, &peer, transfer)?;
        let progress = handle.prompt_progress().clone();
        let span = tracing::info_span!(
            target: "bulkhead::worker",
            "kv.transfer",
            otel.kind = "client",
            bulkhead.transfer.id = %transfer,
            bulkhead.transfer.prompt_tokens = bulkhead_telemetry::int(prompt.len()),
            bulkhead.transfer.peer = %link.address,
            bulkhead.transfer.outcome = tracing::field::Empty,
        );
        let events = link.events.clone();
        tokio::spawn(async move {
            // No grant means no transfer: the request ended before its
            // pages existed, or the engine finished the prompt from this
            // worker's own cache.
            let Ok(grant) = grant.await else {
                span.record("bulkhead.transfer.outcome", "not_opened");
                return;
            };
            let opening = Opening {
                transfer,
                tenant,
                prompt,
                max_tokens,
                cache,
                context,
                grant,
                span,
                load,
                progress,
            };
            let _ = events.send(LinkEvent::Open(opening));
        });
        Ok(handle)
    }
}

/// Prompts shorter than this many KV pages go to prefill workers in turn
/// (a cache hit would save little); longer ones by their namespace.
const AFFINITY_MIN_PAGES: usize = 4;

/// A random 64-bit id from the standard library's per-process random keys.
fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    );
    h.finish()
}
