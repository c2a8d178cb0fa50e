//! `bench neighbours --costly`: does a tenant's costliest request shape
//! slow another tenant? B keeps `--costly-streams` generations of
//! `--costly-tokens` tokens going, first plain, then each constrained by
//! the costliest shapes the API admits (a schema whose one property name
//! is as long as allowed, and the most and longest stop strings); A's time
//! to first token is measured beside each. The figure: A's p99 beside the
//! costly load against its p99 beside the plain load of the same length
//! (target at most 1.2x).

use super::{Flood, Outcomes, add, percentile, run_b, while_flooded};
use crate::bench::Prompts;
use crate::bench::transfer::Pair;
use bulkhead_engine::GenerateRequest;
use bulkhead_grammar::{Grammar, MAX_NAME_BYTES};
use bulkhead_worker_api::{MAX_STOP_BYTES, MAX_STOPS};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::task::JoinSet;

/// One of B's generations, plain or in the costliest shape.
fn request(prompt: Vec<u32>, tokens: usize, costly: bool) -> anyhow::Result<GenerateRequest> {
    let mut r = GenerateRequest::fixed_length(prompt, tokens);
    if costly {
        let name = "k".repeat(MAX_NAME_BYTES);
        // The value cannot end before the generation does: the same length
        // as a plain one.
        let schema = json!({"type": "object",
            "properties": {&name: {"type": "string", "minLength": 100_000}},
            "required": [&name], "additionalProperties": false});
        r.sampling.constraint = Some(Grammar::from_schema(&schema)?);
        // Stop strings that never match, each as long as allowed.
        r.stop = (0..MAX_STOPS)
            .map(|i| {
                char::from(b'~' - u8::try_from(i).unwrap_or(0))
                    .to_string()
                    .repeat(MAX_STOP_BYTES)
            })
            .collect();
    }
    Ok(r)
}

/// B's `streams` generations, each started again when it ends, until told
/// to stop.
fn flood(
    decode: &Pair,
    short: &Prompts,
    (streams, tokens): (usize, usize),
    costly: bool,
) -> anyhow::Result<Flood> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut set = JoinSet::new();
    for s in 0..streams {
        let (decode, stop) = (decode.clone(), Arc::clone(&stop));
        let prompt = short.get(s, short.len());
        let req = request(prompt, tokens, costly)?;
        set.spawn(async move {
            let mut o = Outcomes::default();
            while !stop.load(Ordering::Relaxed) {
                o = add(
                    o,
                    run_b(&decode, req.clone(), Some(Arc::clone(&stop))).await,
                );
            }
            o
        });
    }
    Ok((set, stop))
}

/// A's TTFT beside the plain load and beside the costly one; the report.
pub(super) async fn phases(
    decode: &Pair,
    short: &Prompts,
    samples: usize,
    (streams, tokens): (usize, usize),
    alone_p99: f64,
) -> anyhow::Result<Value> {
    let a = (decode, short, samples);
    let settle = Duration::from_secs(2);
    let plain = flood(decode, short, (streams, tokens), false)?;
    let (plain_ttft, plain_b) = while_flooded(a, plain, settle).await?;
    let costly = flood(decode, short, (streams, tokens), true)?;
    let (costly_ttft, costly_b) = while_flooded(a, costly, settle).await?;
    let p99 = |t: &[f64]| percentile(t, 99);
    let phase = |t: &[f64], b: Outcomes| {
        json!({"a_ttft_p50_ms": percentile(t, 50) * 1e3, "a_ttft_p99_ms": p99(t) * 1e3,
               "a_p99_vs_alone": p99(t) / alone_p99, "b_answered": b.answered,
               "b_refused": b.refused, "b_failed": b.failed})
    };
    Ok(json!({
        "b_streams": streams,
        "b_tokens": tokens,
        "property_name_bytes": MAX_NAME_BYTES,
        "stop_strings": MAX_STOPS,
        "stop_bytes": MAX_STOP_BYTES,
        "plain": phase(&plain_ttft, plain_b),
        "costly": phase(&costly_ttft, costly_b),
        "a_p99_costly_vs_plain": p99(&costly_ttft) / p99(&plain_ttft),
        "target": "a_p99_costly_vs_plain <= 1.2",
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_costly_shape_is_the_largest_the_api_admits() {
        let r = request(vec![1, 2, 3], 8, true).expect("request");
        assert!(bulkhead_worker_api::check_stops(&r.stop).is_ok());
        assert_eq!(r.stop.len(), MAX_STOPS);
        assert!(r.stop.iter().all(|s| s.len() == MAX_STOP_BYTES));
        assert!(r.sampling.constraint.is_some());
        assert!(request(vec![1], 8, false).expect("plain").stop.is_empty());
    }
}
