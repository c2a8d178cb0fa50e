//! Admission and turns across tenants: requests admitted against the
//! pool's limits (a refused one never reaches allocation), the waiting
//! queue, which tenant's request joins next (the one holding the fewest
//! pages), tenants' caps and fair shares, and cancellation.

use super::*;

impl EngineCore {
    /// Admits a request against this engine's limits (touches no page).
    pub fn admit(
        limits: &Limits,
        tenant: TenantId,
        request: GenerateRequest,
        sink: Sink,
    ) -> Result<Admitted<PendingRequest>, AdmissionError> {
        Self::admit_with(limits, tenant, request, sink, None)
    }

    /// Admits a request; with `landing`, its prompt KV will arrive through
    /// that transfer: once its pages fit, the prompt pages become landing
    /// slots and are lent out on the grant channel.
    pub(crate) fn admit_with(
        limits: &Limits,
        tenant: TenantId,
        request: GenerateRequest,
        sink: Sink,
        landing: Option<(TransferId, oneshot::Sender<Grant>)>,
    ) -> Result<Admitted<PendingRequest>, AdmissionError> {
        let (prompt, max) = (request.prompt.len(), request.sampling.max_tokens);
        let pending = PendingRequest {
            request,
            sink,
            landing,
            charge: None,
            progress: PromptProgress::default(),
        };
        limits.admit(tenant, prompt, max, pending)
    }

    /// Admits a prefill-only job: `max_tokens` counts against the limits
    /// (the decode side will hold it) but only the prompt's pages are
    /// reserved here.
    pub fn admit_prefill(
        limits: &Limits,
        tenant: TenantId,
        prompt: Vec<u32>,
        max_tokens: usize,
        transfer: TransferId,
        events: PrefillSink,
        cache: Option<CacheScope>,
    ) -> Result<Admitted<PendingPrefill>, AdmissionError> {
        let n = prompt.len();
        let job = PendingPrefill {
            prompt,
            transfer,
            events,
            cache,
            class: crate::WorkClass::Interactive,
            charge: None,
        };
        Ok(limits.admit(tenant, n, max_tokens, job)?.prompt_only())
    }

    /// Queues an admitted request; it joins the batch when its prompt and
    /// first slice of output fit.
    pub fn submit(&mut self, admitted: Admitted<PendingRequest>) {
        self.arrived(admitted.owner().tenant());
        let admitted = admitted.first_slice(self.first_slice);
        self.waiting
            .push_back(Waiting::New(Box::new(admitted.map(Pending::Generate))));
    }

    /// Queues an admitted prefill-only job.
    pub fn submit_prefill(&mut self, admitted: Admitted<PendingPrefill>) {
        self.arrived(admitted.owner().tenant());
        self.waiting
            .push_back(Waiting::New(Box::new(admitted.map(Pending::Prefill))));
    }

    /// Notes that `tenant` sent a request now (and forgets tenants not
    /// heard from within the shared window).
    fn arrived(&mut self, tenant: TenantId) {
        let now = Instant::now();
        self.arrivals
            .retain(|_, at| now.duration_since(*at) <= super::SHARED_WINDOW);
        self.arrivals.insert(tenant, now);
    }

    /// How long this step may take: `step_time`, or a fraction of it while
    /// tenants share the engine.
    pub(super) fn step_time_now(&self) -> Duration {
        if !self.sharing() {
            self.step_time
        } else if self.interactive_running() {
            self.step_time / super::SHARED_STEP_DIVISOR
        } else {
            // Batch work only: the interactive request that arrives next
            // waits a few milliseconds for the batch to yield.
            self.step_time / (super::SHARED_STEP_DIVISOR * super::BATCH_ONLY_STEP_DIVISOR)
        }
    }

    /// Whether two or more tenants sent requests within the last
    /// [`super::SHARED_WINDOW`].
    pub(super) fn sharing(&self) -> bool {
        let now = Instant::now();
        self.arrivals
            .values()
            .filter(|at| now.duration_since(**at) <= super::SHARED_WINDOW)
            .count()
            > 1
    }

    /// Cancels a request: its pages return to the pool at once.
    pub fn cancel(&mut self, id: RequestId) {
        if let Some(i) = self.waiting.iter().position(|w| w.owner().request() == id) {
            match self.waiting.remove(i) {
                Some(Waiting::New(a)) => {
                    if let Pending::Generate(p) = a.into_payload() {
                        let _ = p.sink.send(SeqEvent::Finished {
                            reason: FinishReason::Cancelled,
                            text: String::new(),
                            usage: Usage {
                                prompt_tokens: p.request.prompt.len(),
                                completion_tokens: 0,
                            },
                        });
                    }
                }
                Some(Waiting::Resume(mut seq)) => {
                    seq.finish(FinishReason::Cancelled);
                    self.pool.release(seq.table);
                }
                None => {}
            }
            return;
        }
        if let Some(seq) = self.running.iter_mut().find(|s| s.owner.request() == id) {
            match &mut seq.role {
                // Never abort a transfer mid-flight: cancel once it ends.
                Role::Generate(Generator {
                    landing: Some(l), ..
                }) => l.cancel_after = true,
                _ => seq.finish(FinishReason::Cancelled),
            }
        }
        self.reap();
    }

    /// Pages held now per tenant: running, held for a transfer and draining.
    pub(super) fn held_pages(&self) -> HashMap<TenantId, usize> {
        let mut held: HashMap<TenantId, usize> = HashMap::new();
        let tables = self
            .running
            .iter()
            .map(|s| &s.table)
            .chain(self.held.values().map(|(t, _)| t))
            .chain(self.draining.values());
        for t in tables {
            *held.entry(t.owner().tenant()).or_default() += t.len();
        }
        held
    }

    /// Pages one tenant may hold while another tenant waits.
    pub(super) fn tenant_cap(&self) -> usize {
        (self.pool.counters().total_pages * self.tenant_share_percent / 100).max(1)
    }

    /// Pages one of `tenants` active tenants is due: an equal part of the pool.
    pub(super) fn fair_share(&self, tenants: usize) -> usize {
        self.pool.counters().total_pages / tenants.max(1)
    }

    /// Tenants with a sequence running or waiting.
    pub(super) fn active_tenants(&self) -> usize {
        let mut t: Vec<TenantId> = self
            .running
            .iter()
            .map(|s| s.owner.tenant())
            .chain(self.waiting.iter().map(|w| w.owner().tenant()))
            .collect();
        t.sort_unstable();
        t.dedup();
        t.len()
    }

    /// The waiting request to try next: the oldest one of the tenant that
    /// holds the fewest pages now (ties: the one that came first). So a
    /// tenant whose requests fill the pool cannot make another tenant's
    /// request wait behind its own queue; within a tenant, oldest first (a
    /// preempted sequence before the requests that came after it).
    /// A tenant over its cap while another waits is passed over.
    pub(super) fn next_waiting(&self, held: &HashMap<TenantId, usize>) -> Option<usize> {
        let cap = self.tenant_cap();
        // Another tenant waits for every waiting tenant once two do.
        let first_tenant = self.waiting.front().map(|w| w.owner().tenant());
        let others_wait = self
            .waiting
            .iter()
            .any(|w| Some(w.owner().tenant()) != first_tenant);
        let mut best: Option<(usize, RequestId, usize)> = None; // (pages held, request, index)
        for (i, w) in self.waiting.iter().enumerate() {
            let owner = w.owner();
            let h = held.get(&owner.tenant()).copied().unwrap_or(0);
            if others_wait && h > 0 && h + self.pages_to_join(w) > cap {
                continue;
            }
            if best.is_none_or(|(bh, br, _)| (h, owner.request()) < (bh, br)) {
                best = Some((h, owner.request(), i));
            }
        }
        best.map(|(_, _, i)| i)
    }

    /// Pages a waiting entry takes when it joins.
    pub(super) fn pages_to_join(&self, w: &Waiting) -> usize {
        match w {
            Waiting::New(a) => a.reserve(),
            Waiting::Resume(s) => {
                s.pages_to_resume(self.first_slice, self.pool.geometry().page_size)
            }
        }
    }

    pub(super) fn join_waiting(&mut self) {
        loop {
            let held = self.held_pages();
            let Some(next) = self.next_waiting(&held) else {
                return;
            };
            let tenant = self.waiting[next].owner().tenant();
            let need = self.pages_to_join(&self.waiting[next]);
            let mine = held.get(&tenant).copied().unwrap_or(0);
            if self.pool.free_pages() < need {
                // Below its fair share: take pages back from tenants above
                // theirs, the tenant holding the most first.
                let fair = self.fair_share(self.active_tenants());
                if mine + need <= fair.max(need) {
                    while self.pool.free_pages() < need {
                        if !self.preempt_one(|t, h| t != tenant && h > fair) {
                            break;
                        }
                    }
                }
            }
            let entry = self.waiting.remove(next).expect("index exists");
            match entry {
                Waiting::Resume(mut seq) => {
                    let want =
                        seq.pages_to_resume(self.first_slice, self.pool.geometry().page_size);
                    match self.pool.grow(&mut seq.table, want) {
                        Ok(()) => self.running.push(*seq),
                        Err(AllocError::Exhausted(_)) => {
                            self.waiting.insert(next, Waiting::Resume(seq));
                            return;
                        }
                        Err(_) => {
                            // Pages were quarantined since: it can never fit.
                            let error = seq.never_fits(self.pool.capacity_tokens());
                            seq.fail(error);
                            self.pool.release(seq.table);
                        }
                    }
                }
                Waiting::New(admitted) => {
                    if let Some(back) = self.join_new(*admitted) {
                        self.waiting.insert(next, Waiting::New(Box::new(back)));
                        return;
                    }
                }
            }
        }
    }

    /// Allocates an admitted request's first pages and starts it (or
    /// refuses it for good); gives it back when too few pages are free now.
    pub(super) fn join_new(&mut self, admitted: Admitted<Pending>) -> Option<Admitted<Pending>> {
        let allocated = self.allocate_for(&admitted);
        let (table, cached, local) = match allocated {
            Ok(found) => found,
            // The tenant's turn: it waits for pages.
            Err(AllocError::Exhausted(_)) => return Some(admitted),
            // Pages were quarantined since admission (or the request was
            // admitted elsewhere): it can never fit here. Refuse it with
            // its 4xx and serve the requests behind it.
            Err(_) => {
                self.refuse_unfit(admitted);
                return None;
            }
        };
        let owner = admitted.owner();
        let max_tokens = admitted.max_tokens();
        let prompt_pages = admitted.prompt_pages();
        let seq = match admitted.into_payload() {
            Pending::Prefill(p) => Sequence {
                owner,
                table,
                prompt_len: p.prompt.len(),
                tokens: p.prompt,
                computed: cached,
                done: false,
                failed: false,
                role: Role::Prefill {
                    transfer: p.transfer,
                    events: p.events,
                },
                charge: p.charge,
                progress: None,
                class: p.class,
            },
            Pending::Generate(PendingRequest {
                request,
                sink,
                landing,
                charge,
                progress,
            }) => {
                let landing = match landing {
                    None => None,
                    // This pool's cache holds all but a short suffix: the
                    // prompt is finished here, and the grant's sender is
                    // dropped, so decode opens no transfer at all.
                    Some(_) if local => None,
                    Some((transfer, granted)) => {
                        let generations = table.generations().take(prompt_pages).collect();
                        let pages = self.pool.lend_landing(&table, transfer, self.home.as_ref());
                        if let Err(grant) = granted.send(Grant { generations, pages }) {
                            // The caller is gone before anything was sent.
                            self.pool.release(table);
                            for p in grant.pages {
                                self.pool.restore(p);
                            }
                            return None;
                        }
                        Some(Landing {
                            transfer,
                            cancel_after: false,
                        })
                    }
                };
                let prompt_len = request.prompt.len();
                let class = request.class;
                let mut tokens = request.prompt;
                tokens.reserve(max_tokens);
                Sequence {
                    owner,
                    table,
                    tokens,
                    prompt_len,
                    computed: cached,
                    done: false,
                    failed: false,
                    role: Role::Generate(Generator {
                        max_tokens,
                        ignore_eos: request.ignore_eos,
                        sampler: Box::new(Sampler::new(request.sampling)),
                        detok: Detokenizer::new(&request.stop),
                        sink,
                        landing,
                        corrupt: {
                            self.started += 1;
                            self.corrupt_after.is_some_and(|n| self.started > n)
                        },
                    }),
                    charge,
                    progress: Some(progress),
                    class,
                }
            }
        };
        let mut seq = seq;
        // What the prefix cache held is not computed here.
        seq.note_computed(&self.speed);
        self.running.push(seq);
        None
    }

    /// Pages for an admitted request: a landing table for a transfer, a
    /// prefixed one where the cache holds part of the prompt, else fresh
    /// ones; with the prompt tokens already computed, and whether a
    /// request that was to land its prompt finishes it here instead
    /// ([`EngineCore::computes_here`]).
    pub(super) fn allocate_for(
        &mut self,
        admitted: &Admitted<Pending>,
    ) -> Result<(PageTable, usize, bool), AllocError> {
        match admitted.payload() {
            Pending::Generate(PendingRequest {
                landing: Some((transfer, _)),
                request: GenerateRequest { cache, prompt, .. },
                ..
            }) => {
                let scope = cache.filter(|_| self.prefix_cache);
                let held = scope.map_or(0, |s| self.pool.cached_prefix_tokens(s, prompt));
                let here = self.computes_here(prompt.len(), held);
                let allocated = match (scope, here) {
                    (Some(scope), true) => self
                        .pool
                        .allocate_prefixed(admitted, scope, prompt)
                        .map(|(t, hit)| (t, hit.tokens, true)),
                    (None, true) => self.pool.allocate(admitted).map(|t| (t, 0, true)),
                    (Some(scope), false) => self
                        .pool
                        .allocate_receiving_in(admitted, *transfer, scope)
                        .map(|t| (t, 0, false)),
                    (None, false) => self
                        .pool
                        .allocate_receiving(admitted, *transfer)
                        .map(|t| (t, 0, false)),
                };
                if allocated.as_ref().is_ok_and(|a| a.2) {
                    self.computed_here += 1;
                }
                allocated
            }
            // Prefix reuse: only a sequence that computes its own prompt
            // here (a landing or prefill table's pages are lent whole).
            Pending::Generate(PendingRequest {
                request:
                    GenerateRequest {
                        cache: Some(scope),
                        prompt,
                        ..
                    },
                landing: None,
                ..
            }) if self.prefix_cache => self
                .pool
                .allocate_prefixed(admitted, *scope, prompt)
                .map(|(t, hit)| (t, hit.tokens, false)),
            // A prefill worker lends its pages whole: the cached part of
            // the prompt is copied into pages of its own, not computed.
            Pending::Prefill(PendingPrefill {
                cache: Some(scope),
                prompt,
                ..
            }) if self.prefix_cache => self
                .pool
                .allocate_prefixed_copy(admitted, *scope, prompt)
                .map(|(t, hit)| (t, hit.tokens, false)),
            _ => self.pool.allocate(admitted).map(|t| (t, 0, false)),
        }
    }

    /// Whether a prompt of `len` tokens that was to land from a prefill
    /// worker, `held` of them in this pool's prefix cache, is computed here
    /// instead: the cache holds all of it but at most
    /// [`LOCAL_SUFFIX_PAGES`] pages (a transfer round trip would cost
    /// more than the suffix), or what is left is at most the configured
    /// `local_prefill_tokens` (a short prompt).
    fn computes_here(&self, len: usize, held: usize) -> bool {
        let suffix = len.saturating_sub(held);
        let short_suffix =
            held > 0 && suffix <= LOCAL_SUFFIX_PAGES * self.pool.geometry().page_size;
        short_suffix || suffix <= self.local_prefill_tokens
    }

    /// An admitted request that can never fit here (pages were quarantined
    /// since admission, or it was admitted elsewhere): refused with its 4xx,
    /// so the requests behind it are served.
    pub(super) fn refuse_unfit(&self, admitted: Admitted<Pending>) {
        let error = AdmissionError::PoolCapacityExceeded {
            prompt_tokens: admitted.prompt_tokens(),
            max_tokens: admitted.max_tokens(),
            limit: self.pool.capacity_tokens(),
        };
        match admitted.into_payload() {
            Pending::Generate(p) => {
                let _ = p.sink.send(SeqEvent::Failed(EngineError::Rejected(error)));
            }
            Pending::Prefill(p) => {
                let _ = p
                    .events
                    .send(PrefillEvent::Failed(EngineError::Rejected(error)));
            }
        }
    }
}

/// A request that was to land its prompt finishes it on this pool instead
/// when the pool's cache holds all but at most this many pages of it.
const LOCAL_SUFFIX_PAGES: usize = 2;
