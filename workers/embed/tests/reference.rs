//! The engine against sentence-transformers: the 32 reference inputs
//! (`testdata/embeddings/`, made by the script beside them) tokenize to the
//! same ids and embed to vectors within cosine 0.9999, whether computed
//! alone or packed in one batch with the others.

// Tests read their services from the environment (clippy.toml keeps
// library code from it).
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)]

use bulkhead_embed::{Embedder, Tokens, package};
use bulkhead_engine::fetch::{Progress, Source};
use serde::Deserialize;

#[derive(Deserialize)]
struct Reference {
    max_seq_length: usize,
    dimensions: usize,
    inputs: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
    vector: Vec<f32>,
}

fn reference() -> Reference {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/embeddings/all-minilm-l6-v2.json"
    );
    serde_json::from_slice(&std::fs::read(path).expect("reference file")).expect("reference json")
}

fn embedder() -> Embedder {
    let source = Source::from_vars(|k| std::env::var_os(k), Progress::Quiet);
    let dir = package::ensure(&source).expect("embedding model");
    Embedder::load(&dir).expect("model loads")
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let n = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

#[test]
fn vectors_match_sentence_transformers_alone_and_packed() {
    let r = reference();
    let e = embedder();
    assert_eq!(e.config().max_seq_length, r.max_seq_length);
    assert_eq!(e.config().hidden_size, r.dimensions);
    let tokens: Vec<Tokens> = r
        .inputs
        .iter()
        .map(|c| e.tokenize(&c.text).expect("tokenized"))
        .collect();
    for (t, c) in tokens.iter().zip(&r.inputs) {
        assert_eq!(t.ids(), c.ids.as_slice(), "ids of {:?}", c.text);
    }
    // The inputs past the limit were truncated, and say so.
    assert!(tokens.iter().filter(|t| t.truncated() > 0).count() >= 2);
    let packed = e.embed(&tokens).expect("embedded");
    let mut worst = 1.0f64;
    for (i, (v, c)) in packed.iter().zip(&r.inputs).enumerate() {
        let alone = &e.embed(std::slice::from_ref(&tokens[i])).expect("alone")[0];
        for got in [v, alone] {
            let s = cosine(got, &c.vector);
            worst = worst.min(s);
            assert!(s >= 0.9999, "{:?}: cosine {s}", c.text);
        }
        let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "normalised: {norm}");
    }
    eprintln!("worst cosine against sentence-transformers: {worst:.7}");
}

#[test]
fn token_ids_are_checked_and_wrapped_as_text_would_be() {
    let e = embedder();
    let text = e.tokenize("The quick brown fox").expect("tokenized");
    let pieces = &text.ids()[1..text.len() - 1];
    assert_eq!(e.from_ids(pieces).expect("ids"), text);
    let vocab = e.config().vocab_size as u32;
    let err = e
        .from_ids(&[2_000, vocab])
        .expect_err("out of the vocabulary");
    assert!(err.to_string().contains(&vocab.to_string()), "{err}");
    let long = vec![2_000u32; 1_000];
    let t = e.from_ids(&long).expect("truncated");
    assert_eq!(t.len(), e.config().max_seq_length);
    assert_eq!(t.truncated(), 1_000 - (e.config().max_seq_length - 2));
    assert!(e.embed(&[]).expect("nothing").is_empty());
}
