//! The engine against llama.cpp's measurements on the same file
//! (`testdata/smollm2-135m-q4_1.json`): tokenizer ids, the rendered chat
//! template, and greedy output on the default (Q4_1) path.

mod common;

use bulkhead_engine::ChatMessage;
use common::{engine, golden, greedy, ids, model, run};

#[test]
fn tokenizer_and_chat_template_match_golden() {
    let g = golden();
    let m = model();
    assert_eq!(g["chat_template"].as_str(), Some(source_of_template(&m)));
    for case in g["cases"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        assert_eq!(
            m.tokenizer().encode(prompt).unwrap(),
            ids(&case["prompt_ids"]),
            "{}",
            case["name"]
        );
        // Lossless round trip, special tokens included.
        assert_eq!(
            m.tokenizer().decode(&ids(&case["prompt_ids"]), false),
            prompt
        );
        if let Some(messages) = case["messages"].as_array() {
            let msgs: Vec<ChatMessage> = messages
                .iter()
                .map(|m| ChatMessage {
                    role: m["role"].as_str().unwrap().to_owned(),
                    content: m["content"].as_str().unwrap().to_owned(),
                })
                .collect();
            let rendered = m.chat_template().unwrap().render(&msgs).unwrap();
            assert_eq!(rendered, prompt, "{}", case["name"]);
        }
    }
}

fn source_of_template(m: &bulkhead_engine::ModelFile) -> &str {
    m.chat_template().map(|t| t.source()).unwrap_or_default()
}

#[test]
fn greedy_output_on_q4_1_matches_llama_cpp() {
    let g = golden();
    let e = engine(256);
    let mut failures = Vec::new();
    for case in g["cases"].as_array().unwrap() {
        let expected = ids(&case["greedy_ids"]);
        let (got, _, _) = run(&e, 1, greedy(ids(&case["prompt_ids"]), expected.len()));
        if got != expected {
            let at = got.iter().zip(&expected).position(|(a, b)| a != b);
            failures.push(format!(
                "{}: first difference at {at:?}\n got {got:?}\nwant {expected:?}",
                case["name"]
            ));
        }
        // The text up to EOS, decoded as a client sees it.
        let eos = model().tokenizer().eos();
        let until_eos: Vec<u32> = expected.iter().copied().take_while(|t| *t != eos).collect();
        assert_eq!(
            model().tokenizer().decode(&until_eos, true),
            case["greedy_text_until_eos"].as_str().unwrap()
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn greedy_output_does_not_depend_on_page_size() {
    let g = golden();
    let case = &g["cases"][2];
    let expected = ids(&case["greedy_ids"]);
    for page_size in [1, 5, 64] {
        let mut config = bulkhead_engine::EngineConfig::with_budget(64 << 20);
        config.page_size = page_size;
        config.threads = 2;
        let e = bulkhead_engine::Engine::start(model(), &config).expect("engine starts");
        let (got, _, _) = run(&e, 1, greedy(ids(&case["prompt_ids"]), expected.len()));
        assert_eq!(got, expected, "page size {page_size}");
    }
}
