//! Property-based fuzzing of the transfer wire decoder: arbitrary bytes,
//! and valid frames bit-flipped, truncated and extended, never panic the
//! decoder; whatever decodes re-encodes to a frame that decodes the same;
//! every frame the encoder makes round-trips.
//!
//! Cases per property: `PROPTEST_CASES` (256 by default; CI runs that).

use bulkhead_kv::{AdmissionError, Generation, TransferId};
use bulkhead_transfer::wire::{Done, Hello, Message, PageHeader, PrefillRequest};
use proptest::prelude::*;

/// Decodes every frame in `bytes` until the first error or the end.
fn decode_all(bytes: &[u8]) -> Vec<Message> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut r = bytes;
        let mut out = Vec::new();
        while let Ok(m) = Message::read(&mut r).await {
            out.push(m);
        }
        out
    })
}

fn encode(m: &Message) -> Vec<u8> {
    match m {
        Message::Page(h, payload) => {
            let mut b = h.encode(payload.len()).to_vec();
            b.extend_from_slice(payload);
            b
        }
        m => m.encode(),
    }
}

/// Whatever decoded encodes to bytes that decode to one frame with the
/// same encoding (bytes, not values: a decoded logit may be NaN).
fn re_encodes(m: &Message) -> bool {
    let bytes = encode(m);
    let again = decode_all(&bytes);
    again.len() == 1 && encode(&again[0]) == bytes
}

fn transfer() -> impl Strategy<Value = TransferId> {
    any::<u64>().prop_map(TransferId::new)
}

fn frame() -> impl Strategy<Value = Message> {
    prop_oneof![
        (
            any::<[u64; 4]>(),
            any::<[u32; 4]>(),
            any::<u8>(),
            any::<u16>(),
            any::<u8>()
        )
            .prop_map(
                |(w, n, dtype_bytes, version, transport)| Message::Hello(Hello {
                    version,
                    model: w[0],
                    layers: n[0],
                    kv_heads: n[1],
                    head_dim: n[2],
                    page_size: n[3],
                    dtype_bytes,
                    context_window: w[1],
                    pool_tokens: w[2],
                    prefill_tokens: w[3],
                    transport,
                })
            ),
        (
            transfer(),
            any::<(u64, u64)>(),
            proptest::collection::vec(any::<u32>(), 0..64),
            proptest::collection::vec(any::<u64>(), 0..16),
            // The wire carries no traceparent as an empty one: `Some("")` is not canonical.
            proptest::option::of("[0-9a-f-]{1,60}"),
            "[A-Za-z0-9._-]{0,300}",
            any::<[u8; 32]>(),
            proptest::option::of((any::<[u8; 16]>(), proptest::option::of(any::<[u8; 16]>())))
        )
            .prop_map(
                |(
                    transfer,
                    (tenant, max_tokens),
                    prompt,
                    slots,
                    traceparent,
                    context,
                    key,
                    cache,
                )| {
                    Message::Prefill(PrefillRequest {
                        transfer,
                        tenant,
                        max_tokens,
                        prompt,
                        slots: slots.into_iter().map(Generation::from_wire).collect(),
                        context,
                        traceparent,
                        key,
                        cache: cache.map(|(own, shared)| {
                            bulkhead_kv::CacheScope::new(
                                bulkhead_kv::Namespace::from_digest(own),
                                shared.map(bulkhead_kv::Namespace::from_digest),
                            )
                        }),
                    })
                }
            ),
        (transfer(), any::<(usize, usize, usize)>()).prop_map(|(transfer, (p, m, l))| {
            Message::Rejected {
                transfer,
                error: AdmissionError::PoolCapacityExceeded {
                    prompt_tokens: p,
                    max_tokens: m,
                    limit: l,
                },
            }
        }),
        (transfer(), any::<(usize, u64, u64)>()).prop_map(|(transfer, (p, q, r))| {
            Message::Rejected {
                transfer,
                error: AdmissionError::PrefillQueueFull {
                    prompt_tokens: p,
                    queued_ms: q,
                    retry_after_ms: r,
                },
            }
        }),
        (
            transfer(),
            any::<(u32, u64, u64)>(),
            any::<[u8; 16]>(),
            proptest::collection::vec(any::<u8>(), 0..512)
        )
            .prop_map(
                |(transfer, (slot, g, checksum), mac, payload)| Message::Page(
                    PageHeader {
                        transfer,
                        slot,
                        generation: Generation::from_wire(g),
                        checksum,
                        mac,
                    },
                    payload
                )
            ),
        (
            transfer(),
            any::<(u64, u64)>(),
            proptest::collection::vec(-1e6f32..1e6, 0..32),
            any::<[u8; 16]>()
        )
            .prop_map(
                |(transfer, (tokens, digest), logits, mac)| Message::Done(Done {
                    transfer,
                    tokens,
                    digest,
                    logits,
                    mac,
                })
            ),
        transfer().prop_map(|transfer| Message::Release { transfer }),
        transfer().prop_map(|transfer| Message::Abort { transfer }),
        transfer().prop_map(|transfer| Message::AbortAck { transfer }),
        (transfer(), any::<(u64, u64)>()).prop_map(|(transfer, (computed, place))| {
            Message::Progress {
                transfer,
                computed,
                place,
            }
        }),
    ]
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic_and_what_decodes_re_encodes(
        bytes in proptest::collection::vec(any::<u8>(), 0..2048)
    ) {
        for m in decode_all(&bytes) {
            prop_assert!(re_encodes(&m), "{:?}", m);
        }
    }

    #[test]
    fn every_frame_round_trips(frames in proptest::collection::vec(frame(), 1..6)) {
        let bytes: Vec<u8> = frames.iter().flat_map(encode).collect();
        prop_assert_eq!(decode_all(&bytes), frames);
    }

    #[test]
    fn damaged_frames_never_panic(
        m in frame(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
        cut in any::<prop::sample::Index>(),
        tail in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut bytes = encode(&m);
        for (at, x) in flips {
            let i = at.index(bytes.len());
            bytes[i] ^= x;
        }
        let keep = cut.index(bytes.len() + 1);
        bytes.truncate(keep);
        bytes.extend_from_slice(&tail);
        for m in decode_all(&bytes) {
            prop_assert!(re_encodes(&m), "{:?}", m);
        }
    }
}
