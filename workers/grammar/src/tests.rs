//! Data-driven checks: each case is a grammar, then texts it must accept
//! whole and texts it must refuse (at some byte, or as incomplete).

use super::*;
use serde_json::{Value, json};

fn grammar(schema: &Value) -> std::sync::Arc<Grammar> {
    Grammar::from_schema(schema).unwrap()
}

/// `Some(true)`: accepted and may end; `Some(false)`: accepted so far but
/// incomplete; `None`: refused at some byte.
fn verdict(g: &std::sync::Arc<Grammar>, text: &str) -> Option<bool> {
    let mut m = Matcher::new(g.clone());
    m.feed(text.as_bytes()).then(|| m.can_end())
}

fn check(g: &std::sync::Arc<Grammar>, good: &[&str], partial: &[&str], bad: &[&str]) {
    for t in good {
        assert_eq!(verdict(g, t), Some(true), "should accept {t:?}");
    }
    for t in partial {
        assert_eq!(verdict(g, t), Some(false), "should be incomplete: {t:?}");
    }
    for t in bad {
        assert_eq!(verdict(g, t), None, "should refuse {t:?}");
    }
}

#[test]
fn json_mode_takes_any_object_and_nothing_else() {
    let g = Grammar::json_object();
    check(
        &g,
        &[
            "{}",
            r#"{"a": 1, "b": [true, null, -0.5e+3, "x\n\u00e9"], "c": {"d": {}}}"#,
            "{ \"k\" : \"v\" }",
            "{\"é\": \"ü\"}",
        ],
        &["{", r#"{"a": "#, r#"{"a": [1, "#, r#"{"a": 12"#],
        &[
            "[]",
            "\"x\"",
            "1",
            "{}}",
            "{} ",
            r#"{"a" 1}"#,
            r#"{"a": 01}"#,
            r#"{"a": tru }"#,
            r#"{"a": "\q"}"#,
            "{\"a\": \"\u{1}\"}",
            r#"{"a": 1,}"#,
            r#"{,}"#,
            r#"{"a": -}"#,
            r#"{"a": 1.}"#,
        ],
    );
    // Whitespace runs are bounded.
    assert_eq!(verdict(&g, &format!("{{{}}}", " ".repeat(16))), Some(true));
    assert_eq!(verdict(&g, &format!("{{{}}}", " ".repeat(17))), None);
}

#[test]
fn object_schemas_name_their_keys_and_require_theirs() {
    let g = grammar(&json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 5},
            "age": {"type": "integer"},
            "tags": {"type": "array", "items": {"enum": ["a", "bc"]}, "maxItems": 2}
        },
        "required": ["name", "age"],
        "additionalProperties": false
    }));
    check(
        &g,
        &[
            r#"{"name": "Ann", "age": 3}"#,
            r#"{"age": -3, "name": "", "tags": []}"#,
            r#"{"name":"abcde","age":0,"tags":["bc","a"]}"#,
        ],
        &[
            r#"{"name": "Ann""#,
            r#"{"na"#,
            r#"{"name": "Ann", "age": 3"#,
        ],
        &[
            r#"{"name": "Ann"}"#,
            r#"{"nom": "Ann", "age": 3}"#,
            r#"{"name": "abcdef", "age": 3}"#,
            r#"{"name": "Ann", "age": 3.5}"#,
            r#"{"name": "Ann", "age": 1e3}"#,
            r#"{"name": "Ann", "name": "Bob", "age": 3}"#,
            r#"{"name": 5, "age": 3}"#,
            r#"{"name": "Ann", "age": 3, "tags": ["b"]}"#,
            r#"{"name": "Ann", "age": 3, "tags": ["a", "a", "a"]}"#,
            r#"{"name": "Ann", "age": 3, "x": 1}"#,
        ],
    );
    // Every key is refused once all are used.
    assert_eq!(verdict(&g, r#"{"name": "A", "age": 1, "tags": [], "#), None);
}

#[test]
fn top_level_values_of_every_type() {
    check(
        &grammar(&json!({"type": "integer"})),
        &["0", "-12"],
        &["-"],
        &["1.5", "01", "\"1\""],
    );
    check(
        &grammar(&json!({"type": "number"})),
        &["0.25", "-1e-7", "3E+2"],
        &["1e", "1."],
        &["+1", ".5"],
    );
    check(
        &grammar(&json!({"type": "boolean"})),
        &["true", "false"],
        &["tr"],
        &["null", "t1"],
    );
    check(
        &grammar(&json!({"enum": [1, 12, "x", null]})),
        &["1", "12", "\"x\"", "null"],
        &["\"", "nu"],
        &["2", "123", "\"y\""],
    );
    check(
        &grammar(&json!({"const": {"a": [1]}})),
        &[r#"{"a":[1]}"#],
        &[r#"{"a":"#],
        &[r#"{"a": [1]}"#],
    );
    check(
        &grammar(&json!({"type": "array", "items": {"type": "integer"}, "minItems": 1})),
        &["[1]", "[1, 2, 3]"],
        &["[1,"],
        &["[]", "[1 2]", "[1.0]"],
    );
    check(
        &grammar(&json!({})),
        &["{}", "[]", "\"s\"", "0", "null"],
        &[],
        &["}", "nul "],
    );
    // A nested number ends at the byte after it; a top-level one may end
    // at the end of the output.
    check(
        &grammar(&json!({"type": "array", "items": {"enum": [1, 12]}})),
        &["[1]", "[12]", "[1, 12]"],
        &[],
        &["[123]"],
    );
}

#[test]
fn schemas_outside_the_subset_are_refused_by_name() {
    for (schema, named) in [
        (json!({"type": "string", "pattern": "^a$"}), "`pattern`"),
        (json!({"anyOf": [{"type": "string"}]}), "`anyOf`"),
        (json!({"$ref": "#/defs/a"}), "`$ref`"),
        (json!({"type": ["string", "null"]}), "a list of types"),
        (
            json!({"type": "object", "properties": {"a": {"format": "date"}}}),
            "schema.properties.a: keyword `format`",
        ),
        (json!({"type": "integer", "minimum": 0}), "`minimum`"),
        (
            json!({"type": "integer", "maxLength": 3}),
            "`maxLength` on a integer",
        ),
    ] {
        match Grammar::from_schema(&schema) {
            Err(SchemaError::Unsupported(m)) => assert!(m.contains(named), "{m} for {schema}"),
            other => panic!("{schema}: {other:?}"),
        }
    }
    for bad in [
        json!({"type": "object", "required": ["x"]}),
        json!({"type": "strung"}),
        json!({"enum": []}),
        json!(3),
        json!({"type": "string", "minLength": 3, "maxLength": 2}),
    ] {
        assert!(
            matches!(Grammar::from_schema(&bad), Err(SchemaError::Invalid(_))),
            "{bad}"
        );
    }
}

#[test]
fn response_formats_of_both_apis() {
    assert_eq!(
        Grammar::from_response_format(&json!({"type": "text"})),
        Ok(None)
    );
    let object = Grammar::from_response_format(&json!({"type": "json_object"}))
        .unwrap()
        .unwrap();
    assert_eq!(verdict(&object, "{}"), Some(true));
    // OpenAI wraps the schema; Workers AI gives it as is.
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": false});
    for format in [
        json!({"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": schema}}),
        json!({"type": "json_schema", "json_schema": schema}),
    ] {
        let g = Grammar::from_response_format(&format).unwrap().unwrap();
        assert_eq!(verdict(&g, r#"{"n": 1}"#), Some(true), "{format}");
        assert_eq!(verdict(&g, r#"{"m": 1}"#), None, "{format}");
    }
    assert!(Grammar::from_response_format(&json!({"type": "yaml"})).is_err());
    assert!(Grammar::from_response_format(&json!({"type": "json_schema"})).is_err());
}

#[test]
fn nesting_is_bounded() {
    let g = Grammar::json_object();
    let deep = format!("{}{}", "{\"a\":".repeat(63), "{");
    assert_eq!(verdict(&g, &deep), Some(false));
    assert_eq!(verdict(&g, &format!("{deep}\"a\":{{")), None);
}

#[test]
fn names_values_and_sizes_past_the_stated_limits_are_refused_by_name() {
    use crate::{MAX_LITERAL_BYTES, MAX_NAME_BYTES, MAX_NODES};
    let object = |name: &str| json!({"type": "object", "properties": {name: {"type": "string"}}});
    assert!(Grammar::from_schema(&object(&"k".repeat(MAX_NAME_BYTES))).is_ok());
    let e = Grammar::from_schema(&object(&"k".repeat(60_000))).expect_err("a long name");
    assert!(
        e.to_string().contains("property name of 60000 bytes"),
        "{e}"
    );
    // An enum value's JSON text includes its quotes.
    let value = |n: usize| json!({"enum": ["x".repeat(n)]});
    assert!(Grammar::from_schema(&value(MAX_LITERAL_BYTES - 2)).is_ok());
    let e = Grammar::from_schema(&value(MAX_LITERAL_BYTES)).expect_err("a long value");
    assert!(e.to_string().contains("enum or const value"), "{e}");
    let e = Grammar::from_schema(&json!({"const": "y".repeat(5_000)})).expect_err("const");
    assert!(e.to_string().contains("at most 1024"), "{e}");
    // Many subschemas, each small, nested only two deep.
    let wide = |n: usize| {
        let props: serde_json::Map<String, Value> = (0..60)
            .map(|i| {
                let inner: serde_json::Map<String, Value> = (0..n)
                    .map(|j| (format!("p{j}"), json!({"type": "integer"})))
                    .collect();
                (
                    format!("o{i}"),
                    json!({"type": "object", "properties": inner}),
                )
            })
            .collect();
        json!({"type": "object", "properties": props})
    };
    assert!(Grammar::from_schema(&wide(10)).is_ok());
    let e = Grammar::from_schema(&wide(60)).expect_err("3,600 subschemas");
    assert!(
        e.to_string()
            .contains(&format!("more than {MAX_NODES} subschemas")),
        "{e}"
    );
}

fn weather_tools() -> Vec<tools::Function> {
    vec![
        tools::Function {
            name: "get_weather".to_owned(),
            description: Some("The weather in a city".to_owned()),
            parameters: json!({
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
                "additionalProperties": false
            }),
        },
        tools::Function {
            name: "get".to_owned(),
            description: None,
            parameters: json!({"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}),
        },
    ]
}

#[test]
fn a_required_call_is_one_call_whose_arguments_match_its_function() {
    let g = Grammar::tool_calls(&weather_tools(), &tools::Choice::Required, false).unwrap();
    let one = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>";
    check(
        &g,
        &[
            one,
            "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"url\": \"x\"}}\n</tool_call>",
        ],
        &[
            "<tool_call>\n",
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
        ],
        &[
            "Sure! ",
            " <tool_call>",
            // Arguments against the other function's schema, or none.
            "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"url\": 5",
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"days\": 1}}",
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\", \"x\": 1",
            "<tool_call>\n{\"name\": \"set\"",
            // Not parallel: nothing after the call.
            &format!("{one}\n"),
        ],
    );
    assert!(!Matcher::new(g.clone()).can_end(), "a call is required");
    let mut m = Matcher::new(g);
    assert!(m.feed(one.as_bytes()));
    assert!(m.is_done(), "one call and the output is over");
}

#[test]
fn a_named_choice_allows_only_that_function_and_parallel_calls_repeat() {
    let g = Grammar::tool_calls(
        &weather_tools(),
        &tools::Choice::Named("get".to_owned()),
        true,
    )
    .unwrap();
    let call = "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"url\": \"a\"}}\n</tool_call>";
    let two = format!(
        "{call}<tool_call>\n{{\"name\": \"get\", \"arguments\": {{\"url\": \"b\"}}}}\n</tool_call>"
    );
    check(
        &g,
        &[call, &two],
        &[&format!("{call}<tool")],
        &[
            "<tool_call>\n{\"name\": \"get_weather\"",
            &format!("{call} "),
            &format!("{call}\nmore text"),
            &format!("{call}\n<tool_call>"),
        ],
    );
    let mut m = Matcher::new(g);
    assert!(m.feed(two.as_bytes()));
    assert!(!m.is_done(), "parallel calls may go on");
    assert!(
        Grammar::tool_calls(&weather_tools(), &tools::Choice::Named("nope".into()), true).is_err()
    );
}

#[test]
fn an_auto_choice_allows_text_or_calls() {
    let g = Grammar::tool_calls(&weather_tools(), &tools::Choice::Auto, true).unwrap();
    check(
        &g,
        &[
            "It is sunny.",
            "<tool",
            "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"url\": \"a\"}}\n</tool_call>",
            "<tool_calls are not this>",
            // Text, then calls after a newline.
            "Let me look.\n<tool_call>\n{\"name\": \"get\", \"arguments\": {\"url\": \"a\"}}\n</tool_call>",
            "a\n\n<tool_call>\n{\"name\": \"get\", \"arguments\": {\"url\": \"a\"}}\n</tool_call>",
            "A line\n<tool_calls are not this>",
        ],
        &[
            "<tool_call>\n{\"name\": \"get\"",
            "Let me look.\n<tool_call>\n",
        ],
        &[
            "<tool_call>\n{\"name\": \"other\"",
            "<tool_call>\nhello",
            // Once calls open after text, they are held like any.
            "Text\n<tool_call>\nhello",
            "Text\n<tool_call>\n{\"name\": \"get\", \"arguments\": {\"url\": 1",
        ],
    );
    assert!(Matcher::new(g).can_end(), "an empty answer is text");
}

#[test]
fn tool_definitions_are_checked() {
    let mut bad_name = weather_tools();
    bad_name[0].name = "get weather".to_owned();
    let mut not_object = weather_tools();
    not_object[1].parameters = json!({"type": "string"});
    let mut twice = weather_tools();
    twice[1].name = "get_weather".to_owned();
    // A schema without a type is an object's: no parameters.
    let mut untyped = weather_tools();
    untyped[1].parameters = json!({});
    let g = Grammar::tool_calls(&untyped, &tools::Choice::Named("get".into()), false).unwrap();
    check(
        &g,
        &["<tool_call>\n{\"name\": \"get\", \"arguments\": {}}\n</tool_call>"],
        &[],
        &["<tool_call>\n{\"name\": \"get\", \"arguments\": 1"],
    );
    let mut unknown = weather_tools();
    unknown[0].parameters = json!({"type": "object", "properties": {"a": {"anyOf": []}}});
    // Values at the top would stand for the arguments object itself.
    let mut listed = weather_tools();
    listed[0].parameters = json!({"type": "object", "enum": [1]});
    // With no call possible, schemas are not enforced, so not refused.
    assert!(Grammar::tool_calls(&unknown, &tools::Choice::None, true).is_ok());
    for (tools, want) in [
        (bad_name, "function name"),
        (not_object, "type object"),
        (twice, "twice"),
        (unknown, "anyOf"),
        (listed, "top of the parameters"),
        (Vec::new(), "at least one"),
    ] {
        let e = Grammar::tool_calls(&tools, &tools::Choice::Auto, false).unwrap_err();
        assert!(e.to_string().contains(want), "{e} lacks {want}");
    }
}

#[test]
fn the_splitter_reads_back_what_the_grammar_allows_as_it_streams() {
    let args = json!({"city": "Paris"});
    let text = tools::calls_text([("get_weather", &args), ("get", &json!({"url": "u"}))]);
    let g = Grammar::tool_calls(&weather_tools(), &tools::Choice::Required, true).unwrap();
    assert_eq!(verdict(&g, &text), Some(true), "{text}");
    // Fed a byte at a time, or whole, the same calls come out.
    for step in [1, 3, text.len()] {
        let mut s = tools::Splitter::new();
        let mut pieces = Vec::new();
        for chunk in text.as_bytes().chunks(step) {
            pieces.extend(s.push(std::str::from_utf8(chunk).unwrap()));
        }
        pieces.extend(s.finish());
        assert_eq!(
            pieces,
            vec![
                tools::Piece::Call(tools::Call {
                    name: "get_weather".into(),
                    arguments: r#"{"city":"Paris"}"#.into()
                }),
                tools::Piece::Call(tools::Call {
                    name: "get".into(),
                    arguments: r#"{"url":"u"}"#.into()
                }),
            ],
            "chunks of {step}"
        );
    }
    // Text is text, and held text that could open a call comes out at the end.
    assert_eq!(tools::split("Hello"), ("Hello".to_owned(), vec![]));
    assert_eq!(tools::split("<tool"), ("<tool".to_owned(), vec![]));
    // A call cut short by the token limit is not lost: it is text.
    let cut = "<tool_call>\n{\"name\": \"get\", \"argu";
    assert_eq!(tools::split(cut), (cut.to_owned(), vec![]));
    let mut s = tools::Splitter::new();
    assert!(s.push("<tool_").is_empty(), "held");
    assert_eq!(s.push("x"), vec![tools::Piece::Text("<tool_x".into())]);
    assert_eq!(s.push("y"), vec![tools::Piece::Text("y".into())]);
    // Text, then calls: both, in order, however the text is cut; an
    // ending that could open calls is held, then given back as text.
    let mixed = "Let me look.\n<tool_call>\n{\"name\": \"get\", \"arguments\": {\"url\": \"u\", \"n\": 123456789012345678901234}}\n</tool_call>";
    for step in [1, 5, mixed.len()] {
        let mut s = tools::Splitter::new();
        let mut pieces = Vec::new();
        for chunk in mixed.as_bytes().chunks(step) {
            pieces.extend(s.push(std::str::from_utf8(chunk).unwrap()));
        }
        pieces.extend(s.finish());
        let text: String = pieces
            .iter()
            .filter_map(|p| match p {
                tools::Piece::Text(t) => Some(t.as_str()),
                tools::Piece::Call(_) => None,
            })
            .collect();
        assert_eq!(text, "Let me look.", "chunks of {step}");
        // The arguments as written: order and digits kept.
        assert_eq!(
            pieces.last(),
            Some(&tools::Piece::Call(tools::Call {
                name: "get".into(),
                arguments: r#"{"url": "u", "n": 123456789012345678901234}"#.into()
            }))
        );
    }
    let mut s = tools::Splitter::new();
    assert_eq!(s.push("Hi\n<tool"), vec![tools::Piece::Text("Hi".into())]);
    assert_eq!(s.finish(), Some(tools::Piece::Text("\n<tool".into())));
}

#[test]
fn a_none_choice_allows_text_that_does_not_open_a_call() {
    let g = Grammar::tool_calls(&weather_tools(), &tools::Choice::None, true).unwrap();
    check(
        &g,
        &[
            "It is sunny.",
            "<tool",
            "<tool_call",
            "<tool_calls",
            "Sure: <tool_call>\n{",
        ],
        &[],
        &[
            "<tool_call>",
            "<tool_call>\n",
            "Text\n<tool_call>",
            "Text\n<tool_call>\n",
        ],
    );
}
