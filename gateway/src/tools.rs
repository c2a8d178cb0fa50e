//! Tool calling at the edge: OpenAI's `tools`, `tool_choice` and
//! `parallel_tool_calls` (and Workers AI's flat `{name, description,
//! parameters}` tools) read into the worker's [`Tools`], checked by
//! compiling their grammar here, so that a schema Bulkhead cannot enforce
//! is refused by name before any worker is called; earlier calls of a
//! conversation read back; and each call an answer makes given its id.

use crate::errors::GatewayError;
use bulkhead_grammar::{SchemaError, tools};
use bulkhead_worker_api::{ToolCall, ToolChoice, ToolFunction, Tools};
use serde_json::{Value, json};

fn bad(m: impl Into<String>) -> GatewayError {
    GatewayError::BadInput(m.into())
}

/// The functions a request offers and how it lets the model call them;
/// `None` when it offers none.
pub(crate) fn offer(
    list: Option<&Value>,
    choice: Option<&Value>,
    parallel: Option<&Value>,
) -> Result<Option<Tools>, GatewayError> {
    let list = match list {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(a)) => a.as_slice(),
        Some(_) => return Err(bad("tools must be an array")),
    };
    let choice = match choice {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            _ => {
                return Err(bad(
                    "tool_choice must be none, auto, required or a function",
                ));
            }
        }),
        Some(v) => match v.pointer("/function/name").and_then(Value::as_str) {
            Some(name) if v.get("type").and_then(Value::as_str) == Some("function") => {
                Some(ToolChoice::Function(name.to_owned()))
            }
            _ => {
                return Err(bad(
                    "tool_choice must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                ));
            }
        },
    };
    let parallel = match parallel {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("parallel_tool_calls must be a boolean")),
    };
    if list.is_empty() {
        return match choice {
            None | Some(ToolChoice::None) => Ok(None),
            Some(_) => Err(bad("tool_choice requires tools")),
        };
    }
    let functions = list
        .iter()
        .enumerate()
        .map(|(i, t)| function(i, t))
        .collect::<Result<Vec<_>, _>>()?;
    let offered = Tools {
        functions,
        choice: choice.unwrap_or(ToolChoice::Auto),
        parallel,
    };
    check(&offered)?;
    Ok(Some(offered))
}

/// One entry of `tools`: OpenAI's `{"type": "function", "function":
/// {...}}` or Workers AI's flat `{name, description, parameters}`.
fn function(i: usize, t: &Value) -> Result<ToolFunction, GatewayError> {
    let f = match t.get("type").and_then(Value::as_str) {
        Some("function") => t.get("function"),
        Some(other) => {
            return Err(GatewayError::UnsupportedValue {
                param: format!("tools[{i}].type"),
                detail: format!(
                    "only function tools are served, not {:?}",
                    other.chars().take(64).collect::<String>()
                ),
            });
        }
        None => Some(t),
    }
    .filter(|f| f.is_object())
    .ok_or_else(|| bad(format!("tools[{i}] must be a function")))?;
    let name = f
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad(format!("tools[{i}].function.name is required")))?;
    let description = match f.get("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(d)) => Some(d.clone()),
        Some(_) => {
            return Err(bad(format!(
                "tools[{i}].function.description must be a string"
            )));
        }
    };
    let parameters = match f.get("parameters") {
        None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
        Some(p) => p.clone(),
    };
    Ok(ToolFunction {
        name: name.to_owned(),
        description,
        parameters,
    })
}

/// Compiles the offer's grammar (the worker compiles it again): what cannot
/// be enforced is refused here, naming it.
fn check(t: &Tools) -> Result<(), GatewayError> {
    match t.grammar() {
        Ok(_) => Ok(()),
        Err(SchemaError::Unsupported(detail)) => Err(GatewayError::UnsupportedValue {
            param: "tools".to_owned(),
            detail,
        }),
        Err(SchemaError::Invalid(m)) => Err(bad(m)),
    }
}

/// Whether an answer to `body` may make calls (and its text must be split
/// into content and calls).
pub(crate) fn may_call(body: &bulkhead_worker_api::GenerateBody) -> bool {
    body.tools
        .as_ref()
        .is_some_and(|t| t.choice != ToolChoice::None)
}

/// An assistant message's `tool_calls`, in OpenAI's shape.
pub(crate) fn history_calls(v: &Value) -> Result<Vec<ToolCall>, GatewayError> {
    let list = v
        .as_array()
        .ok_or_else(|| bad("an assistant message's tool_calls must be an array"))?;
    list.iter()
        .map(|c| {
            let field = |p: &str| c.pointer(p).and_then(Value::as_str);
            match (
                field("/id"),
                field("/function/name"),
                c.pointer("/function/arguments"),
            ) {
                (Some(id), Some(name), Some(args)) => {
                    tools::check_name(name).map_err(|e| bad(e.to_string()))?;
                    let arguments = match args {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    // Shown to the model as written: it must be an object.
                    if !serde_json::from_str::<Value>(&arguments).is_ok_and(|a| a.is_object()) {
                        return Err(bad(format!(
                            "the arguments of tool call {:?} must be a JSON object",
                            id.chars().take(64).collect::<String>()
                        )));
                    }
                    Ok(ToolCall {
                        id: id.to_owned(),
                        name: name.to_owned(),
                        arguments,
                    })
                }
                _ => Err(bad(
                    "each tool call needs an id, function.name and function.arguments",
                )),
            }
        })
        .collect()
}

/// A fresh call id, as OpenAI's look: `call_` and 24 characters. Ids
/// name calls within one conversation: without randomness they still
/// differ, by a process-wide count and the time.
pub(crate) fn call_id() -> String {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut b = [0u8; 12];
    if getrandom::fill(&mut b).is_err() {
        let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        b[..8].copy_from_slice(&n.to_le_bytes());
        b[8..].copy_from_slice(&t.to_le_bytes());
    }
    format!("call_{}", hex::encode(b))
}

/// A call in OpenAI's shape (`arguments` as JSON text).
pub(crate) fn openai_call(id: &str, call: &tools::Call) -> Value {
    json!({
        "id": id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments}
    })
}

/// A call's arguments as an object, as Workers AI gives them (the text
/// is an object: the splitter reads back only calls whose arguments are).
pub(crate) fn arguments_object(call: &tools::Call) -> Value {
    serde_json::from_str(&call.arguments).unwrap_or_else(|_| json!({}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])
    }

    #[test]
    fn offers_read_both_shapes_and_default_to_auto_and_parallel() {
        let t = offer(Some(&weather()), None, None).unwrap().unwrap();
        assert_eq!(t.choice, ToolChoice::Auto);
        assert!(t.parallel);
        let flat = json!([{"name": "get_weather", "description": "d",
            "parameters": {"type": "object", "properties": {}}}]);
        let t = offer(
            Some(&flat),
            Some(&json!({"type": "function", "function": {"name": "get_weather"}})),
            Some(&json!(false)),
        )
        .unwrap()
        .unwrap();
        assert_eq!(t.choice, ToolChoice::Function("get_weather".into()));
        assert_eq!(t.functions[0].description.as_deref(), Some("d"));
        assert_eq!(
            offer(Some(&json!([])), Some(&json!("none")), None).unwrap(),
            None
        );
    }

    #[test]
    fn what_cannot_be_enforced_or_makes_no_sense_is_refused() {
        let refused = |tools: Value, choice: Value| offer(Some(&tools), Some(&choice), None);
        assert!(matches!(
            refused(weather(), json!({"type": "function", "function": {"name": "other"}})),
            Err(GatewayError::BadInput(m)) if m.contains("not in tools")
        ));
        assert!(matches!(
            refused(json!([{"type": "function", "function": {"name": "f",
                "parameters": {"type": "object", "properties": {"a": {"oneOf": []}}}}}]), json!("auto")),
            Err(GatewayError::UnsupportedValue { param, detail }) if param == "tools" && detail.contains("oneOf")
        ));
        assert!(matches!(
            refused(json!([{"type": "code_interpreter"}]), json!("auto")),
            Err(GatewayError::UnsupportedValue { .. })
        ));
        assert!(matches!(
            refused(json!([]), json!("required")),
            Err(GatewayError::BadInput(_))
        ));
        assert!(matches!(
            refused(weather(), json!("sometimes")),
            Err(GatewayError::BadInput(_))
        ));
    }

    #[test]
    fn earlier_calls_read_back_with_arguments_as_text() {
        let calls = history_calls(&json!([{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]))
        .unwrap();
        assert_eq!(calls[0].arguments, "{\"city\":\"Oslo\"}");
        assert!(history_calls(&json!([{"id": "x"}])).is_err());
    }
}
