//! The tokenizer, built from a GGUF file's `tokenizer.ggml.*` metadata.
//!
//! candle's own GGUF tokenizer adds a prefix space for `pre = "smollm"` and
//! gets ids wrong; this one follows llama.cpp: byte-level BPE without prefix
//! space, digits split one by one, and every control or user-defined token
//! (token types 3 and 4) matched as a special token.

use crate::error::LoadError;
use candle_core::quantized::gguf_file::Value;
use std::collections::HashMap;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{AddedToken, PreTokenizerWrapper};

/// A GGUF file's metadata, as the loader reads it.
pub(crate) type Metadata = HashMap<String, Value>;

/// A text could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot tokenize the input: {0}")]
pub struct TokenizeError(String);

/// Token ids to and from text, for one model.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos: Option<u32>,
    eos: u32,
    add_bos: bool,
    tokens: Vec<String>,
    /// Each token's bytes; `None` for special tokens, which no constrained
    /// output may contain.
    bytes: Vec<Option<Box<[u8]>>>,
    /// The same, sorted by bytes (what constrained sampling walks).
    sorted: crate::vocab::SortedVocab,
}

impl Tokenizer {
    pub(crate) fn from_gguf(md: &Metadata) -> Result<Self, LoadError> {
        let get = |k: &str| {
            md.get(k)
                .ok_or_else(|| LoadError::Missing(format!("metadata key {k}")))
        };
        let model = get("tokenizer.ggml.model")?.to_string().map_err(err)?;
        if model != "gpt2" {
            return Err(LoadError::Tokenizer(format!(
                "tokenizer model {model:?} (only byte-level BPE, \"gpt2\", is supported)"
            )));
        }
        let tokens: Vec<String> = get("tokenizer.ggml.tokens")?
            .to_vec()
            .map_err(err)?
            .iter()
            .map(|v| v.to_string().cloned().map_err(err))
            .collect::<Result<_, _>>()?;
        let merges: Vec<(String, String)> = get("tokenizer.ggml.merges")?
            .to_vec()
            .map_err(err)?
            .iter()
            .map(|v| {
                let m = v.to_string().map_err(err)?;
                m.split_once(' ')
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
                    .ok_or_else(|| LoadError::Tokenizer(format!("merge without a space: {m:?}")))
            })
            .collect::<Result<_, _>>()?;
        let types: Vec<i32> = match md.get("tokenizer.ggml.token_type") {
            Some(v) => v
                .to_vec()
                .map_err(err)?
                .iter()
                .map(|t| t.to_i32().map_err(err))
                .collect::<Result<_, _>>()?,
            None => Vec::new(),
        };
        let id = |k: &str| -> Result<Option<u32>, LoadError> {
            md.get(k).map(|v| v.to_u32().map_err(err)).transpose()
        };
        let eos = id("tokenizer.ggml.eos_token_id")?
            .ok_or_else(|| LoadError::Missing("tokenizer.ggml.eos_token_id".into()))?;
        let bos = id("tokenizer.ggml.bos_token_id")?;
        let add_bos = md
            .get("tokenizer.ggml.add_bos_token")
            .map(|v| v.to_bool().map_err(err))
            .transpose()?
            .unwrap_or(false);

        let vocab: Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), u32::try_from(i).unwrap_or(u32::MAX)))
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| LoadError::Tokenizer(e.to_string()))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(Sequence::new(vec![
            PreTokenizerWrapper::Digits(Digits::new(true)),
            PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true)),
        ]))));
        inner.with_decoder(Some(ByteLevel::default()));
        let specials: Vec<AddedToken> = tokens
            .iter()
            .zip(&types)
            .filter(|(_, t)| matches!(t, 3 | 4))
            .map(|(tok, _)| AddedToken::from(tok.clone(), true))
            .collect();
        inner
            .add_special_tokens(specials)
            .map_err(|e| LoadError::Tokenizer(e.to_string()))?;
        let bytes = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let special = matches!(types.get(i), Some(2..=5));
                if special { None } else { byte_level_bytes(t) }
            })
            .collect::<Vec<_>>();
        let sorted = crate::vocab::SortedVocab::new(&bytes);
        Ok(Tokenizer {
            inner,
            bos,
            eos,
            add_bos,
            tokens,
            bytes,
            sorted,
        })
    }

    /// Encodes text; special tokens written in the text (`<|im_start|>`) are
    /// recognised. Adds BOS when the model asks for it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizeError> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| TokenizeError(e.to_string()))?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if self.add_bos {
            ids.extend(self.bos);
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// Decodes ids to text, dropping special tokens if asked.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        self.inner.decode(ids, skip_special).unwrap_or_default()
    }

    /// The end-of-sequence token.
    pub fn eos(&self) -> u32 {
        self.eos
    }

    /// The bytes token `id` stands for; `None` for a special token or an
    /// id outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.bytes.get(id as usize).and_then(|b| b.as_deref())
    }

    /// Which tokens (by id) the grammar state `m` takes next, found by one
    /// walk of the vocabulary sorted by bytes (what constrained sampling
    /// does each step; end-of-sequence is not decided here).
    pub fn accepted_by(&self, m: &bulkhead_grammar::Matcher) -> Vec<bool> {
        let mut accepted = vec![false; self.bytes.len()];
        self.sorted
            .accepted(m, |id| self.token_bytes(id), &mut accepted);
        accepted
    }

    pub(crate) fn bos_text(&self) -> String {
        self.bos
            .and_then(|b| self.tokens.get(b as usize).cloned())
            .unwrap_or_default()
    }

    pub(crate) fn eos_text(&self) -> String {
        self.tokens
            .get(self.eos as usize)
            .cloned()
            .unwrap_or_default()
    }
}

/// The bytes of a byte-level BPE token: GPT-2 writes byte `b` as the
/// character `b` when it is printable (`!`..=`~`, `¡`..=`¬`, `®`..=`ÿ`) and
/// as `U+0100 + n` for the n-th other byte, in order.
fn byte_level_bytes(token: &str) -> Option<Box<[u8]>> {
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut others = [0u8; 68];
    let mut n = 0;
    for b in 0..=255u8 {
        if !printable(u32::from(b)) {
            others[n] = b;
            n += 1;
        }
    }
    token
        .chars()
        .map(|c| {
            let c = u32::from(c);
            if printable(c) {
                u8::try_from(c).ok()
            } else {
                c.checked_sub(256)
                    .and_then(|i| others.get(i as usize).copied())
                    .filter(|_| c - 256 < n as u32)
            }
        })
        .collect::<Option<Vec<u8>>>()
        .map(Vec::into_boxed_slice)
}

#[allow(clippy::needless_pass_by_value)] // Used as `map_err(err)`.
fn err(e: candle_core::Error) -> LoadError {
    LoadError::Tokenizer(e.to_string())
}
