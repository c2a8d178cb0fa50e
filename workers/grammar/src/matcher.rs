//! The byte-level matcher: a pushdown automaton over a [`Grammar`] that
//! says whether a token's bytes may come next. The sampler clones it to try
//! a candidate token and keeps the clone of the one it picks.

use crate::schema::{
    ANY_ARRAY, ANY_NUMBER, ANY_OBJECT, ANY_STRING, BOOLEAN, Grammar, NULL, Node, NodeId,
};
use crate::tools;
use std::sync::Arc;

/// Where an output stands against its grammar.
#[derive(Debug, Clone)]
pub struct Matcher {
    grammar: Arc<Grammar>,
    stack: Vec<Frame>,
    /// Whitespace bytes in a row outside strings.
    ws_run: u8,
}

/// Most whitespace bytes in a row between tokens of the structure, so a
/// model cannot pad forever with newlines.
const MAX_WS_RUN: u8 = 16;
/// Deepest nesting of objects and arrays.
const MAX_DEPTH: usize = 64;
/// Longest number, in bytes.
const MAX_NUMBER: u8 = 24;
/// Longest object key not named by the schema, in bytes.
const MAX_FREE_KEY: usize = 256;

#[derive(Debug, Clone, PartialEq)]
enum Frame {
    /// A value of this node is expected next.
    Value(NodeId),
    Object {
        node: NodeId,
        seen: u64,
        phase: ObjPhase,
    },
    /// An object key being read: not its bytes, but which of the schema's
    /// names it is still a prefix of and how long it is, so a step (and a
    /// copy of the matcher) costs the same however long the key grows.
    Key {
        object: NodeId,
        /// The named properties whose names begin with the key so far.
        cand: u64,
        /// Bytes of the key so far.
        len: u32,
        esc: Esc,
    },
    Array {
        node: NodeId,
        count: u32,
        phase: ArrPhase,
    },
    Str {
        min: u32,
        max: Option<u32>,
        chars: u32,
        esc: Esc,
    },
    Number {
        integer: bool,
        phase: NumPhase,
        len: u8,
    },
    Literal {
        node: NodeId,
        pos: usize,
        alive: Vec<u16>,
    },
    /// Inside a [`Node::Calls`]: `count` calls made so far.
    Calls {
        node: NodeId,
        count: u32,
        phase: CallsPhase,
    },
    /// Plain text before any call: any byte, `pos` bytes of
    /// [`tools::AFTER_TEXT`] seen last, which opens calls after it.
    Free { node: NodeId, pos: usize },
    /// A [`Node::Tagged`]'s text so far, `pos` bytes: the alternatives it
    /// is still a prefix of.
    Tag {
        node: NodeId,
        pos: usize,
        alive: Vec<u16>,
    },
    /// A [`Node::Tagged`]'s closing text, from byte `pos`.
    Close { node: NodeId, pos: usize },
}

/// Where a [`Frame::Calls`] stands: reading [`tools::OPEN`] (before the
/// first call), [`tools::CLOSE`] (after a call's value) or [`tools::NEXT`]
/// (after a call: another, or the end), `n` bytes of it so far.
#[derive(Debug, Clone, Copy, PartialEq)]
enum CallsPhase {
    Open(usize),
    Close(usize),
    Next(usize),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum ObjPhase {
    /// After `{`.
    First,
    /// After `,`.
    NextKey,
    /// After a key: `:` then a value of this node.
    Colon(NodeId),
    /// After a member's value.
    AfterValue,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum ArrPhase {
    First,
    Next,
    AfterValue,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Esc {
    No,
    Backslash,
    /// Hex digits still to come after `\u`.
    Hex(u8),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum NumPhase {
    Start,
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    Exp,
    ExpSign,
    ExpDigits,
}

/// What a frame does with a byte.
enum Action {
    /// Taken; the frame may have changed in place.
    Take,
    /// Taken, and this frame opened on top.
    Push(Frame),
    /// Taken, and this frame replaces the top.
    Replace(Frame),
    /// Taken, and the frame's value is complete.
    Complete,
    /// Not taken: the frame's value ended before it; the byte goes to the
    /// frame below.
    EndBefore,
    /// Not taken: this frame replaces the top and gets the byte.
    Become(Frame),
    /// Not taken: this frame opens on top and gets the byte.
    Descend(Frame),
    Reject,
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\r' | b'\t')
}

impl Matcher {
    /// A matcher at the start of the output.
    pub fn new(grammar: Arc<Grammar>) -> Matcher {
        let root = grammar.root;
        // Calls start at once: no whitespace before a call's opening text.
        let first = match grammar.nodes[root] {
            Node::Calls { .. } => Frame::Calls {
                node: root,
                count: 0,
                phase: CallsPhase::Open(0),
            },
            _ => Frame::Value(root),
        };
        Matcher {
            grammar,
            stack: vec![first],
            ws_run: 0,
        }
    }

    /// Whether `bytes` may come next (the matcher is unchanged).
    pub fn accepts(&self, bytes: &[u8]) -> bool {
        let mut m = self.clone();
        m.feed(bytes)
    }

    /// Takes `bytes`; false (and the matcher is spent) when they may not
    /// come next.
    pub fn feed(&mut self, bytes: &[u8]) -> bool {
        !bytes.is_empty() && bytes.iter().all(|b| self.step(*b))
    }

    /// The output is one complete value: nothing more may follow.
    pub fn is_done(&self) -> bool {
        self.stack.is_empty()
    }

    /// In free text (a tool offer's `auto` or `none` answering in text),
    /// with nothing of [`tools::AFTER_TEXT`] pending: the bytes whose
    /// presence alone can make a byte string refused or leave free text.
    /// Any string without them is taken whole, so a vocabulary walk can
    /// accept such a token without stepping the matcher through it.
    /// `None` in every other state.
    pub fn free_text_guard(&self) -> Option<&'static [u8]> {
        match self.stack.as_slice() {
            // Free text is left (calls follow) or refused (no call may)
            // only at the opening's last two bytes, after `\n<tool_call`.
            [Frame::Free { pos: 0, .. }] => {
                let text = tools::AFTER_TEXT.as_bytes();
                Some(&text[..text.len() - 1])
            }
            _ => None,
        }
    }

    /// The output may end here: it is complete, or it is a number or
    /// literal at the top level that could end now.
    pub fn can_end(&self) -> bool {
        match self.stack.as_slice() {
            [] => true,
            [Frame::Number { phase, .. }] => number_may_end(*phase),
            [Frame::Literal { node, pos, alive }] => {
                let lits = self.literals(*node);
                alive.iter().any(|i| lits[usize::from(*i)].len() == *pos)
            }
            [Frame::Free { .. }]
            | [
                Frame::Calls {
                    phase: CallsPhase::Next(0),
                    ..
                },
            ] => true,
            // Text that is (so far) a prefix of a call's opening.
            [
                Frame::Calls {
                    node,
                    count: 0,
                    phase: CallsPhase::Open(_),
                },
            ] => matches!(self.node(*node), Node::Calls { free: true, .. }),
            _ => false,
        }
    }

    fn step(&mut self, b: u8) -> bool {
        loop {
            let top = match self.stack.last() {
                // Nothing may follow a complete value.
                None => return false,
                Some(Frame::Value(_) | Frame::Object { .. } | Frame::Array { .. }) if is_ws(b) => {
                    if self.ws_run >= MAX_WS_RUN {
                        return false;
                    }
                    self.ws_run += 1;
                    return true;
                }
                Some(top) => top.clone(),
            };
            match self.act(top, b) {
                Action::Take => {}
                Action::Push(f) => {
                    if self.stack.len() >= MAX_DEPTH {
                        return false;
                    }
                    self.stack.push(f);
                }
                Action::Replace(f) => self.set_top(f),
                Action::Complete => {
                    self.stack.pop();
                }
                Action::EndBefore => {
                    self.stack.pop();
                    continue;
                }
                Action::Become(f) => {
                    self.set_top(f);
                    continue;
                }
                Action::Descend(f) => {
                    if self.stack.len() >= MAX_DEPTH {
                        return false;
                    }
                    self.stack.push(f);
                    continue;
                }
                Action::Reject => return false,
            }
            self.ws_run = 0;
            return true;
        }
    }

    fn node(&self, id: NodeId) -> &Node {
        &self.grammar.nodes[id]
    }

    fn literals(&self, id: NodeId) -> &[Vec<u8>] {
        match self.node(id) {
            Node::Literals(l) => l,
            _ => &[],
        }
    }

    fn act(&mut self, top: Frame, b: u8) -> Action {
        match top {
            Frame::Value(node) => self.start(node, b),
            Frame::Object { node, seen, phase } => self.object(node, seen, phase, b),
            Frame::Key {
                object,
                cand,
                len,
                esc,
            } => self.key(object, (cand, len), esc, b),
            Frame::Array { node, count, phase } => self.array(node, count, phase, b),
            Frame::Str {
                min,
                max,
                chars,
                esc,
            } => self.string(min, max, chars, esc, b),
            Frame::Number {
                integer,
                phase,
                len,
            } => self.number(integer, phase, len, b),
            Frame::Literal { node, pos, alive } => self.literal(node, pos, &alive, b),
            Frame::Calls { node, count, phase } => self.calls(node, count, phase, b),
            Frame::Free { node, pos } => self.free(node, pos, b),
            Frame::Tag { node, pos, alive } => self.tag(node, pos, &alive, b),
            Frame::Close { node, pos } => self.close(node, pos, b),
        }
    }

    fn set_top(&mut self, f: Frame) {
        if let Some(t) = self.stack.last_mut() {
            *t = f;
        }
    }

    /// The first byte of a value of `node`.
    fn start(&mut self, node: NodeId, b: u8) -> Action {
        let node = match (self.node(node), b) {
            (Node::Any, b'{') => ANY_OBJECT,
            (Node::Any, b'[') => ANY_ARRAY,
            (Node::Any, b'"') => ANY_STRING,
            (Node::Any, b'-' | b'0'..=b'9') => ANY_NUMBER,
            (Node::Any, b't' | b'f') => BOOLEAN,
            (Node::Any, b'n') => NULL,
            (Node::Any, _) => return Action::Reject,
            _ => node,
        };
        match self.node(node).clone() {
            Node::Object { .. } if b == b'{' => Action::Replace(Frame::Object {
                node,
                seen: 0,
                phase: ObjPhase::First,
            }),
            Node::Array { .. } if b == b'[' => Action::Replace(Frame::Array {
                node,
                count: 0,
                phase: ArrPhase::First,
            }),
            Node::String { min, max } if b == b'"' => Action::Replace(Frame::Str {
                min,
                max,
                chars: 0,
                esc: Esc::No,
            }),
            Node::Number { integer } if b == b'-' || b.is_ascii_digit() => {
                Action::Become(Frame::Number {
                    integer,
                    phase: NumPhase::Start,
                    len: 0,
                })
            }
            Node::Tagged { alts, .. } => Action::Become(Frame::Tag {
                node,
                pos: 0,
                alive: (0..alts.len())
                    .map(|i| u16::try_from(i).unwrap_or(u16::MAX))
                    .collect(),
            }),
            Node::Literals(l) => Action::Become(Frame::Literal {
                node,
                pos: 0,
                alive: (0..l.len())
                    .map(|i| u16::try_from(i).unwrap_or(u16::MAX))
                    .collect(),
            }),
            _ => Action::Reject,
        }
    }

    fn object(&mut self, node: NodeId, seen: u64, phase: ObjPhase, b: u8) -> Action {
        let Node::Object {
            props,
            required,
            additional,
        } = self.node(node)
        else {
            return Action::Reject;
        };
        let more = additional.is_some() || (0..props.len()).any(|i| seen & (1 << i) == 0);
        let closable = seen & required == *required;
        // Every named property (at most 64: a bit each).
        let every = match props.len() {
            0 => 0,
            n => u64::MAX >> (64 - n.min(64)),
        };
        let next = |phase| Frame::Object { node, seen, phase };
        match (phase, b) {
            (ObjPhase::First, b'}') | (ObjPhase::AfterValue, b'}') if closable => Action::Complete,
            (ObjPhase::First | ObjPhase::NextKey, b'"') if more => {
                self.set_top(next(phase));
                Action::Push(Frame::Key {
                    object: node,
                    // Every named property (at most 64: a bit each).
                    cand: every,
                    len: 0,
                    esc: Esc::No,
                })
            }
            (ObjPhase::AfterValue, b',') if more => {
                self.set_top(next(ObjPhase::NextKey));
                Action::Take
            }
            (ObjPhase::Colon(value), b':') => {
                self.set_top(next(ObjPhase::AfterValue));
                Action::Push(Frame::Value(value))
            }
            _ => Action::Reject,
        }
    }

    fn key(&mut self, object: NodeId, (cand, len): (u64, u32), esc: Esc, b: u8) -> Action {
        let Node::Object {
            props, additional, ..
        } = self.node(object)
        else {
            return Action::Reject;
        };
        let Some(Frame::Object { seen, .. }) = self.stack.iter().rev().nth(1).cloned() else {
            return Action::Reject;
        };
        let unseen = |i: usize| seen & (1 << i) == 0;
        // The candidates still a prefix after `b` (names hold no escapes,
        // so a byte of an escape matches none the way the raw byte would).
        let after = |b: u8| {
            let mut next = 0u64;
            for (i, (p, _)) in props.iter().enumerate().take(64) {
                if cand & (1 << i) != 0 && p.get(len as usize) == Some(&b) {
                    next |= 1 << i;
                }
            }
            next
        };
        if b == b'"' && esc == Esc::No {
            // The key is a name exactly when a candidate is this long.
            let named = (0..props.len().min(64))
                .find(|&i| cand & (1 << i) != 0 && props[i].0.len() == len as usize);
            let value = match (named, additional) {
                (Some(i), _) if unseen(i) => Some((i, props[i].1)),
                (Some(_), _) => return Action::Reject, // a duplicate key
                (None, Some(a)) => Some((usize::MAX, *a)),
                (None, None) => return Action::Reject,
            };
            let Some((i, value)) = value else {
                return Action::Reject;
            };
            let seen = if i == usize::MAX { seen } else { seen | 1 << i };
            let n = self.stack.len();
            self.stack[n - 2] = Frame::Object {
                node: object,
                seen,
                phase: ObjPhase::Colon(value),
            };
            return Action::Complete;
        }
        let cand = after(b);
        let esc = if additional.is_none() {
            // Only the schema's names: the key must stay a prefix of one
            // not yet used.
            if (0..props.len().min(64)).all(|i| cand & (1 << i) == 0 || !unseen(i)) {
                return Action::Reject;
            }
            esc
        } else {
            let Some(esc) = string_byte(esc, b) else {
                return Action::Reject;
            };
            // A free key is bounded; a key that is a name's prefix runs up
            // to the name (at most the schema's longest name).
            if len as usize >= MAX_FREE_KEY && cand == 0 {
                return Action::Reject;
            }
            esc
        };
        self.set_top(Frame::Key {
            object,
            cand,
            len: len + 1,
            esc,
        });
        Action::Take
    }

    fn array(&mut self, node: NodeId, count: u32, phase: ArrPhase, b: u8) -> Action {
        let Node::Array { items, min, max } = *self.node(node) else {
            return Action::Reject;
        };
        let room = max.is_none_or(|m| count < m);
        match (phase, b) {
            (ArrPhase::First | ArrPhase::AfterValue, b']') if count >= min => Action::Complete,
            (ArrPhase::AfterValue, b',') if room => {
                self.set_top(Frame::Array {
                    node,
                    count,
                    phase: ArrPhase::Next,
                });
                Action::Take
            }
            (ArrPhase::First | ArrPhase::Next, _) if room => {
                self.set_top(Frame::Array {
                    node,
                    count: count + 1,
                    phase: ArrPhase::AfterValue,
                });
                // The value's first byte goes to the value.
                Action::Descend(Frame::Value(items))
            }
            _ => Action::Reject,
        }
    }

    fn string(&mut self, min: u32, max: Option<u32>, chars: u32, esc: Esc, b: u8) -> Action {
        if b == b'"' && esc == Esc::No {
            return if chars >= min {
                Action::Complete
            } else {
                Action::Reject
            };
        }
        let Some(next) = string_byte(esc, b) else {
            return Action::Reject;
        };
        // A character starts at a byte that is not a UTF-8 continuation and
        // not inside an escape.
        let starts = esc == Esc::No && (b & 0xC0) != 0x80;
        let chars = chars + u32::from(starts);
        if max.is_some_and(|m| chars > m) {
            return Action::Reject;
        }
        self.set_top(Frame::Str {
            min,
            max,
            chars,
            esc: next,
        });
        Action::Take
    }

    fn number(&mut self, integer: bool, phase: NumPhase, len: u8, b: u8) -> Action {
        use NumPhase as P;
        let digit = b.is_ascii_digit();
        let next = match (phase, b) {
            (P::Start, b'-') => Some(P::Minus),
            (P::Start | P::Minus, b'0') => Some(P::Zero),
            (P::Start | P::Minus, b'1'..=b'9') | (P::Int, b'0'..=b'9') => Some(P::Int),
            (P::Zero | P::Int, b'.') if !integer => Some(P::Dot),
            (P::Dot | P::Frac, b'0'..=b'9') => Some(P::Frac),
            (P::Zero | P::Int | P::Frac, b'e' | b'E') if !integer => Some(P::Exp),
            (P::Exp, b'+' | b'-') => Some(P::ExpSign),
            (P::Exp | P::ExpSign | P::ExpDigits, _) if digit => Some(P::ExpDigits),
            _ => None,
        };
        match next {
            Some(phase) if len < MAX_NUMBER => {
                self.set_top(Frame::Number {
                    integer,
                    phase,
                    len: len + 1,
                });
                Action::Take
            }
            _ if number_may_end(phase) && self.stack.len() > 1 => Action::EndBefore,
            _ => Action::Reject,
        }
    }

    fn literal(&mut self, node: NodeId, pos: usize, alive: &[u16], b: u8) -> Action {
        let lits = self.literals(node);
        let next: Vec<u16> = alive
            .iter()
            .copied()
            .filter(|i| lits[usize::from(*i)].get(pos) == Some(&b))
            .collect();
        if next.is_empty() {
            let ended = alive.iter().any(|i| lits[usize::from(*i)].len() == pos);
            return if ended && self.stack.len() > 1 {
                Action::EndBefore
            } else {
                Action::Reject
            };
        }
        let pos = pos + 1;
        if next.iter().all(|i| lits[usize::from(*i)].len() == pos) {
            return Action::Complete;
        }
        self.set_top(Frame::Literal {
            node,
            pos,
            alive: next,
        });
        Action::Take
    }
}

impl Matcher {
    fn calls(&mut self, node: NodeId, count: u32, phase: CallsPhase, b: u8) -> Action {
        let Node::Calls { call, max, free } = *self.node(node) else {
            return Action::Reject;
        };
        let at = |phase| Frame::Calls { node, count, phase };
        match phase {
            CallsPhase::Open(pos) | CallsPhase::Next(pos) => {
                let opening = matches!(phase, CallsPhase::Open(_));
                let text = if opening { tools::OPEN } else { tools::NEXT }.as_bytes();
                // No call may be made: text may not begin with a call's
                // opening tag (the byte that would close it is refused).
                if max == 0 && text.get(pos) == Some(&b) && pos + 2 >= text.len() {
                    return Action::Reject;
                }
                if text.get(pos) != Some(&b) {
                    // With a free choice, output that is not a call is text.
                    return if free && opening && count == 0 {
                        Action::Become(Frame::Free { node, pos: 0 })
                    } else {
                        Action::Reject
                    };
                }
                if pos + 1 < text.len() {
                    self.set_top(at(if opening {
                        CallsPhase::Open(pos + 1)
                    } else {
                        CallsPhase::Next(pos + 1)
                    }));
                    return Action::Take;
                }
                self.set_top(at(CallsPhase::Close(0)));
                Action::Push(Frame::Value(call))
            }
            CallsPhase::Close(pos) => {
                let text = tools::CLOSE.as_bytes();
                if text.get(pos) != Some(&b) {
                    return Action::Reject;
                }
                if pos + 1 < text.len() {
                    self.set_top(at(CallsPhase::Close(pos + 1)));
                    return Action::Take;
                }
                if count + 1 >= max {
                    return Action::Complete;
                }
                self.set_top(Frame::Calls {
                    node,
                    count: count + 1,
                    phase: CallsPhase::Next(0),
                });
                Action::Take
            }
        }
    }

    /// Text, watching for [`tools::AFTER_TEXT`]: once it is whole, calls
    /// follow (none may, with `max` 0: its `>` is refused).
    fn free(&mut self, node: NodeId, pos: usize, b: u8) -> Action {
        let Node::Calls { call, max, .. } = *self.node(node) else {
            return Action::Reject;
        };
        let text = tools::AFTER_TEXT.as_bytes();
        if text.get(pos) == Some(&b) {
            if max == 0 && pos + 2 >= text.len() {
                return Action::Reject;
            }
            if pos + 1 == text.len() {
                self.set_top(Frame::Calls {
                    node,
                    count: 0,
                    phase: CallsPhase::Close(0),
                });
                return Action::Push(Frame::Value(call));
            }
            self.set_top(Frame::Free { node, pos: pos + 1 });
            return Action::Take;
        }
        // The text's only newline is its first byte: a newline starts it
        // again, anything else starts it over.
        let pos = usize::from(b == text[0]);
        self.set_top(Frame::Free { node, pos });
        Action::Take
    }

    fn tag(&mut self, node: NodeId, pos: usize, alive: &[u16], b: u8) -> Action {
        let Node::Tagged { alts, .. } = self.node(node) else {
            return Action::Reject;
        };
        let next: Vec<u16> = alive
            .iter()
            .copied()
            .filter(|i| alts[usize::from(*i)].0.get(pos) == Some(&b))
            .collect();
        let pos = pos + 1;
        match next.as_slice() {
            [] => Action::Reject,
            // No alternative's text is a prefix of another's: a whole one
            // is the only one left.
            [i] if alts[usize::from(*i)].0.len() == pos => {
                let value = alts[usize::from(*i)].1;
                self.set_top(Frame::Close { node, pos: 0 });
                Action::Push(Frame::Value(value))
            }
            _ => {
                self.set_top(Frame::Tag {
                    node,
                    pos,
                    alive: next,
                });
                Action::Take
            }
        }
    }

    fn close(&mut self, node: NodeId, pos: usize, b: u8) -> Action {
        let Node::Tagged { close, .. } = self.node(node) else {
            return Action::Reject;
        };
        if close.get(pos) != Some(&b) {
            return Action::Reject;
        }
        if pos + 1 == close.len() {
            return Action::Complete;
        }
        self.set_top(Frame::Close { node, pos: pos + 1 });
        Action::Take
    }
}

fn number_may_end(p: NumPhase) -> bool {
    matches!(
        p,
        NumPhase::Zero | NumPhase::Int | NumPhase::Frac | NumPhase::ExpDigits
    )
}

/// The escape state after byte `b` inside a string, or `None` when `b`
/// may not appear there.
fn string_byte(esc: Esc, b: u8) -> Option<Esc> {
    match esc {
        Esc::No if b == b'\\' => Some(Esc::Backslash),
        Esc::No if b < 0x20 => None,
        Esc::No => Some(Esc::No),
        Esc::Backslash => match b {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Some(Esc::No),
            b'u' => Some(Esc::Hex(4)),
            _ => None,
        },
        Esc::Hex(n) if b.is_ascii_hexdigit() => {
            Some(if n == 1 { Esc::No } else { Esc::Hex(n - 1) })
        }
        Esc::Hex(_) => None,
    }
}
