//! What a worker serves: one engine colocated, or the decode or prefill
//! side of a pair.

use crate::decode::DecodeWorker;
use crate::prefill::PrefillWorker;
use bulkhead_engine::Engine;
use std::sync::Arc;

/// What serves a worker's API.
#[derive(Debug, Clone)]
pub enum Role {
    /// Prefill and decode in one engine.
    Colocated(Arc<Engine>),
    /// Decode, with prompts prefilled by a prefill worker.
    Decode(DecodeWorker),
    /// Prefill only: no generate endpoint.
    Prefill(PrefillWorker),
}
