//! Whether a registered worker may receive requests: a pure function of what
//! it registered, its model's active config and the time of its last
//! heartbeat. Computed on every read, so a node that re-registers with a
//! smaller pool is unroutable from that moment, with the reason spelled out.
//!
//! A node is routable only if it heartbeated within the TTL, its model has an
//! active config, its measured pool holds that config's context window plus max
//! output, it prefills the window within its deadline at the speed it
//! registered (a node that registered no speed is unroutable), and it serves
//! the config's weights, quantization, page size and parallelism. Every reason
//! that fails is named.

use crate::ConfigVersion;
use bulkhead_control_api::{ConfigSpec, PrefillFigures, Properties, RegisterNode, Timestamp};
use std::time::Duration;

/// What the verdict on a node reads of it: what it registered and when it
/// was last seen.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NodeFacts<'a> {
    /// Its last registration.
    pub(crate) registration: &'a RegisterNode,
    /// Its last registration or heartbeat.
    pub(crate) last_seen_at: Timestamp,
}

/// The config a node is held to: its model's active one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ActiveConfig<'a> {
    /// Its version, named in the reasons.
    pub(crate) version: ConfigVersion,
    /// Its content.
    pub(crate) spec: &'a ConfigSpec,
}

/// The verdict on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Routability {
    /// Requests may go to it.
    Routable,
    /// They may not, and why (every reason, `; `-separated).
    Unroutable(String),
}

/// Whether a KV pool of `pool_tokens` holds one request at `p`'s limits
/// (context window + max output).
pub fn check_fits(p: &Properties, pool_tokens: u64) -> bool {
    pool_tokens >= p.required_tokens()
}

/// Why a node cannot prefill a context window of `window` tokens within
/// its deadline at the speed it registered (`None`: it can).
pub(crate) fn prefill_shortfall(prefill: Option<&PrefillFigures>, window: u64) -> Option<String> {
    let Some(f) = prefill else {
        return Some("registered no measured prefill speed".to_owned());
    };
    let ms = f.prompt_ms(window);
    (ms > f.deadline_ms).then(|| {
        format!(
            "prefilling the {window}-token context window would take about {} s at its measured speed, \
             over its {} s prefill deadline (it prefills at most {} tokens in time)",
            ms.div_ceil(1000),
            f.deadline_ms / 1000,
            f.max_prompt()
        )
    })
}

/// Whether a node last seen at `last_seen_at` was seen within `ttl` of
/// `now`.
pub(crate) fn is_live(last_seen_at: Timestamp, now: Timestamp, ttl: Duration) -> bool {
    let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
    now.millis().saturating_sub(last_seen_at.millis()) <= ttl_ms
}

/// The verdict on `node`, held to `active`, at `now` with heartbeats due
/// within `ttl`.
pub(crate) fn evaluate(
    node: NodeFacts<'_>,
    active: Option<ActiveConfig<'_>>,
    now: Timestamp,
    ttl: Duration,
) -> Routability {
    let mut reasons = Vec::new();
    if !is_live(node.last_seen_at, now, ttl) {
        let silent = now.millis().saturating_sub(node.last_seen_at.millis()) / 1000;
        reasons.push(format!(
            "no heartbeat for {silent} s (limit {} s)",
            ttl.as_secs()
        ));
    }
    let r = node.registration;
    match active {
        None => reasons.push("its model has no active config".to_owned()),
        Some(c) => {
            let p = &c.spec.properties;
            if !check_fits(p, r.kv_pool_tokens) {
                reasons.push(format!(
                    "measured KV pool of {} tokens is smaller than context window {} + max output {} = {} tokens of config {}",
                    r.kv_pool_tokens,
                    p.context_window,
                    p.max_output,
                    p.required_tokens(),
                    c.version
                ));
            }
            if let Some(why) = prefill_shortfall(r.prefill.as_ref(), p.context_window) {
                reasons.push(format!("{why} (config {})", c.version));
            }
            if !r
                .weights_sha256
                .eq_ignore_ascii_case(&c.spec.weights_sha256)
            {
                reasons.push(format!(
                    "serves weights sha256 {} but config {} names {}",
                    short(&r.weights_sha256),
                    c.version,
                    short(&c.spec.weights_sha256)
                ));
            }
            if !r.quantization.eq_ignore_ascii_case(&c.spec.quantization) {
                reasons.push(format!(
                    "serves quantization {} but config {} names {}",
                    r.quantization, c.version, c.spec.quantization
                ));
            }
            if r.page_size != c.spec.page_size {
                reasons.push(format!(
                    "uses {}-token KV pages but config {} names {}",
                    r.page_size, c.version, c.spec.page_size
                ));
            }
            if r.parallelism != c.spec.parallelism {
                reasons.push(format!(
                    "runs tensor×pipeline {}×{} but config {} names {}×{}",
                    r.parallelism.tensor,
                    r.parallelism.pipeline,
                    c.version,
                    c.spec.parallelism.tensor,
                    c.spec.parallelism.pipeline
                ));
            }
        }
    }
    if reasons.is_empty() {
        Routability::Routable
    } else {
        Routability::Unroutable(reasons.join("; "))
    }
}

fn short(sha: &str) -> &str {
    sha.get(..12).unwrap_or(sha)
}
