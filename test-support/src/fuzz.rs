//! Property-based fuzzing of JSON request bodies, as the admin API, gateway
//! and worker fuzz tests build them: trees of values a few levels deep, and
//! valid bodies with one field removed or replaced (or left), and maybe one
//! more added, so that many cases reach the code behind validation.

use proptest::prelude::*;
use serde_json::Value;

/// How large a [`json_tree`] grows: proptest's recursion depth, desired
/// size and expected branch size, and the most elements an array or object
/// holds (exclusive).
#[derive(Debug, Clone, Copy)]
pub struct Tree {
    /// Levels of arrays and objects above the leaves.
    pub depth: u32,
    /// Nodes the tree aims for.
    pub size: u32,
    /// Children a collection is expected to have.
    pub branch: u32,
    /// Children a collection may have, exclusive.
    pub width: usize,
}

/// JSON values shaped by `tree`: `leaves` at the bottom, arrays and objects
/// (keys from `keys`) above them.
pub fn json_tree(
    leaves: BoxedStrategy<Value>,
    keys: BoxedStrategy<String>,
    tree: Tree,
) -> BoxedStrategy<Value> {
    let object = move |inner: BoxedStrategy<Value>| {
        proptest::collection::btree_map(keys.clone(), inner, 0..tree.width)
            .prop_map(|m| Value::Object(m.into_iter().collect()))
    };
    leaves
        .prop_recursive(tree.depth, tree.size, tree.branch, move |inner| {
            let array = proptest::collection::vec(inner.clone(), 0..tree.width);
            prop_oneof![array.prop_map(Value::from), object(inner)]
        })
        .boxed()
}

/// The fields of `valid` (an object), to pick one to mutate.
pub fn own_fields(valid: &Value) -> BoxedStrategy<String> {
    let names: Vec<String> = valid
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    prop::sample::select(names).boxed()
}

/// `valid` (an object) with the field `targets` picks removed or replaced
/// by one of `values` (or, when `may_keep`, left as it is), and maybe one
/// field from `extras` added.
pub fn mutations(
    valid: Value,
    targets: BoxedStrategy<String>,
    (values, extras): (BoxedStrategy<Value>, BoxedStrategy<String>),
    may_keep: bool,
) -> BoxedStrategy<Value> {
    let extra = proptest::option::of((extras, values.clone()));
    let edits = if may_keep { 0u8..3 } else { 0u8..2 };
    (targets, values, edits, extra)
        .prop_map(move |(k, v, edit, extra)| {
            let mut b = valid.clone();
            if let Some(o) = b.as_object_mut() {
                match edit {
                    0 => drop(o.remove(&k)),
                    1 => drop(o.insert(k, v)),
                    _ => {}
                }
                if let Some((k, v)) = extra {
                    o.insert(k, v);
                }
            }
            b
        })
        .boxed()
}
