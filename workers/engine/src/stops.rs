//! Stop strings as one Aho–Corasick automaton over bytes: each byte of
//! output moves it one step (amortised O(1), whatever the strings' length),
//! and its state says both whether a stop string just ended and how long a
//! suffix of the output could still begin one (what must be held back).

/// The automaton of a request's stop strings.
#[derive(Debug, Clone)]
pub(crate) struct StopMatcher {
    /// Trie edges of each node, by byte (few per node: stop strings are few).
    next: Vec<Vec<(u8, u32)>>,
    /// The longest proper suffix of a node's path that is also in the trie.
    fail: Vec<u32>,
    /// A node's depth: bytes of a stop string's prefix it stands for.
    depth: Vec<u32>,
    /// The length of the longest stop string ending at a node (its own, or
    /// one on its failure chain), if any.
    ends: Vec<Option<u32>>,
    state: u32,
}

impl StopMatcher {
    /// The automaton of `stops` (empty strings ignored).
    pub(crate) fn new(stops: &[String]) -> StopMatcher {
        let mut m = StopMatcher {
            next: vec![Vec::new()],
            fail: vec![0],
            depth: vec![0],
            ends: vec![None],
            state: 0,
        };
        for s in stops.iter().filter(|s| !s.is_empty()) {
            let mut at = 0u32;
            for &b in s.as_bytes() {
                at = match m.child(at, b) {
                    Some(c) => c,
                    None => {
                        let id = m.next.len() as u32;
                        m.next.push(Vec::new());
                        m.fail.push(0);
                        m.depth.push(m.depth[at as usize] + 1);
                        m.ends.push(None);
                        m.next[at as usize].push((b, id));
                        id
                    }
                };
            }
            m.ends[at as usize] = Some(s.len() as u32);
        }
        // Failure links, breadth first: a node's parent is done before it.
        let mut queue: std::collections::VecDeque<u32> =
            m.next[0].iter().map(|&(_, c)| c).collect();
        while let Some(n) = queue.pop_front() {
            for (b, c) in m.next[n as usize].clone() {
                let mut f = m.fail[n as usize];
                let link = loop {
                    if let Some(t) = m.child(f, b) {
                        break t;
                    }
                    if f == 0 {
                        break 0;
                    }
                    f = m.fail[f as usize];
                };
                m.fail[c as usize] = link;
                if m.ends[c as usize].is_none() {
                    m.ends[c as usize] = m.ends[link as usize];
                }
                queue.push_back(c);
            }
        }
        m
    }

    /// Whether there is no stop string at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.next.len() == 1
    }

    fn child(&self, n: u32, b: u8) -> Option<u32> {
        self.next[n as usize]
            .iter()
            .find(|&&(x, _)| x == b)
            .map(|&(_, c)| c)
    }

    /// Moves over one byte of output; the length of a stop string that
    /// ends with it, if one does.
    pub(crate) fn feed(&mut self, b: u8) -> Option<usize> {
        let mut s = self.state;
        self.state = loop {
            if let Some(t) = self.child(s, b) {
                break t;
            }
            if s == 0 {
                break 0;
            }
            s = self.fail[s as usize];
        };
        self.ends[self.state as usize].map(|l| l as usize)
    }

    /// Bytes at the end of the output so far that could begin a stop
    /// string: what must be held back.
    pub(crate) fn held(&self) -> usize {
        self.depth[self.state as usize] as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first stop found by a plain scan: (end offset, length).
    fn scan(text: &str, stops: &[&str]) -> Option<(usize, usize)> {
        (1..=text.len()).find_map(|end| {
            stops
                .iter()
                .filter(|s| !s.is_empty() && text.as_bytes()[..end].ends_with(s.as_bytes()))
                .map(|s| (end, s.len()))
                .max_by_key(|m| m.1)
        })
    }

    #[test]
    fn it_finds_what_a_scan_finds_and_holds_the_longest_possible_start() {
        let cases: &[(&str, &[&str])] = &[
            ("the end of the story", &["end"]),
            ("aaab", &["aab"]),
            ("abcabd", &["abd", "bca"]),
            ("say </s> now", &["</s>", "<|im_end|>"]),
            ("no stop here", &["xyz"]),
            ("héllo wörld", &["wö"]),
            ("ushers", &["he", "she", "his", "hers"]),
        ];
        for (text, stops) in cases {
            let owned: Vec<String> = stops.iter().map(|s| (*s).to_owned()).collect();
            let mut m = StopMatcher::new(&owned);
            let mut found = None;
            for (i, &b) in text.as_bytes().iter().enumerate() {
                if let Some(len) = m.feed(b) {
                    found = Some((i + 1, len));
                    break;
                }
            }
            assert_eq!(found, scan(text, stops), "{text:?} {stops:?}");
        }
        // Held back: the longest suffix that begins a stop string.
        let mut m = StopMatcher::new(&["<|im_end|>".to_owned()]);
        for &b in b"text <|im" {
            assert_eq!(m.feed(b), None);
        }
        assert_eq!(m.held(), 4);
        for &b in b"x" {
            m.feed(b);
        }
        assert_eq!(m.held(), 0);
    }

    #[test]
    fn its_size_is_the_strings_and_each_byte_costs_the_same_however_long_they_are() {
        let long = "k".repeat(60_000);
        let m = StopMatcher::new(std::slice::from_ref(&long));
        assert_eq!(m.next.len(), 60_001);
        // Feeding a near-miss never rescans: the state just advances.
        let mut m = m;
        for _ in 0..59_999 {
            assert_eq!(m.feed(b'k'), None);
        }
        assert_eq!(m.held(), 59_999);
        assert_eq!(m.feed(b'k'), Some(60_000));
    }
}
