//! Reading the JSON answers tests check.

use serde_json::Value;

/// The elements of `v` when it is an array; none otherwise.
pub fn items(v: &Value) -> std::slice::Iter<'_, Value> {
    v.as_array().map_or(&[][..], Vec::as_slice).iter()
}

/// Each element's string field `key`, in order (elements without one are
/// skipped).
pub fn strings<'a>(v: &'a Value, key: &str) -> Vec<&'a str> {
    items(v).filter_map(|e| e[key].as_str()).collect()
}

/// Three string fields of `v` (each "" when absent or not a string), for
/// comparing log entries with a table of tuples.
pub fn three<'a>(v: &'a Value, [a, b, c]: [&str; 3]) -> (&'a str, &'a str, &'a str) {
    let s = |k: &str| v[k].as_str().unwrap_or_default();
    (s(a), s(b), s(c))
}
