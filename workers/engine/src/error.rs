//! Typed errors of the engine.

use bulkhead_kv::OwnerViolation;

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
}
