//! Embeddings through the whole platform (`bulkhead up` with its embedding
//! worker), as tenants call them over HTTP:
//! - the 32 reference inputs of `testdata/embeddings/` (sentence-transformers
//!   on the same package's files: empty text, unicode, text past the
//!   256-token limit) come back within cosine 0.9999 of the reference, in
//!   OpenAI's shape (float and base64) and in Workers AI's (`shape`,
//!   `data`), and a text's word pieces sent as ids give its vector;
//! - bad input is refused in each API's format, naming the limit, before
//!   anything is computed, and bills nothing;
//! - the usage ledger holds exactly the input tokens the answers reported;
//!   a spent budget refuses; a private flip hides the model in both APIs
//!   at once and a public one brings it back.

mod support;

use serde_json::{Value, json};
use support::platform::{
    bulkhead, credentials, data_dir, get, operator_token, post, succeeds, up_with_embeddings,
};

const SLUG: &str = "@cf/sentence-transformers/all-minilm-l6-v2";

/// The committed reference: each input's text, token ids and vector.
fn reference() -> Vec<(String, Vec<u64>, Vec<f64>)> {
    let text = include_str!("../testdata/embeddings/all-minilm-l6-v2.json");
    let r: Value = serde_json::from_str(text).expect("reference JSON");
    r["inputs"]
        .as_array()
        .expect("inputs")
        .iter()
        .map(|i| {
            let ids = i["ids"].as_array().expect("ids");
            let vector = i["vector"].as_array().expect("vector");
            (
                i["text"].as_str().expect("text").to_owned(),
                ids.iter().filter_map(Value::as_u64).collect(),
                vector.iter().filter_map(Value::as_f64).collect(),
            )
        })
        .collect()
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("a vector")
        .iter()
        .filter_map(Value::as_f64)
        .collect()
}

/// OpenAI's base64 vector: little-endian `f32`s.
fn from_base64(v: &Value) -> Vec<f64> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(v.as_str().expect("base64 text"))
        .expect("base64");
    bytes
        .chunks_exact(4)
        .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
        .collect()
}

#[test]
fn embeddings_match_the_reference_in_both_apis_and_are_metered_budgeted_and_flipped() {
    let dir = data_dir("embeddings");
    // The generating model small, so the embedding worker has the machine.
    let up = up_with_embeddings(
        &dir,
        &[
            "--no-prober",
            "--models",
            "q4_1",
            "--kv-budget-mib",
            "16",
            "--context-window",
            "512",
            "--max-output",
            "64",
        ],
    );
    let creds = credentials(&dir);
    assert_eq!(creds.embedding_model.as_deref(), Some(SLUG));
    let (gw, cp) = (creds.gateway_url.as_str(), creds.control_plane_url.as_str());
    let (a, b) = (&creds.accounts[0], &creds.accounts[1]);
    let run = |account: &str| format!("/client/v4/accounts/{account}/ai/run/{SLUG}");
    let reference = reference();
    let mut billed = 0u64;
    let mut checks = support::Checks::default();

    checks.run(
        "the reference inputs in OpenAI's shape, float and base64",
        || {
            let texts: Vec<&str> = reference.iter().map(|r| r.0.as_str()).collect();
            for format in ["float", "base64"] {
                let body = json!({"model": SLUG, "input": texts, "encoding_format": format});
                let (s, out) = post(gw, "/v1/embeddings", &a.token, &body.to_string());
                assert_eq!(s, 200, "{out}");
                let v: Value = serde_json::from_str(&out).expect("JSON");
                assert_eq!(v["object"], "list");
                assert_eq!(v["model"], SLUG);
                let data = v["data"].as_array().expect("data");
                assert_eq!(data.len(), reference.len());
                for (i, (d, (text, _, want))) in data.iter().zip(&reference).enumerate() {
                    assert_eq!(d["index"], i);
                    assert_eq!(d["object"], "embedding");
                    let got = match format {
                        "float" => floats(&d["embedding"]),
                        _ => from_base64(&d["embedding"]),
                    };
                    assert_eq!(got.len(), 384);
                    let c = cosine(&got, want);
                    assert!(c >= 0.9999, "input {i} ({text:?}): cosine {c}");
                }
                // Billed: every input's tokens as the model reads them
                // (special tokens included, cut at 256).
                let tokens: u64 = reference.iter().map(|r| r.1.len() as u64).sum();
                assert_eq!(v["usage"]["prompt_tokens"], tokens, "{}", v["usage"]);
                assert_eq!(v["usage"]["total_tokens"], tokens);
                billed += tokens;
            }
        },
    );

    checks.run("word pieces as token ids give the text's vector", || {
        let pieces: Vec<&[u64]> = reference
            .iter()
            .filter(|r| r.1.len() > 2 && r.1.len() < 256)
            .take(3)
            .map(|r| &r.1[1..r.1.len() - 1])
            .collect();
        let body = json!({"model": SLUG, "input": pieces, "encoding_format": "float"});
        let (s, out) = post(gw, "/v1/embeddings", &a.token, &body.to_string());
        assert_eq!(s, 200, "{out}");
        let v: Value = serde_json::from_str(&out).expect("JSON");
        let wanted = reference
            .iter()
            .filter(|r| r.1.len() > 2 && r.1.len() < 256);
        for (d, r) in v["data"].as_array().expect("data").iter().zip(wanted) {
            let c = cosine(&floats(&d["embedding"]), &r.2);
            assert!(c >= 0.9999, "{:?}: cosine {c}", r.0);
        }
        billed += v["usage"]["prompt_tokens"].as_u64().expect("usage");
    });

    checks.run(
        "Workers AI's ai/run: text and texts, shape and data",
        || {
            let (s, out) = post(
                gw,
                &run(&a.id),
                &a.token,
                &json!({"text": reference[3].0}).to_string(),
            );
            assert_eq!(s, 200, "{out}");
            let v: Value = serde_json::from_str(&out).expect("JSON");
            assert_eq!(v["success"], true);
            assert_eq!(v["result"]["shape"], json!([1, 384]));
            assert_eq!(v["result"]["pooling"], "mean");
            let c = cosine(&floats(&v["result"]["data"][0]), &reference[3].2);
            assert!(c >= 0.9999, "cosine {c}");
            billed += reference[3].1.len() as u64;
            let texts: Vec<&str> = reference[..5].iter().map(|r| r.0.as_str()).collect();
            let (s, out) = post(
                gw,
                &run(&a.id),
                &a.token,
                &json!({"text": texts}).to_string(),
            );
            assert_eq!(s, 200, "{out}");
            let v: Value = serde_json::from_str(&out).expect("JSON");
            assert_eq!(v["result"]["shape"], json!([5, 384]));
            for (row, r) in v["result"]["data"]
                .as_array()
                .expect("rows")
                .iter()
                .zip(&reference)
            {
                assert!(cosine(&floats(row), &r.2) >= 0.9999, "{:?}", r.0);
            }
            billed += reference[..5].iter().map(|r| r.1.len() as u64).sum::<u64>();
        },
    );

    checks.run(
        "bad input refused in each API's format, naming the limit",
        || {
            let openai = |body: Value, status: u16, needle: &str| {
                let (s, out) = post(gw, "/v1/embeddings", &a.token, &body.to_string());
                assert_eq!(s, status, "{body}: {out}");
                let v: Value = serde_json::from_str(&out).expect("JSON");
                assert_eq!(v["error"]["type"], "invalid_request_error", "{out}");
                assert!(out.contains(needle), "{body}: {out}");
            };
            openai(
                json!({"model": SLUG, "input": "x", "dimensions": 128}),
                400,
                "384",
            );
            openai(
                json!({"model": SLUG, "input": vec!["x"; 257]}),
                400,
                "at most 256",
            );
            // Past OpenAI's own limit: the gateway refuses it, no worker asked.
            openai(
                json!({"model": SLUG, "input": vec!["x"; 2_049]}),
                400,
                "at most 2048",
            );
            openai(
                json!({"model": SLUG, "input": [[999_999]]}),
                400,
                "vocabulary",
            );
            openai(
                json!({"model": SLUG, "input": []}),
                400,
                "must not be empty",
            );
            openai(
                json!({"model": SLUG, "input": [1, "a"]}),
                400,
                "input must be",
            );
            openai(
                json!({"model": SLUG, "input": "x", "encoding_format": "hex"}),
                400,
                "encoding_format",
            );
            openai(
                json!({"model": SLUG, "input": "x", "extra": 1}),
                400,
                "unknown field",
            );
            openai(
                json!({"model": creds.model, "input": "x"}),
                400,
                "embedding model",
            );
            let chat = json!({"model": SLUG, "messages": [{"role": "user", "content": "hi"}]});
            let (s, out) = post(gw, "/v1/chat/completions", &a.token, &chat.to_string());
            assert_eq!(s, 400, "{out}");
            assert!(out.contains("generates no text"), "{out}");
            let workers_ai = |body: Value, needle: &str| {
                let (s, out) = post(gw, &run(&a.id), &a.token, &body.to_string());
                assert_eq!(s, 400, "{body}: {out}");
                let v: Value = serde_json::from_str(&out).expect("JSON");
                assert_eq!(v["success"], false, "{out}");
                assert!(out.contains(needle), "{body}: {out}");
            };
            workers_ai(json!({"text": vec!["x"; 101]}), "at most 100");
            workers_ai(json!({"text": "x", "pooling": "cls"}), "pooling");
            workers_ai(json!({"prompt": "x"}), "unknown field");
            workers_ai(json!({"text": 7}), "text must be");
        },
    );

    let admin = operator_token(dir.to_str().expect("UTF-8 path"), "emb-admin", "admin");
    checks.run(
        "the ledger holds the answered tokens, and nothing for refusals",
        || {
            // Workers report usage within a second or two.
            let ledger = || {
                let rows = get(cp, &format!("/admin/v1/usage?account={}", a.id), &admin);
                rows.as_array()
                    .expect("rows")
                    .iter()
                    .filter(|r| r["model"] == SLUG)
                    .map(|r| {
                        (
                            r["prompt_tokens"].as_u64().unwrap_or(0),
                            r["completion_tokens"].as_u64().unwrap_or(0),
                        )
                    })
                    .fold((0, 0), |(p, c), (rp, rc)| (p + rp, c + rc))
            };
            let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while ledger().0 != billed && std::time::Instant::now() < until {
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            assert_eq!(ledger(), (billed, 0));
        },
    );

    checks.run("a spent budget refuses an embedding call", || {
        succeeds(
            bulkhead(&["budget", &b.id])
                .args(["--daily", "0", "--reason", "embeddings test"])
                .env("BULKHEAD_CONTROL_PLANE_URL", cp)
                .env("BULKHEAD_TOKEN", &admin),
        );
        let body = json!({"model": SLUG, "input": "x"}).to_string();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let (s, out) = loop {
            let (s, out) = post(gw, "/v1/embeddings", &b.token, &body);
            if s != 200 || std::time::Instant::now() > until {
                break (s, out);
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        };
        assert_eq!(s, 429, "{out}");
        assert!(out.contains("budget"), "{out}");
    });

    checks.run(
        "a private flip hides the model in both APIs; public again serves",
        || {
            let flip = |to: &str| {
                succeeds(
                    bulkhead(&["model", to, SLUG, "--reason", "embeddings test"])
                        .env("BULKHEAD_CONTROL_PLANE_URL", cp)
                        .env("BULKHEAD_TOKEN", &creds.operator_token),
                )
            };
            let body = json!({"model": SLUG, "input": "x"}).to_string();
            let text = json!({"text": "x"}).to_string();
            assert!(flip("private").contains("is now private"));
            let (s, out) = post(gw, "/v1/embeddings", &a.token, &body);
            assert_eq!(s, 404, "{out}");
            let (s, out) = post(gw, &run(&a.id), &a.token, &text);
            assert_eq!(s, 400, "{out}");
            assert!(out.contains("5007"), "{out}");
            flip("public");
            let (s, out) = post(gw, "/v1/embeddings", &a.token, &body);
            assert_eq!(s, 200, "{out}");
        },
    );
    drop(up);
    let _ = std::fs::remove_dir_all(&dir);
    checks.finish();
}
