//! `POST /v1/embed` on an embedding worker: inputs in, one vector per
//! input out, with the tokens computed (what the call is billed for).
//!
//! The call carries a [`crate::context::TenantContext`] whose audience is
//! [`crate::context::Audience::Embed`]: a statement signed for generation
//! is refused here, and one signed for embeddings is refused by
//! `/v1/generate`. Errors are the worker's [`crate::ErrorBody`].

use serde::{Deserialize, Serialize};

/// One input: text, tokenized as the model's tokenizer says, or token ids
/// of the model's vocabulary, used as they are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EmbedInput {
    /// Text.
    Text(String),
    /// Token ids.
    Tokens(Vec<u32>),
}

/// `POST /v1/embed` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbedBody {
    /// The inputs, in order.
    pub inputs: Vec<EmbedInput>,
    /// The vectors' width the client expects: refused before anything is
    /// computed unless it is the model's (vectors are never cut).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dimensions: Option<u64>,
}

/// `POST /v1/embed` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbedAnswer {
    /// One vector per input, in order, each of the model's dimensions
    /// (L2-normalised where the model says so).
    pub vectors: Vec<Vec<f32>>,
    /// Tokens computed, every input's special tokens included, after
    /// truncation to the model's limit.
    pub prompt_tokens: u64,
    /// Inputs cut at the model's limit (their tail was not embedded).
    pub truncated: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_text_or_token_ids() {
        let body: EmbedBody = serde_json::from_str(r#"{"inputs":["a b",[101,102]]}"#).unwrap();
        assert_eq!(
            body.inputs,
            vec![
                EmbedInput::Text("a b".into()),
                EmbedInput::Tokens(vec![101, 102])
            ]
        );
        for bad in [
            r#"{"inputs":[1]}"#,
            r#"{"inputs":[["a"]]}"#,
            r#"{"inputs":["a"],"extra":1}"#,
            r#"{"inputs":[[-1]]}"#,
            r#"{"inputs":["a"],"dimensions":-1}"#,
        ] {
            assert!(serde_json::from_str::<EmbedBody>(bad).is_err(), "{bad}");
        }
    }
}
