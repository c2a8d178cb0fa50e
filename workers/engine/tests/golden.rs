//! The engine against llama.cpp's measurements on the same file
//! (`testdata/smollm2-135m-q4_1.json`): tokenizer ids, the rendered chat
//! template, and greedy output on the default (Q4_1) path, with the widest
//! kernels this CPU has (`golden_avx2.rs` runs the same checks on AVX2).

mod common;

use bulkhead_engine::ChatMessage;
use common::{golden, ids, model};

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
    common::greedy_output_matches_golden();
}

#[test]
fn greedy_output_does_not_depend_on_page_size() {
    common::greedy_output_is_the_same_for_page_sizes(&[1, 5, 64]);
}
