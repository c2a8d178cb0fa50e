//! The replay guard: request ids a worker has served, until their
//! contexts expire, so a context is good for one call.
//!
//! It is bounded by expiry and by [`MAX_SEEN`]: expired ids are shed
//! first, and under a flood of more live contexts than that (a worker
//! serves far fewer calls in a context's 30 s; only the gateway can mint
//! them) the ids closest to expiry are forgotten and counted
//! ([`ReplayGuard::forgotten`]), so the guard never refuses every call
//! because it is full. A forgotten id could be replayed until it expires.

use super::{ContextError, TenantContext, millis};
use std::collections::{HashMap, VecDeque};
use std::time::SystemTime;

/// Most live ids remembered.
pub const MAX_SEEN: usize = 1 << 18;

/// Ids served and their expiry.
#[derive(Debug, Default)]
pub struct ReplayGuard {
    seen: HashMap<String, u64>,
    /// The same ids in the order they came (their expiry is nearly in
    /// order: every gateway signs with the same lifetime).
    order: VecDeque<(u64, String)>,
    forgotten: u64,
    limit: Option<usize>,
}

impl ReplayGuard {
    /// A guard that remembers at most `limit` live ids (a test's flood).
    pub fn with_limit(limit: usize) -> ReplayGuard {
        ReplayGuard {
            limit: Some(limit.max(1)),
            ..ReplayGuard::default()
        }
    }

    /// Records `ctx`'s request id; refuses one seen before.
    pub fn admit(&mut self, ctx: &TenantContext, now: SystemTime) -> Result<(), ContextError> {
        let now = millis(now);
        while let Some((expires, _)) = self.order.front()
            && *expires < now
        {
            self.pop();
        }
        if self.seen.contains_key(&ctx.request_id) {
            return Err(ContextError::Replayed(ctx.request_id.clone()));
        }
        while self.seen.len() >= self.limit.unwrap_or(MAX_SEEN) {
            self.pop();
            self.forgotten += 1;
        }
        self.seen.insert(ctx.request_id.clone(), ctx.expires_ms);
        self.order
            .push_back((ctx.expires_ms, ctx.request_id.clone()));
        Ok(())
    }

    /// Live ids forgotten to make room (a flood past [`MAX_SEEN`]).
    pub fn forgotten(&self) -> u64 {
        self.forgotten
    }

    /// Ids remembered now.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether it remembers none.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    fn pop(&mut self) {
        if let Some((_, id)) = self.order.pop_front() {
            self.seen.remove(&id);
        }
    }
}
