//! `bulkhead bench grammar`: what constrained sampling costs per step at
//! each point of a long object key. Under a schema whose one property name
//! is as long as the API admits, the matcher is fed the key's first `p`
//! bytes; then one step's check of the whole vocabulary (what the sampler
//! does for a token) is timed, several rounds, at each `p`, interleaved.
//! The figure is each position's median against the key's first byte: a
//! step must cost the same however far into the key the output is.

use crate::config::ModelArgs;
use bulkhead_grammar::{Grammar, MAX_NAME_BYTES, Matcher};
use clap::Args;
use serde_json::json;
use std::time::Instant;

#[derive(Debug, Args)]
pub(crate) struct GrammarBenchArgs {
    /// Rounds at each key position (interleaved).
    #[arg(long, default_value_t = 15)]
    rounds: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    model: ModelArgs,
}

pub(crate) fn run(args: &GrammarBenchArgs) -> anyhow::Result<()> {
    let model = args.model.load()?.0;
    let tokenizer = model.tokenizer();
    let vocab: Vec<&[u8]> = (0..u32::try_from(model.config().vocab)?)
        .map(|id| tokenizer.token_bytes(id).unwrap_or(&[]))
        .collect();
    let name = "k".repeat(MAX_NAME_BYTES);
    let schema = json!({"type": "object", "properties": {&name: {"type": "string"}},
        "required": [&name], "additionalProperties": false});
    let grammar = Grammar::from_schema(&schema)?;
    let positions = [1usize, 16, 64, MAX_NAME_BYTES / 2, MAX_NAME_BYTES - 1];
    let matchers: Vec<Matcher> = positions
        .iter()
        .map(|&p| {
            let mut m = Matcher::new(std::sync::Arc::clone(&grammar));
            let fed = m.feed(format!("{{\"{}", &name[..p]).as_bytes());
            anyhow::ensure!(fed, "the key's first {p} bytes were refused");
            Ok(m)
        })
        .collect::<anyhow::Result<_>>()?;
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); positions.len()];
    let mut accepted = vec![0usize; positions.len()];
    for _ in 0..args.rounds.max(1) {
        for (i, m) in matchers.iter().enumerate() {
            let start = Instant::now();
            accepted[i] = vocab
                .iter()
                .filter(|b| !b.is_empty() && m.accepts(b))
                .count();
            times[i].push(start.elapsed().as_secs_f64() * 1e6);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let medians: Vec<f64> = times.iter_mut().map(median).collect();
    if args.json {
        let rows: Vec<_> = positions
            .iter()
            .zip(&medians)
            .zip(&accepted)
            .map(|((p, us), a)| {
                json!({"key_bytes": p, "step_us": us, "accepted": a,
                "ratio": us / medians[0]})
            })
            .collect();
        println!(
            "{}",
            json!({"vocab": vocab.len(), "name_bytes": MAX_NAME_BYTES, "steps": rows})
        );
        return Ok(());
    }
    println!(
        "constrained step over {} tokens, one property name of {MAX_NAME_BYTES} bytes ({} rounds, median):",
        vocab.len(),
        args.rounds
    );
    println!(
        "{:>10} {:>12} {:>10} {:>12}",
        "key bytes", "step µs", "accepted", "vs byte 1"
    );
    for ((p, us), a) in positions.iter().zip(&medians).zip(&accepted) {
        println!("{p:>10} {us:>12.1} {a:>10} {:>11.2}x", us / medians[0]);
    }
    Ok(())
}
