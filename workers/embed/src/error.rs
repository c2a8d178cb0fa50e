//! What can go wrong loading or running the embedding model.

use std::path::PathBuf;

/// Why the embedding model could not be loaded or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EmbedError {
    /// A model file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A configuration file says something this engine does not run.
    #[error("{path}: {message}")]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The tokenizer failed on an input or could not be loaded.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A token id the vocabulary does not have.
    #[error("token id {id} is not in the model's vocabulary of {vocab} tokens")]
    UnknownToken {
        /// The id.
        id: u32,
        /// The vocabulary size.
        vocab: usize,
    },
    /// The tensor library failed (a missing or misshapen weight).
    #[error("model weights: {0}")]
    Tensor(#[from] candle_core::Error),
    /// The embedding thread or its pool could not be started.
    #[error("cannot start the embedding thread: {0}")]
    Threads(String),
    /// The embedding thread has stopped.
    #[error("the embedding thread has stopped")]
    Stopped,
    /// The pass that held the call failed.
    #[error("embedding failed: {0}")]
    Failed(String),
}
