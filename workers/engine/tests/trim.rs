//! `trim_layers`: the default model cut to its first blocks is a model
//! both engines load, with the same vocabulary, tokenizer and chat
//! template, and the blocks it keeps byte for byte; a count it cannot
//! keep is refused.

mod common;

use bulkhead_engine::{Engine, EngineConfig, ModelFile, trim_layers};
use common::{greedy, run};
use std::sync::Arc;

#[test]
fn a_trimmed_model_loads_with_the_kept_layers_and_generates() {
    let dir = std::env::temp_dir().join(format!("bulkhead-trim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = common::model_path();
    let dst = dir.join("two.gguf");
    assert_eq!(trim_layers(&src, &dst, 2).unwrap(), 30);
    let full = common::model();
    let small = Arc::new(ModelFile::load(&dst).unwrap());
    let (f, s) = (full.config(), small.config());
    assert_eq!(s.layers, 2);
    assert_eq!(
        (s.hidden, s.vocab, s.heads, s.kv_heads),
        (f.hidden, f.vocab, f.heads, f.kv_heads)
    );
    let text = "<|im_start|>user\nHi<|im_end|>\n";
    assert_eq!(
        small.tokenizer().encode(text).unwrap(),
        full.tokenizer().encode(text).unwrap()
    );
    assert!(small.chat_template().is_some());
    assert!(std::fs::metadata(&dst).unwrap().len() < std::fs::metadata(&src).unwrap().len() / 2);

    // It runs, deterministically, and not as the whole model does.
    let mut c = EngineConfig::with_budget(16 << 20);
    c.threads = 2;
    let prompt = full.tokenizer().encode("The capital of France is").unwrap();
    let engine = Engine::start(Arc::clone(&small), &c).unwrap();
    let (a, _, _) = run(&engine, 1, greedy(prompt.clone(), 8));
    let (b, _, _) = run(&engine, 2, greedy(prompt.clone(), 8));
    assert_eq!(a.len(), 8);
    assert_eq!(a, b);
    let whole = Engine::start(full, &c).unwrap();
    let (w, _, _) = run(&whole, 1, greedy(prompt, 8));
    assert_ne!(a, w, "two layers are not the whole model");

    for bad in [0, 31] {
        assert!(
            trim_layers(&src, &dir.join("bad.gguf"), bad).is_err(),
            "{bad} layers"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
