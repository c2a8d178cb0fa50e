//! Constrained sampling and log-probabilities on the real model: JSON mode
//! and a JSON schema give output that parses (and would not without the
//! grammar), greedy or sampled; log-probabilities are the model's own.

mod common;

use bulkhead_engine::{ChatMessage, FinishReason, GenerateRequest, SamplingParams, SeqEvent};
use bulkhead_grammar::Grammar;
use bulkhead_kv::TenantId;
use serde_json::{Value, json};

fn chat(text: &str) -> Vec<u32> {
    let m = common::model();
    let prompt = m
        .chat_template()
        .expect("template")
        .render(&[ChatMessage {
            role: "user".into(),
            content: text.into(),
        }])
        .expect("renders");
    m.tokenizer().encode(&prompt).expect("encodes")
}

fn request(prompt: Vec<u32>, sampling: SamplingParams) -> GenerateRequest {
    GenerateRequest {
        prompt,
        sampling,
        stop: Vec::new(),
        ignore_eos: false,
        cache: None,
        class: bulkhead_engine::WorkClass::Interactive,
    }
}

const ASK: &str = "Describe a cat as JSON with its name and age.";

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 16},
            "age": {"type": "integer"},
            "indoor": {"type": "boolean"}
        },
        "required": ["name", "age", "indoor"],
        "additionalProperties": false
    })
}

fn fits_schema(v: &Value) -> bool {
    let Some(o) = v.as_object() else {
        return false;
    };
    o.len() == 3
        && o["name"].as_str().is_some_and(|n| n.chars().count() <= 16)
        && o["age"].is_i64()
        && o["indoor"].is_boolean()
}

#[test]
fn json_mode_and_schemas_give_output_that_parses_greedy_or_sampled() {
    let engine = common::engine(64);
    let prompt = chat(ASK);

    // Without a grammar the model writes prose or broken JSON: the
    // constraint below is what makes the output parse.
    let (_, free, _) = common::run(
        &engine,
        1,
        request(prompt.clone(), SamplingParams::greedy(64)),
    );
    assert!(
        serde_json::from_str::<Value>(&free).map_or(true, |v| !fits_schema(&v)),
        "the unconstrained output already fits: {free}"
    );

    // JSON mode bounds nothing but the syntax: what it gives within
    // `max_tokens` is JSON so far, and parses when it closes.
    let mut p = SamplingParams::greedy(48);
    p.constraint = Some(Grammar::json_object());
    let (_, text, end) = common::run(&engine, 1, request(prompt.clone(), p));
    let mut m = bulkhead_grammar::Matcher::new(Grammar::json_object());
    assert!(m.feed(text.as_bytes()), "not JSON: {text}");
    assert!(text.starts_with('{'), "{text}");
    if matches!(
        end,
        SeqEvent::Finished {
            reason: FinishReason::Stop,
            ..
        }
    ) {
        assert!(
            serde_json::from_str::<Value>(&text).is_ok_and(|v| v.is_object()),
            "{text}"
        );
    }

    // Its sampling (the grammar's walk of the vocabulary each step) was
    // charged to the tenant's fair share, as work beyond the model.
    let charged = engine.stats().map_or(0, |s| s.sampling_units);
    assert!(charged > 0, "no sampling work was charged");

    // A schema that bounds every string closes within the budget.
    let g = Grammar::from_schema(&schema()).expect("compiles");
    for (temperature, seed) in [(0.0, 0), (0.9, 1), (0.9, 2), (1.3, 3)] {
        let mut p = SamplingParams::greedy(96);
        p.temperature = temperature;
        p.seed = seed;
        p.constraint = Some(g.clone());
        let (_, text, end) = common::run(&engine, 2, request(prompt.clone(), p));
        let v: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{e} at temperature {temperature}: {text}"));
        assert!(fits_schema(&v), "{text}");
        assert!(matches!(
            end,
            SeqEvent::Finished {
                reason: FinishReason::Stop,
                ..
            }
        ));
    }
}

#[test]
fn logprobs_are_the_models_distribution() {
    let engine = common::engine(64);
    let mut p = SamplingParams::greedy(12);
    p.logprobs = Some(5);
    let mut h = engine
        .submit(TenantId::new(3), request(chat("Name a colour."), p))
        .expect("admitted");
    let mut seen = 0;
    while let Some(ev) = h.blocking_next() {
        let SeqEvent::Token { id, logprobs, .. } = ev else {
            break;
        };
        let l = logprobs.expect("asked for");
        seen += 1;
        // Greedy picks the most likely token: it heads the list.
        assert_eq!(l.chosen.id, id);
        assert_eq!(l.top.len(), 5);
        assert_eq!(l.top[0].id, id);
        assert!((l.top[0].logprob - l.chosen.logprob).abs() < 1e-6);
        assert!(l.top.windows(2).all(|w| w[0].logprob >= w[1].logprob));
        let mass: f32 = l.top.iter().map(|t| t.logprob.exp()).sum();
        assert!(mass > 0.0 && mass <= 1.0 + 1e-4, "{mass}");
        assert!(l.chosen.logprob <= 0.0);
        assert_eq!(
            l.chosen.bytes,
            common::model()
                .tokenizer()
                .token_bytes(id)
                .unwrap_or_default()
        );
    }
    assert!(seen > 0);
}

/// The first token's alternatives and their log-probabilities come from
/// the raw logits: whatever temperature, penalty and seed sample it, the
/// list is the greedy one's (and the chosen token's log-probability is its
/// own in that distribution, not the tempered one's).
#[test]
fn logprobs_are_read_before_temperature_and_penalties() {
    let engine = common::engine(64);
    let first = |temperature: f32, repetition_penalty: f32, seed: u64| {
        let mut p = SamplingParams::greedy(1);
        (p.temperature, p.repetition_penalty, p.seed, p.logprobs) =
            (temperature, repetition_penalty, seed, Some(8));
        let mut h = engine
            .submit(TenantId::new(4), request(chat("Name a colour."), p))
            .expect("admitted");
        match h.blocking_next() {
            Some(SeqEvent::Token { logprobs, .. }) => logprobs.expect("asked for"),
            other => panic!("no first token: {other:?}"),
        }
    };
    let greedy = first(0.0, 1.0, 0);
    let top = |l: &bulkhead_engine::Logprobs| -> Vec<(u32, f32)> {
        l.top.iter().map(|t| (t.id, t.logprob)).collect()
    };
    let mut differed = false;
    for seed in 1..=6 {
        let hot = first(1.8, 1.3, seed);
        assert_eq!(top(&hot), top(&greedy), "seed {seed}");
        let own = greedy.top.iter().find(|t| t.id == hot.chosen.id);
        if let Some(t) = own {
            assert!((t.logprob - hot.chosen.logprob).abs() < 1e-6, "seed {seed}");
        }
        differed |= hot.chosen.id != greedy.chosen.id;
    }
    assert!(
        differed,
        "at temperature 1.8 some seed samples another first token"
    );
}
