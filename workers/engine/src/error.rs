//! Typed errors of the engine.

use bulkhead_kv::{AdmissionError, OwnerViolation};

/// Why a model file could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// Reading the file failed.
    #[error("cannot read model file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The GGUF container is malformed.
    #[error("invalid GGUF file: {0}")]
    Gguf(String),
    /// A required metadata key or tensor is missing or has the wrong type.
    #[error("model file lacks {0}")]
    Missing(String),
    /// The architecture is not LLaMA.
    #[error("unsupported architecture {0:?} (only llama is supported)")]
    Architecture(String),
    /// A tensor has an unexpected shape.
    #[error("tensor {name} has shape {found:?}, expected {expected:?}")]
    Shape {
        /// Tensor name.
        name: String,
        /// Its shape.
        found: Vec<usize>,
        /// The expected shape.
        expected: Vec<usize>,
    },
    /// The tokenizer metadata could not be turned into a tokenizer.
    #[error("invalid tokenizer metadata: {0}")]
    Tokenizer(String),
    /// The chat template does not parse.
    #[error("invalid chat template: {0}")]
    ChatTemplate(String),
}

/// Why a running request failed. Clients see only the `Display` text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// A KV page the sequence tried to use is not its own: the request is
    /// failed, the page quarantined, and no token is produced from it.
    #[error("KV integrity check failed: the request was stopped")]
    Integrity(OwnerViolation),
    /// The engine thread is gone.
    #[error("the engine has shut down")]
    Shutdown,
    /// The prefill worker's own admission refused the request (its limits
    /// changed since the decode worker admitted it). Terminal; nothing was
    /// transferred.
    #[error(transparent)]
    Rejected(AdmissionError),
    /// The KV transfer failed a check or was aborted; the landing pages
    /// were never made readable and nothing was decoded from them.
    #[error("KV transfer failed: {0}")]
    Transfer(TransferFault),
    /// No prefill worker could take the request.
    #[error("no prefill worker is available: {0}")]
    Unavailable(String),
}

/// Why a KV transfer failed, as far as the client is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransferFault {
    /// A page frame's CRC did not match its payload (only in a benchmark
    /// without tags).
    #[error("a page checksum did not match")]
    Checksum,
    /// A page or the end carried a tag the transfer's key did not make:
    /// corrupted, or a frame the prefill worker did not send.
    #[error("a transfer frame's tag did not match (corrupted or forged)")]
    Tag,
    /// A frame named a slot, generation or length the grant does not allow.
    #[error("a page frame did not match the granted slots")]
    Slot,
    /// The same slot arrived twice.
    #[error("a page slot arrived twice")]
    Duplicate,
    /// Fewer pages or tokens than granted, or a wrong transfer digest.
    #[error("the transfer was incomplete or its digest did not match")]
    Incomplete,
    /// The peer aborted the transfer.
    #[error("the prefill worker aborted the transfer")]
    PeerAborted,
    /// The transfer took longer than its deadline.
    #[error("the transfer timed out")]
    Timeout,
    /// The connection to the peer was lost.
    #[error("the connection to the prefill worker was lost")]
    ConnectionLost,
}

/// An engine configuration that cannot work with the model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The page size is zero or absurdly large.
    #[error("page size {0} is out of range (1 to 256 tokens)")]
    PageSize(usize),
    /// The KV budget does not hold a single page.
    #[error("a KV budget of {budget} bytes holds no page ({page_bytes} bytes each)")]
    NoPages {
        /// The budget.
        budget: usize,
        /// Bytes of one page.
        page_bytes: usize,
    },
    /// A test-only switch in a build without the test hooks.
    #[error(transparent)]
    Hooks(#[from] crate::hooks::HooksDisabled),
    /// The compute gate file cannot be opened or locked.
    #[error("compute gate {path}: {why}")]
    ComputeGate {
        /// The gate file.
        path: std::path::PathBuf,
        /// Why, as the OS said it.
        why: String,
    },
}
