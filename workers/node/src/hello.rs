//! What a worker tells its peer about itself, and whether two workers can
//! hand KV pages to each other.
//!
//! Two workers are compatible when their protocol version, model
//! fingerprint (`ModelFile::fingerprint`: the xxh3 of the model file, taken
//! once at load; a model converted at load has another), page layout and
//! transport agree ([`check_peer`]). A hello also announces the peer's
//! capacity, which only ever narrows this side's limits ([`peer_limits`]).

use bulkhead_engine::Engine;
use bulkhead_kv::{Capacity, KvDtype};
use bulkhead_transfer::Hello;
use bulkhead_transfer::wire::VERSION;

/// Whether a peer's hello matches ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HelloCheck {
    /// Same protocol, model and page layout.
    Compatible,
    /// Different protocol version.
    Version,
    /// A different model file.
    Model,
    /// A different page layout (layers, heads, head size, page size, dtype).
    Layout,
    /// The other end moves pages over another transport.
    Transport,
}

/// How a worker moves KV pages.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TransportKind {
    /// Frames on the TCP connection (the default).
    #[default]
    Tcp,
    /// RDMA SENDs over ibverbs on `device` (or the first one); needs the
    /// `rdma` cargo feature and an RDMA device.
    Rdma {
        /// The device name.
        device: Option<String>,
    },
}

impl TransportKind {
    /// Checks, before any port is bound, that this transport can work here.
    /// RDMA without the feature or without a device is a clear error.
    pub fn check(&self) -> Result<(), String> {
        match self {
            TransportKind::Tcp => Ok(()),
            #[cfg(feature = "rdma")]
            TransportKind::Rdma { device } => {
                let names = bulkhead_transfer::rdma::devices().map_err(|e| e.to_string())?;
                match device {
                    None if names.is_empty() => Err("no RDMA device found on this host".into()),
                    Some(d) if !names.contains(d) => Err(format!(
                        "RDMA device {d:?} not found (devices here: {names:?})"
                    )),
                    _ => Ok(()),
                }
            }
            #[cfg(not(feature = "rdma"))]
            TransportKind::Rdma { .. } => Err(
                "this build has no RDMA support: rebuild with `cargo build --features rdma`".into(),
            ),
        }
    }

    fn wire(&self) -> u8 {
        match self {
            TransportKind::Tcp => bulkhead_transfer::wire::TRANSPORT_TCP,
            TransportKind::Rdma { .. } => bulkhead_transfer::wire::TRANSPORT_RDMA,
        }
    }
}

impl HelloCheck {
    /// A sentence for logs and errors.
    pub fn describe(self) -> &'static str {
        match self {
            HelloCheck::Compatible => "compatible",
            HelloCheck::Version => "the peer speaks another protocol version",
            HelloCheck::Model => "the peer serves a different model file",
            HelloCheck::Layout => "the peer's KV page layout differs",
            HelloCheck::Transport => "the peer moves pages over another transport (tcp or rdma)",
        }
    }
}

/// The hello of a worker serving `engine`, moving pages over `transport`.
pub fn hello(engine: &Engine, transport: &TransportKind) -> Hello {
    let info = engine.info();
    Hello {
        version: VERSION,
        model: engine.model().fingerprint(),
        layers: info.model.layers as u32,
        kv_heads: info.model.kv_heads as u32,
        head_dim: info.model.head_dim as u32,
        page_size: info.limits.page_size() as u32,
        dtype_bytes: match info.kv_dtype {
            KvDtype::F16 => 2,
            KvDtype::F32 => 4,
        },
        context_window: info.limits.context_window() as u64,
        pool_tokens: info.limits.pool_tokens() as u64,
        prefill_tokens: info.limits.prefill_tokens() as u64,
        transport: transport.wire(),
    }
}

/// Compares a peer's hello with ours.
pub fn check_peer(ours: &Hello, peer: &Hello) -> HelloCheck {
    let layout = |h: &Hello| (h.layers, h.kv_heads, h.head_dim, h.page_size, h.dtype_bytes);
    if peer.version != ours.version {
        HelloCheck::Version
    } else if peer.model != ours.model {
        HelloCheck::Model
    } else if layout(peer) != layout(ours) {
        HelloCheck::Layout
    } else if peer.transport != ours.transport {
        HelloCheck::Transport
    } else {
        HelloCheck::Compatible
    }
}

/// The capacity a peer's hello announces (it only ever narrows ours).
pub fn peer_limits(peer: &Hello) -> Capacity {
    Capacity {
        context_window: usize::try_from(peer.context_window).unwrap_or(usize::MAX),
        pool_tokens: usize::try_from(peer.pool_tokens).unwrap_or(usize::MAX),
        page_size: peer.page_size as usize,
        prefill_tokens: usize::try_from(peer.prefill_tokens).unwrap_or(usize::MAX),
    }
}

/// Bytes of one KV page on the wire (keys and values of every layer).
pub(crate) fn page_bytes(h: &Hello) -> usize {
    (h.layers * 2 * h.kv_heads * h.head_dim * h.page_size) as usize * h.dtype_bytes as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use bulkhead_transfer::wire::{TRANSPORT_RDMA, TRANSPORT_TCP};

    #[test]
    fn every_difference_that_breaks_a_transfer_is_refused() {
        let ours = Hello {
            version: VERSION,
            model: 7,
            layers: 30,
            kv_heads: 3,
            head_dim: 64,
            page_size: 16,
            dtype_bytes: 2,
            context_window: 8192,
            pool_tokens: 46_592,
            prefill_tokens: 3_100,
            transport: TRANSPORT_TCP,
        };
        // Capacity may differ (admission takes the smaller one).
        let smaller = Hello {
            pool_tokens: 1_024,
            context_window: 2_048,
            prefill_tokens: 900,
            ..ours
        };
        assert_eq!(check_peer(&ours, &smaller), HelloCheck::Compatible);
        let cases = [
            (
                Hello {
                    version: VERSION + 1,
                    ..ours
                },
                HelloCheck::Version,
            ),
            (Hello { model: 8, ..ours }, HelloCheck::Model),
            (
                Hello {
                    page_size: 32,
                    ..ours
                },
                HelloCheck::Layout,
            ),
            (
                Hello {
                    dtype_bytes: 4,
                    ..ours
                },
                HelloCheck::Layout,
            ),
            (
                Hello {
                    kv_heads: 4,
                    ..ours
                },
                HelloCheck::Layout,
            ),
            (
                Hello {
                    transport: TRANSPORT_RDMA,
                    ..ours
                },
                HelloCheck::Transport,
            ),
        ];
        for (peer, want) in cases {
            assert_eq!(check_peer(&ours, &peer), want, "{peer:?}");
        }
    }
}
