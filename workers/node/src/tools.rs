//! Tool calling on the worker: a conversation with functions on offer
//! rendered in the default format of `bulkhead_grammar::tools` (the
//! functions described in the system message, earlier calls written as
//! the model is held to write them, and each `tool` message's result in a
//! `<tool_response>` naming its function, consecutive results in one user
//! turn, so templates that insist on user and assistant turns take them).
//! The grammar that holds the answer to calls is `Tools::grammar`, the one
//! the gateway compiles too.
//!
//! Every chat template is given the default format, also one with tool
//! syntax of its own: the grammar produces that one format, and a model
//! shown earlier calls in another would be shown one thing and held to
//! write another.

use bulkhead_engine::ChatMessage;
use bulkhead_grammar::tools;
use bulkhead_worker_api::{Message, Tools};
use serde_json::Value;

/// A conversation's messages as the chat template is given them.
pub(crate) fn chat_messages(
    messages: &[Message],
    tools: Option<&Tools>,
) -> Result<Vec<ChatMessage>, String> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len() + 1);
    // The function each earlier call named, by call id.
    let mut called: std::collections::HashMap<&str, &str> = std::collections::HashMap::new();
    let mut last_was_result = false;
    for m in messages {
        if m.role == "tool" {
            let name = m
                .tool_call_id
                .as_deref()
                .and_then(|id| called.get(id).copied());
            let response = tools::response_text(name, &m.content);
            match out.last_mut() {
                Some(prev) if last_was_result => {
                    prev.content.push('\n');
                    prev.content.push_str(&response);
                }
                _ => out.push(ChatMessage {
                    role: "user".to_owned(),
                    content: response,
                }),
            }
            last_was_result = true;
            continue;
        }
        last_was_result = false;
        for c in &m.tool_calls {
            called.insert(c.id.as_str(), c.name.as_str());
        }
        let mut content = m.content.clone();
        if !m.tool_calls.is_empty() {
            if m.role != "assistant" {
                return Err("only assistant messages make tool calls".to_owned());
            }
            let calls = m
                .tool_calls
                .iter()
                .map(|c| {
                    tools::check_name(&c.name).map_err(|e| e.to_string())?;
                    let args: Value = serde_json::from_str(&c.arguments)
                        .ok()
                        .filter(Value::is_object)
                        .ok_or_else(|| {
                            format!(
                                "the arguments of tool call {:?} must be a JSON object",
                                c.id.chars().take(64).collect::<String>()
                            )
                        })?;
                    Ok((c.name.as_str(), args))
                })
                .collect::<Result<Vec<_>, String>>()?;
            let text = tools::calls_text(calls.iter().map(|(n, a)| (*n, a)));
            if !content.is_empty() {
                content.push('\n');
            }
            content.push_str(&text);
        }
        out.push(ChatMessage {
            role: m.role.clone(),
            content,
        });
    }
    if let Some(t) = tools {
        let described = tools::system_text(&t.functions());
        match out.first_mut() {
            Some(first) if first.role == "system" => {
                first.content = format!("{}\n\n{described}", first.content);
            }
            _ => out.insert(
                0,
                ChatMessage {
                    role: "system".to_owned(),
                    content: described,
                },
            ),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bulkhead_worker_api::{ToolCall, ToolChoice, ToolFunction};
    use serde_json::json;

    fn msg(role: &str, content: &str) -> Message {
        Message {
            role: role.to_owned(),
            content: content.to_owned(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    fn offer() -> Tools {
        Tools {
            functions: vec![ToolFunction {
                name: "get_weather".to_owned(),
                description: Some("Weather by city".to_owned()),
                parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
            }],
            choice: ToolChoice::Auto,
            parallel: false,
        }
    }

    #[test]
    fn a_follow_up_shows_the_model_its_call_in_the_format_it_is_held_to() {
        let mut call = msg("assistant", "");
        call.tool_calls = vec![ToolCall {
            id: "call_1".to_owned(),
            name: "get_weather".to_owned(),
            arguments: "{\"city\":\"Paris\"}".to_owned(),
        }];
        let mut result = msg("tool", "22 C, sunny");
        result.tool_call_id = Some("call_1".to_owned());
        let rendered = chat_messages(
            &[msg("user", "Weather in Paris?"), call, result],
            Some(&offer()),
        )
        .unwrap();
        assert_eq!(rendered[0].role, "system");
        assert!(rendered[0].content.contains("\"get_weather\""));
        assert!(rendered[0].content.contains("Weather by city"));
        let written = &rendered[2].content;
        let (text, calls) = tools::split(written);
        assert_eq!(text, "");
        assert_eq!(calls[0].arguments, r#"{"city":"Paris"}"#);
        // What the model is shown is what the grammar lets it write.
        let g = offer().grammar().unwrap();
        let mut m = bulkhead_grammar::Matcher::new(g);
        assert!(m.feed(written.as_bytes()) && m.can_end(), "{written}");
        // The result, in a user turn, naming the function it came from.
        assert_eq!(rendered[3].role, "user");
        assert_eq!(
            rendered[3].content,
            "<tool_response>\n{\"name\": \"get_weather\", \"content\": \"22 C, sunny\"}\n</tool_response>"
        );
    }

    #[test]
    fn consecutive_results_share_one_user_turn() {
        let mut call = msg("assistant", "");
        for (id, city) in [("a", "Oslo"), ("b", "Rome")] {
            call.tool_calls.push(ToolCall {
                id: id.to_owned(),
                name: "get_weather".to_owned(),
                arguments: format!("{{\"city\": \"{city}\"}}"),
            });
        }
        let mut results = Vec::new();
        for (id, text) in [("a", "cold"), ("b", "warm")] {
            let mut r = msg("tool", text);
            r.tool_call_id = Some(id.to_owned());
            results.push(r);
        }
        let mut convo = vec![msg("user", "Oslo and Rome?"), call];
        convo.extend(results);
        let rendered = chat_messages(&convo, Some(&offer())).unwrap();
        let roles: Vec<&str> = rendered.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        assert_eq!(rendered[3].content.matches("<tool_response>").count(), 2);
        assert!(rendered[3].content.contains(r#""content": "warm""#));
    }

    #[test]
    fn a_system_message_keeps_its_text_and_gains_the_functions() {
        let rendered = chat_messages(
            &[msg("system", "Be brief."), msg("user", "hi")],
            Some(&offer()),
        )
        .unwrap();
        assert_eq!(rendered.len(), 2);
        assert!(rendered[0].content.starts_with("Be brief.\n\n"));
        let plain = chat_messages(&[msg("user", "hi")], None).unwrap();
        assert_eq!(plain.len(), 1, "no tools, no system text");
    }

    #[test]
    fn malformed_calls_in_a_conversation_are_refused() {
        let mut bad = msg("assistant", "");
        bad.tool_calls = vec![ToolCall {
            id: "c".to_owned(),
            name: "get_weather".to_owned(),
            arguments: "not json".to_owned(),
        }];
        assert!(
            chat_messages(&[bad.clone()], None)
                .unwrap_err()
                .contains("JSON object")
        );
        bad.role = "user".to_owned();
        assert!(
            chat_messages(&[bad], None)
                .unwrap_err()
                .contains("assistant")
        );
    }
}
