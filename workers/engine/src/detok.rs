//! Incremental detokenization and stop strings.
//!
//! Text is produced from a sliding window of ids (as TGI does) so a
//! multi-byte character split over tokens is held back until complete, and
//! text that could be the start of a stop string is held back until it is
//! known not to be one.

use crate::tokenizer::Tokenizer;

#[derive(Debug)]
pub(crate) struct Detokenizer {
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
    /// Text decoded but not yet emitted (held for stop-string matching).
    pending: String,
    stop: Vec<String>,
}

/// What one new token adds to the output.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Piece {
    /// Text to emit now (possibly empty).
    Text(String),
    /// A stop string was reached; this text precedes it.
    Stopped(String),
}

impl Detokenizer {
    pub(crate) fn new(stop: Vec<String>) -> Self {
        Detokenizer {
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
            pending: String::new(),
            stop: stop.into_iter().filter(|s| !s.is_empty()).collect(),
        }
    }

    pub(crate) fn push(&mut self, tok: &Tokenizer, id: u32) -> Piece {
        self.ids.push(id);
        let prefix = tok.decode(&self.ids[self.prefix_offset..self.read_offset], true);
        let full = tok.decode(&self.ids[self.prefix_offset..], true);
        if full.len() > prefix.len()
            && !full.ends_with('\u{FFFD}')
            && full.is_char_boundary(prefix.len())
        {
            self.pending.push_str(&full[prefix.len()..]);
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
        }
        for s in &self.stop {
            if let Some(at) = self.pending.find(s.as_str()) {
                let before = self.pending[..at].to_owned();
                self.pending.clear();
                return Piece::Stopped(before);
            }
        }
        // Hold back the longest suffix that could begin a stop string.
        let hold = self
            .stop
            .iter()
            .flat_map(|s| {
                (1..s.len())
                    .filter(|n| s.is_char_boundary(*n))
                    .map(move |n| &s[..n])
            })
            .filter(|p| self.pending.ends_with(p))
            .map(str::len)
            .max()
            .unwrap_or(0);
        let emit_to = self.pending.len() - hold;
        let out: String = self.pending.drain(..emit_to).collect();
        Piece::Text(out)
    }

    /// Text still held back at the end of generation.
    pub(crate) fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}
