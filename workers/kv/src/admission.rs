//! Admission: the only way to obtain an [`Admitted`] request.

use crate::ids::Owner;

/// What a worker can hold for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The model's context window, in tokens.
    pub context_window: usize,
    /// Tokens the KV pool can hold in total (pages x page size).
    pub pool_tokens: usize,
    /// Tokens per page.
    pub page_size: usize,
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
        }
    }

    /// Every [`AdmissionError::reason`].
    pub const REASONS: [&'static str; 5] = [
        "empty_prompt",
        "no_output_tokens",
        "token_out_of_range",
        "context_window_exceeded",
        "pool_capacity_exceeded",
    ];
}

/// A request that passed admission, carrying its payload `T`.
///
/// Its fields are private and it has no public constructor besides
/// [`Limits::admit`]: holding one proves the request fits.
#[derive(Debug)]
pub struct Admitted<T> {
    owner: Owner,
    prompt_tokens: usize,
    max_tokens: usize,
    pages: usize,
    prompt_pages: usize,
    payload: T,
}

impl Limits {
    /// The effective per-request token limit: min(context window, pool).
    pub fn max_request_tokens(&self) -> usize {
        self.context_window.min(self.pool_tokens)
    }

    /// The limits of a disaggregated pair: the smaller window and pool of
    /// both workers. `None` when their page sizes differ (no transfer can
    /// map pages one to one then).
    pub fn intersect(&self, other: &Limits) -> Option<Limits> {
        (self.page_size == other.page_size).then(|| Limits {
            context_window: self.context_window.min(other.context_window),
            pool_tokens: self.pool_tokens.min(other.pool_tokens),
            page_size: self.page_size,
        })
    }

    /// Admits a request of `prompt_tokens` that may generate `max_tokens`,
    /// or rejects it. Touches no page either way.
    pub fn admit<T>(
        &self,
        owner: Owner,
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
        Ok(Admitted {
            owner,
            prompt_tokens,
            max_tokens,
            pages: total.div_ceil(self.page_size),
            prompt_pages: prompt_tokens.div_ceil(self.page_size),
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
            prompt_pages: self.prompt_pages,
            payload: f(self.payload),
        }
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
    use crate::ids::{RequestId, TenantId};

    fn owner() -> Owner {
        Owner {
            tenant: TenantId::new(1),
            request: RequestId::new(1),
        }
    }

    #[test]
    fn admission_applies_the_smaller_of_window_and_pool() {
        // The incident's shape: a context window larger than the pool.
        let limits = Limits {
            context_window: 1_048_576,
            pool_tokens: 681_280,
            page_size: 16,
        };
        assert_eq!(limits.max_request_tokens(), 681_280);
        let err = limits.admit(owner(), 681_280, 1, ()).unwrap_err();
        assert!(matches!(
            err,
            AdmissionError::PoolCapacityExceeded { limit: 681_280, .. }
        ));
        let err = limits.admit(owner(), 1_048_577, 1, ()).unwrap_err();
        assert!(matches!(err, AdmissionError::ContextWindowExceeded { .. }));
        let ok = limits.admit(owner(), 681_279, 1, ()).unwrap();
        assert_eq!(ok.pages(), 681_280 / 16);
        assert_eq!(
            limits.admit(owner(), 0, 1, ()).unwrap_err(),
            AdmissionError::EmptyPrompt
        );
        assert_eq!(
            limits.admit(owner(), 5, 0, ()).unwrap_err(),
            AdmissionError::NoOutputTokens
        );
    }
}
