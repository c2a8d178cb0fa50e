//! `bulkhead bench grammar`: what constrained sampling costs per step at
//! each point of a long object key. Under a schema whose one property name
//! is as long as the API admits, the matcher is fed the key's first `p`
//! bytes; then one step's check of the whole vocabulary is timed, several
//! rounds, at each `p`, interleaved, two ways: the engine's walk of the
//! vocabulary sorted by bytes (what the sampler does), and a matcher copy
//! and walk per token (the way before it). The figures: each position's
//! median against the key's first byte (a step must cost the same however
//! far into the key the output is), and the per-token way against the walk.

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
    // Each position: the engine's walk, and a matcher copy per token.
    let mut walk: Vec<Vec<f64>> = vec![Vec::new(); positions.len()];
    let mut each: Vec<Vec<f64>> = vec![Vec::new(); positions.len()];
    let mut accepted = vec![0usize; positions.len()];
    for _ in 0..args.rounds.max(1) {
        for (i, m) in matchers.iter().enumerate() {
            let start = Instant::now();
            let walked = tokenizer.accepted_by(m);
            walk[i].push(start.elapsed().as_secs_f64() * 1e6);
            accepted[i] = walked.iter().filter(|a| **a).count();
            let start = Instant::now();
            let per_token = vocab
                .iter()
                .filter(|b| !b.is_empty() && m.accepts(b))
                .count();
            each[i].push(start.elapsed().as_secs_f64() * 1e6);
            anyhow::ensure!(
                per_token == accepted[i],
                "the walk and the per-token check disagree at key byte {}",
                positions[i]
            );
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let walk: Vec<f64> = walk.iter_mut().map(median).collect();
    let each: Vec<f64> = each.iter_mut().map(median).collect();
    if args.json {
        let rows: Vec<_> = (0..positions.len())
            .map(|i| {
                json!({"key_bytes": positions[i], "walk_us": walk[i], "accepted": accepted[i],
                    "walk_vs_first_byte": walk[i] / walk[0], "per_token_us": each[i],
                    "per_token_vs_first_byte": each[i] / each[0],
                    "per_token_over_walk": each[i] / walk[i]})
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
        "{:>9} {:>9} {:>9} {:>10} {:>13} {:>10} {:>9}",
        "key bytes", "accepted", "walk µs", "vs byte 1", "per-token µs", "vs byte 1", "per/walk"
    );
    for i in 0..positions.len() {
        println!(
            "{:>9} {:>9} {:>9.1} {:>9.2}x {:>13.1} {:>9.2}x {:>8.1}x",
            positions[i],
            accepted[i],
            walk[i],
            walk[i] / walk[0],
            each[i],
            each[i] / each[0],
            each[i] / walk[i]
        );
    }
    Ok(())
}
