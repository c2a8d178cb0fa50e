//! Compiling a JSON Schema (the subset Bulkhead can enforce exactly) into
//! the node graph the [`crate::Matcher`] walks. A schema that uses anything
//! outside the subset is refused with the keyword named: a client is never
//! answered as if a constraint it sent had been applied.

use serde_json::{Map, Value};
use std::sync::Arc;

/// A schema Bulkhead cannot enforce, or one that is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// A keyword or value outside the supported subset; the text names it.
    #[error("{0}")]
    Unsupported(String),
    /// A schema that is not valid JSON Schema.
    #[error("{0}")]
    Invalid(String),
}

/// Index of a node in a [`Grammar`].
pub(crate) type NodeId = usize;

/// What a value must be.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node {
    /// Any JSON value.
    Any,
    /// An object: the named properties (any order, each at most once),
    /// those in `required` present before it closes, and other keys only
    /// when `additional` says what their values are.
    Object {
        props: Vec<(Vec<u8>, NodeId)>,
        required: u64,
        additional: Option<NodeId>,
    },
    /// An array of `items`, with a bounded length.
    Array {
        items: NodeId,
        min: u32,
        max: Option<u32>,
    },
    /// A string of `min..=max` characters.
    String { min: u32, max: Option<u32> },
    /// A number; `integer` allows no fraction or exponent.
    Number { integer: bool },
    /// One of these JSON texts exactly (`enum`, `const`, `true`, `null`).
    Literals(Vec<Vec<u8>>),
    /// One of several values chosen by fixed text before it: the text
    /// `alts[i].0`, a value of `alts[i].1`, then `close`. No alternative's
    /// text is a prefix of another's, so the text names the value.
    Tagged {
        alts: Vec<(Vec<u8>, NodeId)>,
        close: Vec<u8>,
    },
    /// Tool calls in the default format of [`crate::tools`]: `call`
    /// between [`crate::tools::OPEN`] and [`crate::tools::CLOSE`], up to
    /// `max` times, one right after another; with `free`, any text that does not
    /// begin with [`crate::tools::OPEN`] instead.
    Calls { call: NodeId, max: u32, free: bool },
}

/// Nodes every grammar has, at fixed places.
pub(crate) const ANY: NodeId = 0;
pub(crate) const ANY_OBJECT: NodeId = 1;
pub(crate) const ANY_ARRAY: NodeId = 2;
pub(crate) const ANY_STRING: NodeId = 3;
pub(crate) const ANY_NUMBER: NodeId = 4;
pub(crate) const BOOLEAN: NodeId = 5;
pub(crate) const NULL: NodeId = 6;

/// A compiled output constraint: JSON mode (any object) or a schema.
#[derive(Debug, Clone, PartialEq)]
pub struct Grammar {
    pub(crate) nodes: Vec<Node>,
    pub(crate) root: NodeId,
}

/// The most properties one object schema may name (they are a bit set).
const MAX_PROPS: usize = 64;
/// The most alternatives an `enum` may list.
const MAX_ENUM: usize = 256;
/// The deepest a schema may nest.
const MAX_SCHEMA_DEPTH: usize = 32;
/// The longest property name, in bytes.
pub const MAX_NAME_BYTES: usize = 256;
/// The longest `enum` or `const` value, as compact JSON text, in bytes.
pub const MAX_LITERAL_BYTES: usize = 1024;
/// The most nodes a compiled schema may have (every subschema is one).
pub const MAX_NODES: usize = 1024;

impl Grammar {
    /// JSON mode: one JSON object, of any content.
    pub fn json_object() -> Arc<Grammar> {
        Arc::new(Grammar {
            nodes: base(),
            root: ANY_OBJECT,
        })
    }

    /// Output that is a JSON value valid against `schema`, for the subset
    /// `type` (one of object, array, string, number, integer, boolean,
    /// null), `properties`, `required`, `additionalProperties`, `items`,
    /// `minItems`, `maxItems`, `minLength`, `maxLength`, `enum` and
    /// `const`; `title`, `description`, `default`, `examples` and
    /// `$schema` are annotations. Anything else is refused, by name.
    pub fn from_schema(schema: &Value) -> Result<Arc<Grammar>, SchemaError> {
        let mut nodes = base();
        let root = compile(&mut nodes, schema, "schema", 0)?;
        Ok(Arc::new(Grammar { nodes, root }))
    }

    /// The grammar an OpenAI `response_format` asks for: `None` for
    /// `{"type": "text"}`, JSON mode for `json_object`, a schema for
    /// `json_schema` (`{"json_schema": {"name", "schema", "strict"}}`).
    /// Workers AI's `{"type": "json_schema", "json_schema": SCHEMA}` is
    /// accepted too.
    pub fn from_response_format(format: &Value) -> Result<Option<Arc<Grammar>>, SchemaError> {
        let kind = format.get("type").and_then(Value::as_str);
        match kind {
            Some("text") => Ok(None),
            Some("json_object") => Ok(Some(Grammar::json_object())),
            Some("json_schema") => {
                let spec = format.get("json_schema").ok_or_else(|| {
                    SchemaError::Invalid("response_format.json_schema is missing".to_owned())
                })?;
                // OpenAI wraps the schema (`name`, `schema`, `strict`; no
                // schema means any JSON value); Workers AI gives it directly.
                let wrapped = spec.get("name").is_some()
                    || spec.get("strict").is_some()
                    || (spec.get("schema").is_some() && spec.get("type").is_none());
                let schema = if wrapped {
                    spec.get("schema").unwrap_or(&Value::Bool(true))
                } else {
                    spec
                };
                Grammar::from_schema(schema).map(Some)
            }
            _ => Err(SchemaError::Invalid(
                "response_format.type must be text, json_object or json_schema".to_owned(),
            )),
        }
    }
}

pub(crate) fn base() -> Vec<Node> {
    vec![
        Node::Any,
        Node::Object {
            props: Vec::new(),
            required: 0,
            additional: Some(ANY),
        },
        Node::Array {
            items: ANY,
            min: 0,
            max: None,
        },
        Node::String { min: 0, max: None },
        Node::Number { integer: false },
        Node::Literals(vec![b"true".to_vec(), b"false".to_vec()]),
        Node::Literals(vec![b"null".to_vec()]),
    ]
}

pub(crate) fn push(nodes: &mut Vec<Node>, n: Node) -> NodeId {
    nodes.push(n);
    nodes.len() - 1
}

pub(crate) fn unsupported(at: &str, what: &str) -> SchemaError {
    SchemaError::Unsupported(format!("{at}: {what} is not supported"))
}

pub(crate) fn invalid(at: &str, what: &str) -> SchemaError {
    SchemaError::Invalid(format!("{at}: {what}"))
}

fn count(o: &Map<String, Value>, key: &str, at: &str) -> Result<Option<u32>, SchemaError> {
    match o.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| invalid(at, &format!("{key} must be a non-negative integer"))),
    }
}

const KNOWN: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "enum",
    "const",
    "title",
    "description",
    "default",
    "examples",
    "$schema",
];

pub(crate) fn compile(
    nodes: &mut Vec<Node>,
    schema: &Value,
    at: &str,
    depth: usize,
) -> Result<NodeId, SchemaError> {
    if depth > MAX_SCHEMA_DEPTH {
        return Err(unsupported(at, "nesting deeper than 32"));
    }
    if nodes.len() >= MAX_NODES {
        return Err(unsupported(
            at,
            &format!("a schema of more than {MAX_NODES} subschemas"),
        ));
    }
    let o = match schema {
        Value::Bool(true) => return Ok(ANY),
        Value::Object(o) => o,
        _ => return Err(invalid(at, "a schema must be an object")),
    };
    if let Some(k) = o.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(unsupported(at, &format!("keyword `{}`", clip(k))));
    }
    if let Some(c) = o.get("const") {
        return Ok(push(nodes, Node::Literals(vec![literal(c, at)?])));
    }
    if let Some(e) = o.get("enum") {
        let values = e
            .as_array()
            .filter(|a| !a.is_empty())
            .ok_or_else(|| invalid(at, "enum must be a non-empty array"))?;
        if values.len() > MAX_ENUM {
            return Err(unsupported(at, "an enum of more than 256 values"));
        }
        let literals = values
            .iter()
            .map(|v| literal(v, at))
            .collect::<Result<_, _>>()?;
        return Ok(push(nodes, Node::Literals(literals)));
    }
    let kind = match o.get("type") {
        None => return Ok(ANY),
        Some(Value::String(t)) => t.as_str(),
        Some(Value::Array(_)) => return Err(unsupported(at, "a list of types")),
        Some(_) => return Err(invalid(at, "type must be a string")),
    };
    let node = match kind {
        "object" => object(nodes, o, at, depth)?,
        "array" => {
            let items = match o.get("items") {
                None => ANY,
                Some(s) => compile(nodes, s, &format!("{at}.items"), depth + 1)?,
            };
            let min = count(o, "minItems", at)?.unwrap_or(0);
            let max = count(o, "maxItems", at)?;
            if max.is_some_and(|m| m < min) {
                return Err(invalid(at, "maxItems is below minItems"));
            }
            Node::Array { items, min, max }
        }
        "string" => {
            let min = count(o, "minLength", at)?.unwrap_or(0);
            let max = count(o, "maxLength", at)?;
            if max.is_some_and(|m| m < min) {
                return Err(invalid(at, "maxLength is below minLength"));
            }
            Node::String { min, max }
        }
        "number" => Node::Number { integer: false },
        "integer" => Node::Number { integer: true },
        "boolean" => return Ok(BOOLEAN),
        "null" => return Ok(NULL),
        other => return Err(invalid(at, &format!("unknown type {:?}", clip(other)))),
    };
    for k in ["items", "minItems", "maxItems"] {
        if kind != "array" && o.contains_key(k) {
            return Err(unsupported(at, &format!("`{k}` on a {kind}")));
        }
    }
    for k in ["minLength", "maxLength"] {
        if kind != "string" && o.contains_key(k) {
            return Err(unsupported(at, &format!("`{k}` on a {kind}")));
        }
    }
    Ok(push(nodes, node))
}

fn object(
    nodes: &mut Vec<Node>,
    o: &Map<String, Value>,
    at: &str,
    depth: usize,
) -> Result<Node, SchemaError> {
    let mut props = Vec::new();
    if let Some(p) = o.get("properties") {
        let p = p
            .as_object()
            .ok_or_else(|| invalid(at, "properties must be an object"))?;
        if p.len() > MAX_PROPS {
            return Err(unsupported(at, "more than 64 properties"));
        }
        for (name, s) in p {
            if name.len() > MAX_NAME_BYTES {
                return Err(too_big(at, "a property name", name.len(), MAX_NAME_BYTES));
            }
            if name.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
                return Err(unsupported(
                    at,
                    "a property name with a quote, backslash or control character",
                ));
            }
            let id = compile(
                nodes,
                s,
                &format!("{at}.properties.{}", clip(name)),
                depth + 1,
            )?;
            props.push((name.as_bytes().to_vec(), id));
        }
    }
    let mut required = 0u64;
    if let Some(r) = o.get("required") {
        let r = r
            .as_array()
            .ok_or_else(|| invalid(at, "required must be an array"))?;
        for name in r {
            let name = name
                .as_str()
                .ok_or_else(|| invalid(at, "required must list strings"))?;
            let i = props
                .iter()
                .position(|(p, _)| p == name.as_bytes())
                .ok_or_else(|| {
                    invalid(
                        at,
                        &format!(
                            "required names {:?}, which is not in properties",
                            clip(name)
                        ),
                    )
                })?;
            required |= 1 << i;
        }
    }
    let additional = match o.get("additionalProperties") {
        None | Some(Value::Bool(true)) => Some(ANY),
        Some(Value::Bool(false)) => None,
        Some(s) => Some(compile(
            nodes,
            s,
            &format!("{at}.additionalProperties"),
            depth + 1,
        )?),
    };
    Ok(Node::Object {
        props,
        required,
        additional,
    })
}

/// A JSON value's compact text, the form a literal must be written in, if
/// it is no longer than [`MAX_LITERAL_BYTES`].
fn literal(v: &Value, at: &str) -> Result<Vec<u8>, SchemaError> {
    let t = v.to_string().into_bytes();
    if t.len() > MAX_LITERAL_BYTES {
        return Err(too_big(
            at,
            "an enum or const value",
            t.len(),
            MAX_LITERAL_BYTES,
        ));
    }
    Ok(t)
}

/// The refusal of `what`, `len` bytes long, past its limit of `max`.
fn too_big(at: &str, what: &str, len: usize, max: usize) -> SchemaError {
    unsupported(at, &format!("{what} of {len} bytes (at most {max})"))
}

fn clip(s: &str) -> String {
    s.chars().take(64).collect()
}
