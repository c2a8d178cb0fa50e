//! Incremental detokenization and stop strings.
//!
//! Text is produced from a sliding window of ids (as TGI does) so a
//! multi-byte character split over tokens is held back until complete, and
//! text that could be the start of a stop string is held back until it is
//! known not to be one. Stop strings are matched by an automaton
//! ([`crate::stops`]) that each new byte moves once: the cost per token
//! does not grow with the strings' length.

use crate::stops::StopMatcher;
use crate::tokenizer::Tokenizer;

#[derive(Debug)]
pub(crate) struct Detokenizer {
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
    /// Text decoded but not yet emitted (held for stop-string matching):
    /// never longer than the longest stop string.
    pending: String,
    stop: StopMatcher,
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
    pub(crate) fn new(stop: &[String]) -> Self {
        Detokenizer {
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
            pending: String::new(),
            stop: StopMatcher::new(stop),
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
            let new = &full[prefix.len()..];
            if !self.stop.is_empty() {
                for (i, &b) in new.as_bytes().iter().enumerate() {
                    if let Some(len) = self.stop.feed(b) {
                        // The stop string ends at byte `i` of the new text
                        // and began in it or in what was held back.
                        self.pending.push_str(&new[..=i]);
                        let start = self.pending.len() - len;
                        let before = self.pending[..start].to_owned();
                        self.pending.clear();
                        return Piece::Stopped(before);
                    }
                }
            }
            self.pending.push_str(new);
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
        }
        // Hold back the longest suffix that could begin a stop string (it
        // starts where a stop string does, on a character boundary).
        let hold = self.stop.held().min(self.pending.len());
        let emit_to = self.pending.len() - hold;
        let out: String = self.pending.drain(..emit_to).collect();
        Piece::Text(out)
    }

    /// Text still held back at the end of generation.
    pub(crate) fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}
