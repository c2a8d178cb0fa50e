//! No stale byte leaves a page: tenant A fills prefill pages with a long
//! prompt and finishes; tenant B's short prompt then reuses A's last page
//! through the disaggregated path (a prefill and a decode worker over real
//! loopback sockets, a recording proxy between them). Nothing A wrote may
//! appear in B's transfer frames or in B's committed pages on decode, and
//! B's page is zero past B's own tokens.

mod support;

use bulkhead_engine::fetch::{Progress, Source, ensure_default_model};
use bulkhead_engine::{Engine, EngineConfig, GenerateRequest, ModelFile, SamplingParams, SeqEvent};
use bulkhead_kv::{TenantId, TransferId};
use bulkhead_node::{DecodeOptions, DecodeWorker, PrefillOptions, PrefillWorker, hello};
use bulkhead_transfer::Message;
use std::collections::HashSet;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::Arc;
use std::time::Duration;

/// Bytes in a compared run.
const RUN: usize = 32;

/// A's prompt fills four 16-token pages exactly; B's five tokens land in one
/// page. The two use disjoint token ids, so no run of their keys or values
/// can be equal by right (a token's layer-0 values depend on the token only).
fn prompts() -> (Vec<u32>, Vec<u32>) {
    let a = (0..64).map(|i| 1_000 + 7 * i).collect();
    let b = vec![20_001, 20_011, 20_021, 20_031, 20_041];
    (a, b)
}

fn greedy(prompt: Vec<u32>) -> GenerateRequest {
    GenerateRequest {
        prompt,
        sampling: SamplingParams::greedy(1),
        stop: Vec::new(),
        ignore_eos: true,
        cache: None,
        class: bulkhead_engine::WorkClass::Interactive,
    }
}

fn hash(run: &[u8]) -> u64 {
    BuildHasherDefault::<DefaultHasher>::default().hash_one(run)
}

/// Every `RUN`-byte window of `bytes` that is not all zero, at every
/// two-byte (element) offset.
fn runs(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    bytes
        .windows(RUN)
        .step_by(2)
        .filter(|w| w.iter().any(|b| *b != 0))
}

#[test]
fn no_byte_of_a_previous_tenants_kv_reaches_another_tenants_frames_or_pages() {
    let path = ensure_default_model(&Source::from_vars(|k| std::env::var_os(k), Progress::Quiet))
        .expect("default model");
    let model = Arc::new(ModelFile::load(&path).expect("model loads"));
    let c = model.config().clone();
    let mut config = EngineConfig::with_budget(16 << 20);
    config.threads = 2;
    let (a_prompt, b_prompt) = prompts();
    let prefill_engine = Arc::new(Engine::start(Arc::clone(&model), &config).expect("prefill"));
    let decode_engine = Arc::new(Engine::start(Arc::clone(&model), &config).expect("decode"));
    // Keep the bytes of every transfer decode commits from now on.
    assert!(decode_engine.take_committed_for_test().is_empty());

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let recorded = rt.block_on(async {
        let tcp = bulkhead_node::TransportKind::Tcp;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let prefill = PrefillWorker::new(
            Arc::clone(&prefill_engine),
            hello(&prefill_engine, &tcp),
            PrefillOptions::new(Duration::from_secs(30), tcp.clone()).with_contexts(
                bulkhead_node::prefill::ContextKeys::new(
                    support::key_ring().verifying(),
                    "@cf/huggingfacetb/smollm2-135m-instruct",
                ),
            ),
        );
        let listener = bulkhead_trust::TlsListener::new(
            listener,
            support::identity(bulkhead_trust::Role::Prefill)
                .acceptor(&[bulkhead_trust::Role::Decode])
                .expect("acceptor"),
        )
        .expect("listener");
        tokio::spawn(prefill.serve(listener));
        let via = support::proxy(addr, Box::new(|m| vec![m]));
        let decode = DecodeWorker::start(
            Arc::clone(&decode_engine),
            hello(&decode_engine, &tcp),
            DecodeOptions {
                prefill: vec![via.addr.clone()],
                transfer_timeout: Duration::from_secs(60),
                ack_timeout: Duration::from_secs(10),
                transport: tcp,
                identity: support::identity(bulkhead_trust::Role::Decode),
                model: "@cf/huggingfacetb/smollm2-135m-instruct".to_owned(),
            },
        );
        assert!(
            decode.ready(Duration::from_secs(20)).await,
            "prefill answers"
        );
        for (tenant, prompt) in [(1, a_prompt.clone()), (2, b_prompt.clone())] {
            let mut h = decode
                .submit(
                    TenantId::new(tenant),
                    greedy(prompt),
                    support::context_for(tenant),
                )
                .expect("admitted");
            loop {
                match h.next().await {
                    Some(SeqEvent::Token { .. }) => {}
                    Some(SeqEvent::Finished { .. }) => break,
                    other => panic!("tenant {tenant}: {other:?}"),
                }
            }
        }
        assert_eq!(via.injected(), 0, "the proxy only records");
        via.recorded()
    });

    // The frames, by transfer in the order they came: A's, then B's.
    let mut order: Vec<TransferId> = Vec::new();
    let mut frames: Vec<Vec<Vec<u8>>> = Vec::new();
    for m in recorded {
        if let Message::Page(h, payload) = m {
            let i = order
                .iter()
                .position(|t| *t == h.transfer)
                .unwrap_or_else(|| {
                    order.push(h.transfer);
                    frames.push(Vec::new());
                    order.len() - 1
                });
            assert_eq!(frames[i].len(), h.slot as usize, "slots in order");
            frames[i].push(payload);
        }
    }
    assert_eq!(frames.len(), 2, "two transfers");
    let (a_frames, b_frames) = (&frames[0], &frames[1]);
    assert_eq!((a_frames.len(), b_frames.len()), (4, 1));

    let a_runs: HashSet<u64> = a_frames.iter().flat_map(|p| runs(p)).map(hash).collect();
    assert!(a_runs.len() > 100_000, "A's KV is there to find");

    // What decode committed for B is exactly what came over the wire.
    let committed = decode_engine.take_committed_for_test();
    assert_eq!(committed.len(), 2, "both transfers committed");
    let (tenant, b_pages) = &committed[1];
    assert_eq!(*tenant, TenantId::new(2));
    assert_eq!(b_pages.len(), 1, "B holds one page (prompt and output)");
    assert_eq!(b_pages[0], b_frames[0], "B's committed page is its frame");

    for (what, bytes) in [("frame", &b_frames[0]), ("committed page", &b_pages[0])] {
        let leaked = bytes
            .windows(RUN)
            .filter(|w| w.iter().any(|b| *b != 0))
            .filter(|w| a_runs.contains(&hash(w)))
            .count();
        assert_eq!(leaked, 0, "B's {what} carries {leaked} runs of A's KV");
    }

    // Past B's five tokens, B's page is zero in every layer, keys and values.
    let (ps, per_head) = (16, c.head_dim * 16);
    let elems: Vec<u16> = b_pages[0]
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .collect();
    let layer_elems = 2 * c.kv_heads * per_head;
    assert_eq!(elems.len(), c.layers * layer_elems);
    let mut nonzero_own = 0;
    for layer in elems.chunks_exact(layer_elems) {
        let (keys, values) = layer.split_at(c.kv_heads * per_head);
        for row in keys.chunks_exact(ps) {
            assert!(
                row[b_prompt.len()..].iter().all(|x| *x == 0),
                "stale key slots"
            );
            nonzero_own += row[..b_prompt.len()].iter().filter(|x| **x != 0).count();
        }
        for head in values.chunks_exact(per_head) {
            let (own, rest) = head.split_at(b_prompt.len() * c.head_dim);
            assert!(rest.iter().all(|x| *x == 0), "stale value slots");
            nonzero_own += own.iter().filter(|x| **x != 0).count();
        }
    }
    assert!(nonzero_own > 0, "B's own tokens are in its page");
}
