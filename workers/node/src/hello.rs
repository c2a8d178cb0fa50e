//! What a worker tells its peer about itself, and whether two workers can
//! hand KV pages to each other.

use bulkhead_engine::EngineInfo;
use bulkhead_kv::Limits;
use bulkhead_transfer::Hello;
use bulkhead_transfer::wire::VERSION;
use std::path::Path;

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

/// The hello of a worker serving `info` from a model file with fingerprint
/// `model`, moving pages over `transport`.
pub fn hello(info: &EngineInfo, model: u64, dtype_bytes: u8, transport: &TransportKind) -> Hello {
    Hello {
        version: VERSION,
        model,
        layers: info.model.layers as u32,
        kv_heads: info.model.kv_heads as u32,
        head_dim: info.model.head_dim as u32,
        page_size: info.limits.page_size as u32,
        dtype_bytes,
        context_window: info.limits.context_window as u64,
        pool_tokens: info.limits.pool_tokens as u64,
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

/// The admission limits a peer's hello announces.
pub fn peer_limits(peer: &Hello) -> Limits {
    Limits {
        context_window: usize::try_from(peer.context_window).unwrap_or(usize::MAX),
        pool_tokens: usize::try_from(peer.pool_tokens).unwrap_or(usize::MAX),
        page_size: peer.page_size as usize,
    }
}

/// xxh3-64 of a model file: both roles must load the same bytes.
pub fn model_fingerprint(path: &Path) -> std::io::Result<u64> {
    let bytes = std::fs::read(path)?;
    Ok(xxhash_rust::xxh3::xxh3_64(&bytes))
}
