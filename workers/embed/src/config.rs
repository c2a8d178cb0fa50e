//! The model's configuration, as its files state it: the encoder's
//! shape (`config.json`), the sequence limit (`sentence_bert_config.json`)
//! and the pooling (`1_Pooling/config.json`). Only what this engine runs
//! is accepted: a BERT encoder with absolute positions and exact GELU,
//! mean pooling.

use crate::EmbedError;
use serde::Deserialize;
use std::path::Path;

/// What the engine needs to know about the model.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbedConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Width of the hidden states, and of the vectors.
    pub hidden_size: usize,
    /// Encoder layers.
    pub layers: usize,
    /// Attention heads per layer.
    pub heads: usize,
    /// Width of the feed-forward layer.
    pub intermediate_size: usize,
    /// Epsilon of every layer norm.
    pub layer_norm_eps: f64,
    /// Position embeddings the model has.
    pub max_position_embeddings: usize,
    /// Tokens an input is truncated to, special tokens included.
    pub max_seq_length: usize,
}

#[derive(Deserialize)]
struct BertJson {
    model_type: String,
    vocab_size: usize,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    intermediate_size: usize,
    hidden_act: String,
    layer_norm_eps: f64,
    max_position_embeddings: usize,
    #[serde(default = "absolute")]
    position_embedding_type: String,
}

fn absolute() -> String {
    "absolute".into()
}

#[derive(Deserialize)]
struct SentenceJson {
    max_seq_length: usize,
}

#[derive(Deserialize)]
struct PoolingJson {
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, EmbedError> {
    let text = std::fs::read(path).map_err(|source| EmbedError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_slice(&text).map_err(|e| EmbedError::Config {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

impl EmbedConfig {
    /// Reads and checks the three files under `dir`.
    pub fn read(dir: &Path) -> Result<Self, EmbedError> {
        let path = dir.join("config.json");
        let bert: BertJson = read_json(&path)?;
        let refuse = |message: String| EmbedError::Config {
            path: path.clone(),
            message,
        };
        if bert.model_type != "bert" {
            return Err(refuse(format!(
                "model_type {:?} (bert only)",
                bert.model_type
            )));
        }
        if bert.hidden_act != "gelu" {
            return Err(refuse(format!(
                "hidden_act {:?} (gelu only)",
                bert.hidden_act
            )));
        }
        if bert.position_embedding_type != "absolute" {
            return Err(refuse(format!(
                "position_embedding_type {:?} (absolute only)",
                bert.position_embedding_type
            )));
        }
        if bert.num_attention_heads == 0
            || !bert.hidden_size.is_multiple_of(bert.num_attention_heads)
        {
            return Err(refuse(format!(
                "{} heads do not divide hidden_size {}",
                bert.num_attention_heads, bert.hidden_size
            )));
        }
        let sentence: SentenceJson = read_json(&dir.join("sentence_bert_config.json"))?;
        let pooling_path = dir.join("1_Pooling").join("config.json");
        let pooling: PoolingJson = read_json(&pooling_path)?;
        if !pooling.pooling_mode_mean_tokens
            || pooling.pooling_mode_cls_token
            || pooling.pooling_mode_max_tokens
            || pooling.pooling_mode_mean_sqrt_len_tokens
        {
            return Err(EmbedError::Config {
                path: pooling_path,
                message: "only mean pooling is run".into(),
            });
        }
        if sentence.max_seq_length < 2 || sentence.max_seq_length > bert.max_position_embeddings {
            return Err(EmbedError::Config {
                path: dir.join("sentence_bert_config.json"),
                message: format!(
                    "max_seq_length {} outside 2..={}",
                    sentence.max_seq_length, bert.max_position_embeddings
                ),
            });
        }
        Ok(EmbedConfig {
            vocab_size: bert.vocab_size,
            hidden_size: bert.hidden_size,
            layers: bert.num_hidden_layers,
            heads: bert.num_attention_heads,
            intermediate_size: bert.intermediate_size,
            layer_norm_eps: bert.layer_norm_eps,
            max_position_embeddings: bert.max_position_embeddings,
            max_seq_length: sentence.max_seq_length,
        })
    }
}
