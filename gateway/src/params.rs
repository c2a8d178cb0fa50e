//! Request fields the gateway does not act on. Both APIs refuse a field
//! that asks for something Bulkhead does not do, with 400
//! `unsupported_parameter` naming it, instead of answering as if it had
//! been applied (an agent that asked for a tool call must not get plain
//! text). A field passes when its value asks for nothing.
//!
//! Values that ask for nothing: `null`, an explicit default, `user` and similar
//! labels, and a cache salt (the platform picks cache namespaces from the
//! authenticated account, never from the request).

use crate::errors::GatewayError;
use serde_json::{Value, json};

/// Refuses the first field of `other` that asks for something Bulkhead does not
/// do. A field passes only when its value asks for nothing: the default a
/// client library may send explicitly (`"logprobs": false`,
/// `"frequency_penalty": 0`, `"response_format": {"type": "text"}`), or one
/// that has no effect on an answer by nature (`user`, `store`,
/// `metadata`, a cache salt or key: the platform picks cache namespaces).
pub(crate) fn refuse_unsupported(
    other: &serde_json::Map<String, Value>,
) -> Result<(), GatewayError> {
    for (key, value) in other {
        let harmless = match key.as_str() {
            // `null` is the same as leaving the field out.
            _ if value.is_null() => true,
            "user" | "metadata" => true,
            // vLLM's per-request prefix-cache salt (and the like): the
            // platform chooses the cache namespace from the account, so a
            // client's salt can change nothing, not even the answer.
            "cache_salt" | "prompt_cache_key" => value.is_string(),
            "store" | "parallel_tool_calls" | "echo" => *value == Value::Bool(false),
            "frequency_penalty" | "presence_penalty" => value.as_f64() == Some(0.0),
            "logit_bias" => value.as_object().is_some_and(serde_json::Map::is_empty),
            "tools" | "functions" => value.as_array().is_some_and(Vec::is_empty),
            "tool_choice" | "function_call" => value == "none",
            "modalities" => *value == json!(["text"]),
            "best_of" => value.as_i64() == Some(1),
            "suffix" => value == "",
            _ => false,
        };
        if !harmless {
            return Err(GatewayError::Unsupported(key.chars().take(64).collect()));
        }
    }
    Ok(())
}

/// The worker's `response_format` for a client's: `None` for plain text;
/// a schema Bulkhead cannot enforce is refused naming what it cannot, and a
/// malformed one is bad input. Both APIs take OpenAI's shapes
/// (`json_object`; `json_schema` with `name`/`schema`/`strict`) and Workers
/// AI's (`json_schema` holding the schema itself).
pub(crate) fn response_format(v: Option<&Value>) -> Result<Option<Value>, GatewayError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    match bulkhead_grammar::Grammar::from_response_format(v) {
        Ok(None) => Ok(None),
        Ok(Some(_)) => Ok(Some(v.clone())),
        Err(bulkhead_grammar::SchemaError::Unsupported(detail)) => {
            Err(GatewayError::UnsupportedValue {
                param: "response_format".to_owned(),
                detail,
            })
        }
        Err(bulkhead_grammar::SchemaError::Invalid(m)) => {
            Err(GatewayError::BadInput(format!("response_format: {m}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(body: Value) -> Option<String> {
        let Value::Object(o) = body else {
            panic!("an object")
        };
        match refuse_unsupported(&o) {
            Ok(()) => None,
            Err(GatewayError::Unsupported(p)) => Some(p),
            Err(e) => panic!("{e:?}"),
        }
    }

    #[test]
    fn a_field_passes_only_when_it_asks_for_nothing() {
        for ok in [
            json!({}),
            json!({"user": "u-1", "store": false, "tools": []}),
            json!({"cache_salt": "the-victims-salt", "prompt_cache_key": "k"}),
            json!({"frequency_penalty": 0, "presence_penalty": 0.0, "logit_bias": {}}),
            json!({"tool_choice": "none"}),
            json!({"lora": null, "anything": null, "modalities": ["text"]}),
        ] {
            assert_eq!(verdict(ok.clone()), None, "{ok}");
        }
        for (bad, name) in [
            (json!({"tools": [{"type": "function"}]}), "tools"),
            (json!({"tool_choice": "auto"}), "tool_choice"),
            (json!({"frequency_penalty": 0.5}), "frequency_penalty"),
            (json!({"logit_bias": {"50256": -100}}), "logit_bias"),
            (json!({"lora": "my-adapter"}), "lora"),
            (json!({"max_tokns": 8}), "max_tokns"),
        ] {
            assert_eq!(verdict(bad.clone()).as_deref(), Some(name), "{bad}");
        }
        // A client's key is echoed bounded.
        let long = "k".repeat(1000);
        assert_eq!(verdict(json!({ long: 1 })).map(|p| p.len()), Some(64));
    }
}
