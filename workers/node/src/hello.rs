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
}

impl HelloCheck {
    /// A sentence for logs and errors.
    pub fn describe(self) -> &'static str {
        match self {
            HelloCheck::Compatible => "compatible",
            HelloCheck::Version => "the peer speaks another protocol version",
            HelloCheck::Model => "the peer serves a different model file",
            HelloCheck::Layout => "the peer's KV page layout differs",
        }
    }
}

/// The hello of a worker serving `info` from a model file with fingerprint `model`.
pub fn hello(info: &EngineInfo, model: u64, dtype_bytes: u8) -> Hello {
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
    }
}

/// Compares a peer's hello with ours.
pub fn check_peer(ours: &Hello, peer: &Hello) -> HelloCheck {
    if peer.version != ours.version {
        HelloCheck::Version
    } else if peer.model != ours.model {
        HelloCheck::Model
    } else if (
        peer.layers,
        peer.kv_heads,
        peer.head_dim,
        peer.page_size,
        peer.dtype_bytes,
    ) != (
        ours.layers,
        ours.kv_heads,
        ours.head_dim,
        ours.page_size,
        ours.dtype_bytes,
    ) {
        HelloCheck::Layout
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
