//! The vocabulary sorted by its tokens' bytes, for constrained sampling:
//! which tokens a grammar state accepts is found by walking the sorted
//! list as a trie (each token shares its prefix with the one before it),
//! feeding the matcher one byte per trie edge and skipping every token
//! under a prefix the matcher refused. A step costs the trie's live part,
//! not one matcher copy and walk per token.

use bulkhead_grammar::Matcher;

/// Token ids in the order of their bytes, and how many leading bytes each
/// shares with the one before it.
#[derive(Debug, Clone, Default)]
pub(crate) struct SortedVocab {
    order: Vec<u32>,
    shared: Vec<u32>,
}

impl SortedVocab {
    /// The tokens of `bytes` (indexed by id; `None`: never acceptable).
    pub(crate) fn new(bytes: &[Option<Box<[u8]>>]) -> SortedVocab {
        let mut order: Vec<u32> = (0..bytes.len())
            .filter(|&i| bytes[i].as_deref().is_some_and(|b| !b.is_empty()))
            .filter_map(|i| u32::try_from(i).ok())
            .collect();
        let of = |id: u32| bytes[id as usize].as_deref().unwrap_or_default();
        order.sort_by(|a, b| of(*a).cmp(of(*b)));
        let shared = order
            .iter()
            .enumerate()
            .map(|(k, &id)| match k {
                0 => 0,
                _ => {
                    let (a, b) = (of(order[k - 1]), of(id));
                    a.iter().zip(b).take_while(|(x, y)| x == y).count() as u32
                }
            })
            .collect();
        SortedVocab { order, shared }
    }

    /// Sets `accepted[id]` for every token whose bytes `m` takes next
    /// (`accepted` is as long as the vocabulary; others are left false).
    pub(crate) fn accepted<'a>(
        &self,
        m: &Matcher,
        bytes_of: impl Fn(u32) -> Option<&'a [u8]>,
        accepted: &mut [bool],
    ) {
        // Free text: a token is taken unless it holds the guard's bytes
        // (then the matcher decides), with no matcher step per byte.
        if let Some(guard) = m.free_text_guard() {
            for &id in &self.order {
                if let (Some(bytes), Some(a)) = (bytes_of(id), accepted.get_mut(id as usize)) {
                    let held = bytes.windows(guard.len()).any(|w| w == guard);
                    *a = !held || m.accepts(bytes);
                }
            }
            return;
        }
        // states[d]: the matcher after the current token's first d bytes.
        let mut states: Vec<Matcher> = vec![m.clone()];
        // The current prefix's first `dead + 1` bytes were refused.
        let mut dead: Option<usize> = None;
        for (k, &id) in self.order.iter().enumerate() {
            let Some(bytes) = bytes_of(id) else { continue };
            let shared = self.shared[k] as usize;
            if let Some(d) = dead {
                if shared > d {
                    continue; // under the refused prefix
                }
                dead = None;
            }
            states.truncate(shared + 1);
            let mut alive = true;
            for (j, &b) in bytes.iter().enumerate().skip(shared) {
                let mut next = states[j].clone();
                if !next.feed(&[b]) {
                    dead = Some(j);
                    alive = false;
                    break;
                }
                states.push(next);
            }
            if alive && let Some(a) = accepted.get_mut(id as usize) {
                *a = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bulkhead_grammar::Grammar;
    use serde_json::json;

    /// Every string of up to three bytes over a small alphabet, and a few
    /// longer ones, as a vocabulary.
    fn vocab() -> Vec<Option<Box<[u8]>>> {
        let alphabet = b"{}\":, ak1-";
        let mut v: Vec<Option<Box<[u8]>>> = vec![None];
        for &a in alphabet {
            v.push(Some(vec![a].into()));
            for &b in alphabet {
                v.push(Some(vec![a, b].into()));
                for &c in alphabet {
                    v.push(Some(vec![a, b, c].into()));
                }
            }
        }
        for long in [
            "{\"kkkk\":",
            "\"kkkkkkkk\"",
            "kkkkkkkkkkkkkkkk",
            "\": 1}",
            "{\"a\":-1}",
            // Tool calls' openings, whole and in parts, alone and after text.
            "<tool_call>\n",
            "\n<tool_call>",
            "\n<tool_call>\n",
            "a\n<tool_call>\n{",
            "\n<tool_call>x",
            "\n<tool",
            "_call>\n",
            "\n<tool_calls",
        ] {
            v.push(Some(long.as_bytes().into()));
        }
        v
    }

    #[test]
    fn the_walk_accepts_exactly_the_tokens_the_matcher_does() {
        let v = vocab();
        let sorted = SortedVocab::new(&v);
        let bytes_of = |id: u32| v.get(id as usize).and_then(|b| b.as_deref());
        let schema = json!({"type": "object", "properties": {"kkkkkkkkkkkk": {"type": "integer"},
            "a": {"type": "string"}}, "additionalProperties": false});
        let function = bulkhead_grammar::tools::Function {
            name: "a".to_owned(),
            description: None,
            parameters: json!({"type": "object"}),
        };
        let tools = |choice| {
            Grammar::tool_calls(std::slice::from_ref(&function), &choice, true).expect("tools")
        };
        let grammars = [
            Grammar::json_object(),
            Grammar::from_schema(&schema).expect("schema"),
            // Free text under both choices that allow it (the walk's fast
            // path), and calls.
            tools(bulkhead_grammar::tools::Choice::Auto),
            tools(bulkhead_grammar::tools::Choice::None),
        ];
        let prefixes = [
            "",
            "{",
            "{\"",
            "{\"kkk",
            "{\"kkkkkkkkkkkk\"",
            "{\"kkkkkkkkkkkk\":",
            "{\"a\":\"x",
            // Tool grammars: free text, a pending opening, inside a call.
            "Sure",
            "Sure\n<tool",
            "<tool_call>\n",
        ];
        let mut checked = 0;
        for g in &grammars {
            for p in prefixes {
                let mut m = Matcher::new(std::sync::Arc::clone(g));
                if !p.is_empty() && !m.feed(p.as_bytes()) {
                    continue;
                }
                let mut walked = vec![false; v.len()];
                sorted.accepted(&m, bytes_of, &mut walked);
                let each: Vec<bool> = (0..v.len())
                    .map(|id| bytes_of(id as u32).is_some_and(|b| m.accepts(b)))
                    .collect();
                assert_eq!(walked, each, "state after {p:?}");
                checked += 1;
            }
        }
        assert!(checked >= 10, "{checked} states checked");
    }
}
