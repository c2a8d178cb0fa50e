//! Tool calls: the default text format a model writes them in, the grammar
//! that holds its output to that format (and each call's arguments to the
//! function's `parameters` schema), the system text that describes the
//! functions to a model whose chat template has no tool syntax, and the
//! splitter that turns output text back into content and calls.
//!
//! The format (Hermes-style, as many open models were trained on):
//!
//! ```text
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Paris"}}
//! </tool_call>
//! ```
//!
//! Several calls follow one another, each [`OPEN`] right after the last
//! [`CLOSE`]. With `auto`, text may come first: calls then open after a
//! newline ([`AFTER_TEXT`]). Earlier calls in
//! a conversation are shown to the model in the same format, so what it
//! reads is what it is held to write.

use crate::schema::{Grammar, Node, SchemaError, base, compile, invalid, push, unsupported};
use serde_json::{Value, json};
use std::sync::Arc;

/// What opens a call.
pub const OPEN: &str = "<tool_call>\n";
/// What closes a call.
pub const CLOSE: &str = "\n</tool_call>";
/// What opens calls after text (with [`Choice::Auto`]): a newline, then
/// [`OPEN`]. From there on the output is calls, as at the start.
pub const AFTER_TEXT: &str = "\n<tool_call>\n";
/// What opens a call after another: [`OPEN`] right after the [`CLOSE`]
/// (no newline between: after a call's close a model is then held to
/// open another or end its turn, which it does far more often than it
/// would after a newline).
pub const NEXT: &str = OPEN;
/// The most calls one answer may make.
pub const MAX_CALLS: u32 = 16;
/// The most functions one request may offer.
pub const MAX_FUNCTIONS: usize = 128;
/// The longest function name (OpenAI's limit).
pub const MAX_FUNCTION_NAME: usize = 64;

/// A function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Function {
    /// `^[A-Za-z0-9_-]{1,64}$`.
    pub name: String,
    /// What it does, for the model.
    pub description: Option<String>,
    /// A JSON Schema of its arguments (an object).
    pub parameters: Value,
}

/// Which calls the output may or must make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// Plain text only, which may not begin with a call's opening: the
    /// functions are described, and earlier calls shown, but none is made.
    None,
    /// Plain text or calls: the model decides.
    Auto,
    /// At least one call, of any function.
    Required,
    /// A call of this function.
    Named(String),
}

/// Checks a function name: letters, digits, `_` and `-`, 1 to 64 of them.
pub fn check_name(name: &str) -> Result<(), SchemaError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_FUNCTION_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(SchemaError::Invalid(format!(
            "a function name must be 1 to {MAX_FUNCTION_NAME} letters, digits, underscores or dashes, not {:?}",
            name.chars().take(80).collect::<String>()
        )))
    }
}

/// The text before a call's arguments.
fn call_head(name: &str) -> String {
    format!("{{\"name\": {}, \"arguments\": ", Value::from(name))
}

/// One call as the model writes it (without [`OPEN`] and [`CLOSE`]).
pub fn call_text(name: &str, arguments: &Value) -> String {
    format!("{}{arguments}}}", call_head(name))
}

/// Calls as the model writes them, [`OPEN`] to the last [`CLOSE`].
pub fn calls_text<'a>(calls: impl IntoIterator<Item = (&'a str, &'a Value)>) -> String {
    calls
        .into_iter()
        .map(|(name, args)| format!("{OPEN}{}{CLOSE}", call_text(name, args)))
        .collect()
}

/// A function's result as the model is shown it: in `<tool_response>`
/// tags, naming the function when the call it answers is known.
pub fn response_text(name: Option<&str>, content: &str) -> String {
    let body = match name {
        Some(n) => format!(
            "{{\"name\": {}, \"content\": {}}}",
            Value::from(n),
            Value::from(content)
        ),
        None => format!("{{\"content\": {}}}", Value::from(content)),
    };
    format!("<tool_response>\n{body}\n</tool_response>")
}

/// The system text that tells a model without tool syntax in its chat
/// template which functions it has and how to call them.
pub fn system_text(functions: &[Function]) -> String {
    let mut s = String::from(
        "You may call functions to help with the user's request. \
         Their signatures, one JSON object per line:\n<tools>\n",
    );
    for f in functions {
        let mut sig = json!({"name": f.name, "parameters": f.parameters});
        if let Some(d) = &f.description {
            sig["description"] = Value::from(d.as_str());
        }
        s.push_str(&json!({"type": "function", "function": sig}).to_string());
        s.push('\n');
    }
    s.push_str(
        "</tools>\nTo call a function, answer with a JSON object of its name and \
         arguments between <tool_call> and </tool_call> tags:\n<tool_call>\n\
         {\"name\": <function-name>, \"arguments\": <arguments-object>}\n</tool_call>\n\
         Results come back between <tool_response> and </tool_response> tags.",
    );
    s
}

impl Grammar {
    /// The output an answer with `functions` on offer may give: calls in
    /// the default format whose arguments match each function's
    /// `parameters` (one call unless `parallel`), or, with
    /// [`Choice::Auto`], plain text instead; with [`Choice::None`], plain
    /// text only.
    pub fn tool_calls(
        functions: &[Function],
        choice: &Choice,
        parallel: bool,
    ) -> Result<Arc<Grammar>, SchemaError> {
        if functions.is_empty() {
            return Err(invalid("tools", "must list at least one function"));
        }
        if functions.len() > MAX_FUNCTIONS {
            return Err(unsupported(
                "tools",
                &format!("more than {MAX_FUNCTIONS} functions"),
            ));
        }
        let mut nodes = base();
        let mut alts = Vec::new();
        for (i, f) in functions.iter().enumerate() {
            check_name(&f.name)?;
            if functions[..i].iter().any(|g| g.name == f.name) {
                return Err(invalid(
                    "tools",
                    &format!("function {:?} is listed twice", f.name),
                ));
            }
            if let Choice::Named(n) = choice
                && *n != f.name
            {
                continue;
            }
            // No call can be made: the schemas are shown to the model,
            // never enforced, so none is refused for what it uses.
            if *choice == Choice::None {
                continue;
            }
            let at = format!("tools[{i}].function.parameters");
            // Arguments are an object: a schema that says no type (`{}`,
            // as clients send for a function without parameters) is one.
            let mut params = f.parameters.clone();
            match params.as_object_mut() {
                Some(o) if !o.contains_key("type") => {
                    o.insert("type".to_owned(), Value::from("object"));
                }
                Some(o) if o.get("type").and_then(Value::as_str) == Some("object") => {}
                _ => return Err(invalid(&at, "must be a schema of type object")),
            }
            // Values listed at the top would stand for the object itself:
            // the arguments must be an object the schema's properties say.
            if params.get("enum").is_some() || params.get("const").is_some() {
                return Err(unsupported(
                    &at,
                    "`enum` or `const` at the top of the parameters",
                ));
            }
            let args = compile(&mut nodes, &params, &at, 0)?;
            alts.push((call_head(&f.name).into_bytes(), args));
        }
        if let Choice::Named(n) = choice
            && alts.is_empty()
        {
            return Err(invalid(
                "tool_choice",
                &format!("names {:?}, which is not in tools", n),
            ));
        }
        let call = push(
            &mut nodes,
            Node::Tagged {
                alts,
                close: b"}".to_vec(),
            },
        );
        let root = push(
            &mut nodes,
            Node::Calls {
                call,
                max: match choice {
                    Choice::None => 0,
                    _ if parallel => MAX_CALLS,
                    _ => 1,
                },
                free: matches!(choice, Choice::None | Choice::Auto),
            },
        );
        Ok(Arc::new(Grammar { nodes, root }))
    }
}

/// A call read back from output text.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// The function's name.
    pub name: String,
    /// Its arguments, the JSON object's text exactly as the model wrote it
    /// (key order, number digits and all).
    pub arguments: String,
}

/// A piece of output: text for the client, or a whole call.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    /// Content.
    Text(String),
    /// A complete call.
    Call(Call),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The output so far is a prefix of [`OPEN`]: text or a call.
    Undecided,
    /// Plain text: it passes as it comes, but for an ending that could
    /// begin [`AFTER_TEXT`].
    Text,
    /// Inside a call, after its [`OPEN`].
    InCall,
    /// After a call's [`CLOSE`]: [`NEXT`] or the end.
    Between,
}

/// Splits output text, fed as it streams, into content and calls. Text that
/// could still open a call is held until it is clear; nothing is dropped:
/// what does not parse as a call, and what is left at the end, comes out as
/// text.
#[derive(Debug, Clone)]
pub struct Splitter {
    buf: String,
    state: State,
    /// The text that opened the call being read ([`OPEN`] or
    /// [`AFTER_TEXT`]), given back with it if it does not parse.
    opening: &'static str,
}

impl Default for Splitter {
    fn default() -> Self {
        Self::new()
    }
}

impl Splitter {
    /// A splitter at the start of an output.
    pub fn new() -> Splitter {
        Splitter {
            buf: String::new(),
            state: State::Undecided,
            opening: OPEN,
        }
    }

    /// Takes the next text of the output; the pieces now known.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        let mut out = Vec::new();
        self.buf.push_str(text);
        loop {
            match self.state {
                // At the start, or after a call: another call opens, or what
                // follows is text.
                State::Undecided | State::Between => {
                    if let Some(rest) = self.buf.strip_prefix(OPEN) {
                        self.buf = rest.to_owned();
                        self.state = State::InCall;
                        self.opening = OPEN;
                    } else if OPEN.starts_with(self.buf.as_str()) {
                        return out;
                    } else {
                        self.state = State::Text;
                    }
                }
                State::InCall => {
                    let Some(end) = self.buf.find(CLOSE) else {
                        return out;
                    };
                    let body: String = self.buf.drain(..end).collect();
                    self.buf.drain(..CLOSE.len());
                    match parse_call(&body) {
                        Some(c) => out.push(Piece::Call(c)),
                        None => out.push(Piece::Text(format!("{}{body}{CLOSE}", self.opening))),
                    }
                    self.state = State::Between;
                }
                // Text passes as it comes, but for an ending that could be
                // the start of [`AFTER_TEXT`], held until it is clear.
                State::Text => {
                    if let Some(at) = self.buf.find(AFTER_TEXT) {
                        let before: String = self.buf.drain(..at).collect();
                        if !before.is_empty() {
                            out.push(Piece::Text(before));
                        }
                        self.buf.drain(..AFTER_TEXT.len());
                        self.state = State::InCall;
                        self.opening = AFTER_TEXT;
                        continue;
                    }
                    let held = (1..AFTER_TEXT.len())
                        .rev()
                        .find(|&k| self.buf.ends_with(&AFTER_TEXT[..k]))
                        .unwrap_or(0);
                    // The held ending is ASCII: the cut is a char boundary.
                    let cut = self.buf.len() - held;
                    if cut > 0 {
                        out.push(Piece::Text(self.buf.drain(..cut).collect()));
                    }
                    return out;
                }
            }
        }
    }

    /// The end of the output: whatever is held comes out as text (a call
    /// cut short by the token limit, or text that could have opened one).
    pub fn finish(self) -> Option<Piece> {
        let held = match self.state {
            State::InCall => format!("{}{}", self.opening, self.buf),
            _ => self.buf,
        };
        (!held.is_empty()).then_some(Piece::Text(held))
    }
}

/// A whole output's content and calls.
pub fn split(output: &str) -> (String, Vec<Call>) {
    let mut s = Splitter::new();
    let mut pieces = s.push(output);
    pieces.extend(s.finish());
    let mut text = String::new();
    let mut calls = Vec::new();
    for p in pieces {
        match p {
            Piece::Text(t) => text.push_str(&t),
            Piece::Call(c) => calls.push(c),
        }
    }
    (text, calls)
}

fn parse_call(body: &str) -> Option<Call> {
    let body = body.trim();
    let v: Value = serde_json::from_str(body).ok()?;
    let name = v.get("name")?.as_str()?.to_owned();
    if !v.get("arguments")?.is_object() {
        return None;
    }
    // The grammar writes the head exactly, then the arguments, then `}`:
    // the arguments' own text is what lies between.
    let arguments = body
        .strip_prefix(call_head(&name).as_str())
        .and_then(|rest| rest.strip_suffix('}'))
        .map(str::trim)
        .filter(|a| serde_json::from_str::<Value>(a).is_ok_and(|a| a.is_object()))
        .map_or_else(|| v["arguments"].to_string(), str::to_owned);
    Some(Call { name, arguments })
}
