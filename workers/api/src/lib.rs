//! Wire types of the worker HTTP API (`POST /v1/generate`, and
//! `POST /v1/embed` on embedding workers: [`embed`]), shared by the
//! workers that serve it and the gateway that calls it. The gateway must not
//! compile the model engine, so these types live here and not in
//! `bulkhead-node`.
//!
//! The request is JSON; the answer is NDJSON, one [`Line`] per line: tokens,
//! then exactly one final line, `Finished` or `Error`. Workers are internal:
//! the tenant travels in the [`context::TenantContext`] the gateway signs
//! after authenticating the account ([`context::CONTEXT_HEADER`]).

pub mod context;
pub mod embed;

/// Most stop strings a request may give.
pub const MAX_STOPS: usize = 4;
/// Longest stop string, in bytes (they are matched by an automaton whose
/// size is their length; the cost per token does not depend on it).
pub const MAX_STOP_BYTES: usize = 1024;

/// Why a request's stop strings are refused, if they are.
pub fn check_stops(stop: &[String]) -> Result<(), String> {
    if stop.len() > MAX_STOPS {
        return Err(format!(
            "stop must be a string or up to {MAX_STOPS} strings"
        ));
    }
    if let Some(s) = stop.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(format!(
            "a stop string is at most {MAX_STOP_BYTES} bytes, not {}",
            s.len()
        ));
    }
    Ok(())
}

use serde::{Deserialize, Serialize};

/// `POST /v1/generate` body: exactly one of `prompt`, `messages`, `raw` and
/// `tokens`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateBody {
    /// A user message, rendered with the model's chat template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// A conversation, rendered with the model's chat template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<Message>>,
    /// Raw text, tokenized as is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<String>,
    /// Token ids, used as is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<Vec<u32>>,
    /// Most tokens to generate.
    #[serde(default = "default_max_tokens")]
    pub max_tokens: usize,
    /// 0 is greedy.
    #[serde(default)]
    pub temperature: f32,
    /// Nucleus sampling mass.
    #[serde(default = "one")]
    pub top_p: f32,
    /// 0 is off.
    #[serde(default)]
    pub top_k: usize,
    /// 1 is off.
    #[serde(default = "one")]
    pub repetition_penalty: f32,
    /// Sampling seed.
    #[serde(default)]
    pub seed: u64,
    /// Stop strings: at most [`MAX_STOPS`], each at most
    /// [`MAX_STOP_BYTES`] bytes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
    /// Keep generating past end-of-sequence.
    #[serde(default)]
    pub ignore_eos: bool,
    /// The model's configured context window, when the caller (the gateway)
    /// knows it: prompt plus `max_tokens` must fit it as well as the
    /// worker's own limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_limit: Option<usize>,
    /// The output's format: `{"type": "json_object"}` or `{"type":
    /// "json_schema", "json_schema": ...}` (see `bulkhead-grammar`),
    /// enforced by constrained sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<serde_json::Value>,
    /// Report each token's log-probability and this many alternatives
    /// (0 to 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<u8>,
    /// Functions the model may call (chat only), and which calls it may or
    /// must make; calls are written in `bulkhead_grammar::tools`' format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Tools>,
}

/// The functions a chat request offers the model (OpenAI's `tools`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tools {
    /// The functions, at least one.
    pub functions: Vec<ToolFunction>,
    /// Which calls the answer may or must make.
    pub choice: ToolChoice,
    /// Whether one answer may make several calls.
    pub parallel: bool,
}

impl Tools {
    /// The functions, as the grammar's tool format describes them.
    pub fn functions(&self) -> Vec<bulkhead_grammar::tools::Function> {
        self.functions
            .iter()
            .map(|f| bulkhead_grammar::tools::Function {
                name: f.name.clone(),
                description: f.description.clone(),
                parameters: f.parameters.clone(),
            })
            .collect()
    }

    /// The grammar the offer holds an answer to (with `none`, text that
    /// opens no call): what the gateway compiles to refuse an offer early
    /// and the worker samples within.
    pub fn grammar(
        &self,
    ) -> Result<std::sync::Arc<bulkhead_grammar::Grammar>, bulkhead_grammar::SchemaError> {
        use bulkhead_grammar::tools::Choice;
        let choice = match &self.choice {
            ToolChoice::None => Choice::None,
            ToolChoice::Auto => Choice::Auto,
            ToolChoice::Required => Choice::Required,
            ToolChoice::Function(name) => Choice::Named(name.clone()),
        };
        bulkhead_grammar::Grammar::tool_calls(&self.functions(), &choice, self.parallel)
    }
}

/// One function on offer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolFunction {
    /// Its name.
    pub name: String,
    /// What it does, for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A JSON Schema of its arguments.
    pub parameters: serde_json::Value,
}

/// OpenAI's `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// No call: the functions are described, the answer is text.
    None,
    /// Text or calls, as the model decides.
    Auto,
    /// At least one call.
    Required,
    /// A call of this function.
    Function(String),
}

/// A call an assistant message made (earlier in a conversation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    /// Its id, which the `tool` message answering it names.
    pub id: String,
    /// The function called.
    pub name: String,
    /// Its arguments, as JSON text.
    pub arguments: String,
}

impl Default for GenerateBody {
    fn default() -> Self {
        GenerateBody {
            prompt: None,
            messages: None,
            raw: None,
            tokens: None,
            max_tokens: default_max_tokens(),
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            repetition_penalty: 1.0,
            seed: 0,
            stop: Vec::new(),
            ignore_eos: false,
            context_limit: None,
            response_format: None,
            logprobs: None,
            tools: None,
        }
    }
}

fn default_max_tokens() -> usize {
    256
}

fn one() -> f32 {
    1.0
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// Its text.
    pub content: String,
    /// An assistant message's calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// A `tool` message: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

/// One NDJSON line of a generate answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Line {
    /// A generated token.
    Token {
        /// Its id.
        token: u32,
        /// Its text (may be empty until a UTF-8 sequence completes).
        text: String,
        /// Its log-probabilities, when asked for.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        logprobs: Option<TokenLogprobs>,
    },
    /// The end: why, the last text and the token counts.
    Finished {
        /// `stop`, `length`, …
        finish_reason: String,
        /// Text held back until the end (a possible stop-string prefix that
        /// turned out not to be one); the answer is every token's text
        /// followed by this.
        text: String,
        /// Token counts.
        usage: Usage,
    },
    /// The end, failed.
    Error {
        /// What failed.
        error: ErrorDetail,
    },
}

/// A generated token's log-probability under the model's distribution and
/// the most likely alternatives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprobs {
    /// Natural log of the token's probability (at least -9999).
    pub logprob: f32,
    /// The token's bytes.
    pub bytes: Vec<u8>,
    /// The most likely tokens, most likely first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top: Vec<TopLogprob>,
}

/// One alternative in [`TokenLogprobs::top`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    /// Its id.
    pub token: u32,
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// Natural log of its probability (at least -9999).
    pub logprob: f32,
}

/// Token counts of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
}

/// A worker error: `{"error": {"code", "message"}}`, plus the numbers
/// behind a refusal for length.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// `context_length_exceeded`, `invalid_request`, `kv_transfer_failed`, …
    pub code: String,
    /// Human message.
    pub message: String,
    /// With `context_length_exceeded` and `prefill_too_long`: the lengths
    /// that did not fit, so the gateway can word the refusal as each API's
    /// clients expect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overflow: Option<Overflow>,
    /// With `prefill_queue_full`: how long until the worker's queue has
    /// room for the prompt, in milliseconds (the gateway tries another
    /// worker first, and passes on a `retry-after` if none has room).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

/// The lengths of a request refused for its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overflow {
    /// The prompt's tokens.
    pub prompt_tokens: usize,
    /// The output tokens asked for.
    pub max_tokens: usize,
    /// The most tokens the deployment takes: the context window, what the
    /// KV pool holds, or (for `prefill_too_long`) the longest prompt it
    /// prefills within its deadline.
    pub limit: usize,
}

/// A worker's error body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip() {
        for text in [
            r#"{"token":42,"text":"hi"}"#,
            r#"{"token":42,"text":"hi","logprobs":{"logprob":-0.5,"bytes":[104,105],"top":[{"token":42,"bytes":[104,105],"logprob":-0.5}]}}"#,
            r#"{"finish_reason":"stop","text":"hi","usage":{"prompt_tokens":3,"completion_tokens":1}}"#,
            r#"{"error":{"code":"kv_transfer_failed","message":"m"}}"#,
            r#"{"error":{"code":"context_length_exceeded","message":"m","overflow":{"prompt_tokens":300,"max_tokens":8,"limit":256}}}"#,
        ] {
            let line: Line = serde_json::from_str(text).unwrap();
            assert_eq!(serde_json::to_string(&line).unwrap(), text);
        }
        let body: GenerateBody = serde_json::from_str(r#"{"prompt":"x"}"#).unwrap();
        assert_eq!(body.max_tokens, 256);
        assert!(serde_json::from_str::<GenerateBody>(r#"{"prompt":"x","bogus":1}"#).is_err());
    }
}
