//! Property-based fuzzing of JSON request bodies, as the admin API, gateway
//! and worker fuzz tests build them: trees of values a few levels deep, and
//! valid bodies with one field removed, replaced or left, and maybe one
//! more added, so that many cases reach the code behind validation.

use proptest::prelude::*;
use serde_json::Value;

/// JSON values up to `depth` levels deep: `leaves` at the bottom, arrays
/// and objects (keys from `keys`) above them.
pub fn json_tree(
    leaves: BoxedStrategy<Value>,
    keys: BoxedStrategy<String>,
    depth: u32,
) -> BoxedStrategy<Value> {
    let object = move |inner: BoxedStrategy<Value>| {
        proptest::collection::btree_map(keys.clone(), inner, 0..4)
            .prop_map(|m| Value::Object(m.into_iter().collect()))
    };
    leaves
        .prop_recursive(depth, 24, 4, move |inner| {
            let array = proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from);
            prop_oneof![array, object(inner)]
        })
        .boxed()
}

/// `valid` (an object) with one of its fields removed, replaced by one of
/// `values`, or left as it is, and maybe one field from `keys` added.
pub fn mutations(
    valid: Value,
    values: BoxedStrategy<Value>,
    keys: BoxedStrategy<String>,
) -> BoxedStrategy<Value> {
    let names: Vec<String> = valid
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    let extra = proptest::option::of((keys, values.clone()));
    (prop::sample::select(names), values, 0u8..3, extra)
        .prop_map(move |(k, v, how, extra)| {
            let mut b = valid.clone();
            if let Some(o) = b.as_object_mut() {
                match how {
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
