//! Admission: the only way to obtain an [`Admitted`] request.
//!
//! [`Limits`] come from a pool ([`crate::KvPool::limits`]) and carry its
//! identity and real geometry; they can only be narrowed (by a peer's
//! [`Capacity`]), never widened. [`Limits::admit`] mints the request's
//! [`Owner`]. So outside this crate nobody can build an owner, limits or an
//! admission, and `KvPool::allocate` refuses an admission made for another
//! pool.
//!
//! Admission refuses, before any page is touched, a request whose prompt plus
//! `max_tokens` does not fit the context window or the pool, and a prompt
//! longer than the worker prefills alone within its deadline at the speed it
//! measured ([`AdmissionError::PrefillTooLong`], a 4xx naming the prompt's
//! length and the limit); the engine adds the work queued ahead of it
//! ([`AdmissionError::PrefillQueueFull`], a fast 503 with a time to retry).
//! A disaggregated pair narrows every limit to the
//! smaller of the two (the peer's arrive in its hello).

use crate::ids::{Owner, TenantId};

/// What a worker can hold for one request, for one pool. Built only by
/// [`crate::KvPool::limits`]; [`Limits::narrow`] only shrinks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    context_window: usize,
    pool_tokens: usize,
    page_size: usize,
    /// The longest prompt the worker can prefill within its deadline.
    prefill_tokens: usize,
    pool: PoolId,
}

/// Which pool a [`Limits`] (and so an [`Admitted`]) was made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PoolId(pub(crate) u64);

/// A peer's announced capacity (plain numbers from the wire): it can only
/// narrow this side's [`Limits`], never widen them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// The model's context window, in tokens.
    pub context_window: usize,
    /// Tokens the KV pool can hold in total.
    pub pool_tokens: usize,
    /// Tokens per page.
    pub page_size: usize,
    /// The longest prompt the peer can prefill within its deadline.
    pub prefill_tokens: usize,
}

/// Why a request was rejected. Rejection is terminal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AdmissionError {
    /// The prompt has no tokens.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// `max_tokens` is zero.
    #[error("max_tokens must be at least 1")]
    NoOutputTokens,
    /// A prompt token id is not in the model's vocabulary.
    #[error("token id {token} is outside the vocabulary of {vocab} tokens")]
    TokenOutOfRange {
        /// The offending id.
        token: usize,
        /// The vocabulary size.
        vocab: usize,
    },
    /// Prompt plus output exceed the model's context window.
    #[error(
        "the prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) exceeds the context window of {limit} tokens"
    )]
    ContextWindowExceeded {
        /// Prompt tokens.
        prompt_tokens: usize,
        /// Requested output tokens.
        max_tokens: usize,
        /// The context window.
        limit: usize,
    },
    /// The prompt is longer than the worker can prefill within its
    /// deadline (measured prefill speed).
    #[error(
        "the prompt ({prompt_tokens} tokens) is longer than this deployment can prefill within its deadline ({limit} tokens)"
    )]
    PrefillTooLong {
        /// Prompt tokens.
        prompt_tokens: usize,
        /// The longest prompt prefilled in time.
        limit: usize,
    },
    /// The prefill work queued ahead of the prompt plus its own would not
    /// be done within the deadline: refused at once, before any page, to be
    /// retried later or on another worker.
    #[error(
        "the prefill queue is full: the prompt ({prompt_tokens} tokens) would wait behind {queued_ms} ms of queued prompts and miss its deadline; retry in {retry_after_ms} ms"
    )]
    PrefillQueueFull {
        /// Prompt tokens.
        prompt_tokens: usize,
        /// Prefill work queued ahead of it, in milliseconds.
        queued_ms: u64,
        /// How long until enough of that work is done for it to fit.
        retry_after_ms: u64,
    },
    /// Prompt plus output exceed what the whole KV pool can hold.
    #[error(
        "the prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) exceeds the KV pool capacity of {limit} tokens"
    )]
    PoolCapacityExceeded {
        /// Prompt tokens.
        prompt_tokens: usize,
        /// Requested output tokens.
        max_tokens: usize,
        /// The pool's capacity in tokens.
        limit: usize,
    },
}

impl AdmissionError {
    /// A short, stable name of the rule that refused the request (a metric
    /// label; never carries request data).
    pub fn reason(&self) -> &'static str {
        match self {
            AdmissionError::EmptyPrompt => "empty_prompt",
            AdmissionError::NoOutputTokens => "no_output_tokens",
            AdmissionError::TokenOutOfRange { .. } => "token_out_of_range",
            AdmissionError::ContextWindowExceeded { .. } => "context_window_exceeded",
            AdmissionError::PoolCapacityExceeded { .. } => "pool_capacity_exceeded",
            AdmissionError::PrefillTooLong { .. } => "prefill_too_long",
            AdmissionError::PrefillQueueFull { .. } => "prefill_queue_full",
        }
    }

    /// Every [`AdmissionError::reason`].
    pub const REASONS: [&'static str; 7] = [
        "empty_prompt",
        "no_output_tokens",
        "token_out_of_range",
        "context_window_exceeded",
        "pool_capacity_exceeded",
        "prefill_too_long",
        "prefill_queue_full",
    ];
}

/// A request that passed admission, carrying its payload `T`.
///
/// Its fields are private and it has no public constructor besides
/// [`Limits::admit`]: holding one proves the request fits the pool it was
/// admitted for.
#[derive(Debug)]
pub struct Admitted<T> {
    owner: Owner,
    prompt_tokens: usize,
    max_tokens: usize,
    pages: usize,
    /// Pages taken at allocation (the rest are taken as the sequence grows).
    reserve: usize,
    prompt_pages: usize,
    pool: PoolId,
    page_size: usize,
    payload: T,
}

impl Limits {
    /// The limits of a pool: its context window is `context_window`, its
    /// capacity what it holds now.
    pub(crate) fn of_pool(
        context_window: usize,
        pool_tokens: usize,
        page_size: usize,
        pool: PoolId,
    ) -> Limits {
        Limits {
            context_window,
            pool_tokens,
            page_size,
            prefill_tokens: usize::MAX,
            pool,
        }
    }

    /// These limits with prompts capped at `tokens` (what the worker can
    /// prefill within its deadline); only ever lowers the cap.
    #[must_use]
    pub fn with_prefill_limit(self, tokens: usize) -> Limits {
        Limits {
            prefill_tokens: self.prefill_tokens.min(tokens),
            ..self
        }
    }

    /// The longest prompt prefilled within the deadline.
    pub fn prefill_tokens(&self) -> usize {
        self.prefill_tokens
    }

    /// The model's context window, in tokens.
    pub fn context_window(&self) -> usize {
        self.context_window
    }

    /// Tokens the KV pool can hold in total (pages x page size).
    pub fn pool_tokens(&self) -> usize {
        self.pool_tokens
    }

    /// Tokens per page.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// The same numbers as a plain [`Capacity`] (to announce to a peer).
    pub fn capacity(&self) -> Capacity {
        Capacity {
            context_window: self.context_window,
            pool_tokens: self.pool_tokens,
            page_size: self.page_size,
            prefill_tokens: self.prefill_tokens,
        }
    }

    /// The effective per-request token limit: min(context window, pool).
    pub fn max_request_tokens(&self) -> usize {
        self.context_window.min(self.pool_tokens)
    }

    /// These limits narrowed to a peer's capacity (a disaggregated pair:
    /// the smaller window and pool of both workers), still for this pool.
    /// `None` when the page sizes differ (no transfer can map pages one to
    /// one then).
    pub fn narrow(&self, peer: &Capacity) -> Option<Limits> {
        (self.page_size == peer.page_size).then(|| Limits {
            context_window: self.context_window.min(peer.context_window),
            pool_tokens: self.pool_tokens.min(peer.pool_tokens),
            prefill_tokens: self.prefill_tokens.min(peer.prefill_tokens),
            ..*self
        })
    }

    /// Admits a request of `tenant` with `prompt_tokens` that may generate
    /// `max_tokens`, or rejects it. Touches no page either way. The
    /// admission carries a fresh [`Owner`].
    pub fn admit<T>(
        &self,
        tenant: TenantId,
        prompt_tokens: usize,
        max_tokens: usize,
        payload: T,
    ) -> Result<Admitted<T>, AdmissionError> {
        if prompt_tokens == 0 {
            return Err(AdmissionError::EmptyPrompt);
        }
        if max_tokens == 0 {
            return Err(AdmissionError::NoOutputTokens);
        }
        let total = prompt_tokens.saturating_add(max_tokens);
        if total > self.context_window {
            return Err(AdmissionError::ContextWindowExceeded {
                prompt_tokens,
                max_tokens,
                limit: self.context_window,
            });
        }
        if total > self.pool_tokens {
            return Err(AdmissionError::PoolCapacityExceeded {
                prompt_tokens,
                max_tokens,
                limit: self.pool_tokens,
            });
        }
        if prompt_tokens > self.prefill_tokens {
            return Err(AdmissionError::PrefillTooLong {
                prompt_tokens,
                limit: self.prefill_tokens,
            });
        }
        let pages = total.div_ceil(self.page_size);
        Ok(Admitted {
            owner: Owner::fresh(tenant),
            prompt_tokens,
            max_tokens,
            pages,
            reserve: pages,
            prompt_pages: prompt_tokens.div_ceil(self.page_size),
            pool: self.pool,
            page_size: self.page_size,
            payload,
        })
    }
}

impl<T> Admitted<T> {
    /// The owner the pages will be tagged with.
    pub fn owner(&self) -> Owner {
        self.owner
    }

    /// Prompt tokens.
    pub fn prompt_tokens(&self) -> usize {
        self.prompt_tokens
    }

    /// Maximum output tokens.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Pages needed for prompt plus output.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// Pages taken at allocation; the table may grow to [`Admitted::pages`].
    pub fn reserve(&self) -> usize {
        self.reserve
    }

    /// Pages the prompt alone fills: the slots a KV transfer carries.
    pub fn prompt_pages(&self) -> usize {
        self.prompt_pages
    }

    /// The same admission reserving the prompt's pages only: what a prefill
    /// worker holds (it never generates). Only ever shrinks the reservation.
    #[must_use]
    pub fn prompt_only(self) -> Self {
        Admitted {
            pages: self.prompt_pages,
            reserve: self.prompt_pages,
            ..self
        }
    }

    /// The same admission taking only the prompt and the first `tokens` of
    /// output at allocation; the table grows page by page as it generates
    /// ([`crate::KvPool::grow`]), never past [`Admitted::pages`].
    #[must_use]
    pub fn first_slice(self, tokens: usize) -> Self {
        let first = (self.prompt_tokens + tokens.min(self.max_tokens)).div_ceil(self.page_size);
        Admitted {
            reserve: first.clamp(self.prompt_pages, self.pages),
            ..self
        }
    }

    /// Swaps the payload, keeping the admission.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Admitted<U> {
        Admitted {
            owner: self.owner,
            prompt_tokens: self.prompt_tokens,
            max_tokens: self.max_tokens,
            pages: self.pages,
            reserve: self.reserve,
            prompt_pages: self.prompt_pages,
            pool: self.pool,
            page_size: self.page_size,
            payload: f(self.payload),
        }
    }

    /// Whether this admission was made for the pool `pool` with pages of
    /// `page_size` tokens.
    pub(crate) fn made_for(&self, pool: PoolId, page_size: usize) -> bool {
        self.pool == pool && self.page_size == page_size
    }

    /// The payload.
    pub fn payload(&self) -> &T {
        &self.payload
    }

    /// Consumes the admission, returning the payload (after allocation).
    pub fn into_payload(self) -> T {
        self.payload
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant() -> TenantId {
        TenantId::new(1)
    }

    #[test]
    fn admission_applies_the_smaller_of_window_and_pool() {
        // The incident's shape: a context window larger than the pool.
        let limits = Limits::of_pool(1_048_576, 681_280, 16, PoolId(1));
        assert_eq!(limits.max_request_tokens(), 681_280);
        let err = limits.admit(tenant(), 681_280, 1, ()).unwrap_err();
        assert!(matches!(
            err,
            AdmissionError::PoolCapacityExceeded { limit: 681_280, .. }
        ));
        let err = limits.admit(tenant(), 1_048_577, 1, ()).unwrap_err();
        assert!(matches!(err, AdmissionError::ContextWindowExceeded { .. }));
        // A prompt longer than the worker prefills within its deadline.
        let timed = limits.with_prefill_limit(3_000).with_prefill_limit(9_000);
        assert_eq!(timed.prefill_tokens(), 3_000);
        assert_eq!(
            timed.admit(tenant(), 3_001, 1, ()).unwrap_err(),
            AdmissionError::PrefillTooLong {
                prompt_tokens: 3_001,
                limit: 3_000
            }
        );
        assert!(timed.admit(tenant(), 3_000, 1, ()).is_ok());
        let ok = limits.admit(tenant(), 681_279, 1, ()).unwrap();
        assert_eq!(ok.pages(), 681_280 / 16);
        assert_eq!(
            limits.admit(tenant(), 0, 1, ()).unwrap_err(),
            AdmissionError::EmptyPrompt
        );
        assert_eq!(
            limits.admit(tenant(), 5, 0, ()).unwrap_err(),
            AdmissionError::NoOutputTokens
        );
    }

    #[test]
    fn a_peer_only_narrows_and_every_admission_has_its_own_owner() {
        let limits = Limits::of_pool(8_192, 4_096, 16, PoolId(7));
        let huge = Capacity {
            context_window: usize::MAX,
            pool_tokens: usize::MAX,
            page_size: 16,
            prefill_tokens: usize::MAX,
        };
        assert_eq!(limits.narrow(&huge), Some(limits));
        let small = Capacity {
            context_window: 1_000,
            pool_tokens: 2_000,
            page_size: 16,
            prefill_tokens: 1_500,
        };
        let n = limits.narrow(&small).unwrap();
        assert_eq!((n.context_window(), n.pool_tokens()), (1_000, 2_000));
        assert_eq!(n.prefill_tokens(), 1_500);
        assert!(n.admit(tenant(), 990, 11, ()).is_err());
        assert_eq!(
            limits.narrow(&Capacity {
                page_size: 32,
                ..small
            }),
            None
        );
        let a = limits.admit(tenant(), 3, 1, ()).unwrap();
        let b = limits.admit(tenant(), 3, 1, ()).unwrap();
        assert_eq!(a.owner().tenant(), b.owner().tenant());
        assert_ne!(a.owner(), b.owner());
        assert!(a.made_for(PoolId(7), 16));
        assert!(!a.made_for(PoolId(8), 16));
    }
}
