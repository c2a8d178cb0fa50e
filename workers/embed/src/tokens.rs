//! Inputs as the model reads them: the model's own `tokenizer.json` (BERT's
//! normaliser, pre-tokeniser and WordPiece, `[CLS] … [SEP]`), truncated at
//! `max_seq_length` tokens as sentence-transformers truncates, never padded.

use crate::{EmbedConfig, EmbedError};
use std::path::Path;

/// One input, ready for the encoder: `[CLS]`, word pieces, `[SEP]`, at
/// most `max_seq_length` tokens, every id in the vocabulary. Only this
/// crate makes one, so the encoder never sees an unchecked id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tokens {
    ids: Vec<u32>,
    /// Word pieces dropped to fit `max_seq_length`.
    truncated: usize,
}

impl Tokens {
    /// The ids, special tokens included.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Tokens the encoder computes (special tokens included).
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Never: an input has at least its two special tokens.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Word pieces dropped to fit the model's limit.
    pub fn truncated(&self) -> usize {
        self.truncated
    }
}

/// The model's tokenizer with its truncation set.
pub(crate) struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    cls: u32,
    sep: u32,
    max: usize,
    vocab: usize,
}

impl TextTokenizer {
    /// Reads `tokenizer.json` under `dir`.
    pub(crate) fn read(dir: &Path, config: &EmbedConfig) -> Result<Self, EmbedError> {
        let path = dir.join("tokenizer.json");
        let mut inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| EmbedError::Tokenizer(format!("{}: {e}", path.display())))?;
        // The file pads and truncates to 128; sentence-transformers reads
        // `max_seq_length` (256) instead, and packing needs no padding.
        inner.with_padding(None);
        inner
            .with_truncation(None)
            .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
        let special = |t: &str| {
            inner
                .token_to_id(t)
                .ok_or_else(|| EmbedError::Tokenizer(format!("no {t} token")))
        };
        let (cls, sep) = (special("[CLS]")?, special("[SEP]")?);
        let vocab = inner.get_vocab_size(true);
        if vocab > config.vocab_size {
            return Err(EmbedError::Tokenizer(format!(
                "{vocab} tokens, the model embeds {}",
                config.vocab_size
            )));
        }
        Ok(TextTokenizer {
            inner,
            cls,
            sep,
            max: config.max_seq_length,
            vocab,
        })
    }

    /// `text` tokenized, `[CLS]`/`[SEP]` added, truncated to the limit.
    pub(crate) fn encode(&self, text: &str) -> Result<Tokens, EmbedError> {
        let pieces = self
            .inner
            .encode(text, false)
            .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
        Ok(self.wrap_checked(pieces.get_ids()))
    }

    /// Ids a client gave, checked against the vocabulary, then as
    /// [`encode`](Self::encode) would have made them.
    pub(crate) fn wrap(&self, ids: &[u32]) -> Result<Tokens, EmbedError> {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.vocab) {
            return Err(EmbedError::UnknownToken {
                id,
                vocab: self.vocab,
            });
        }
        Ok(self.wrap_checked(ids))
    }

    fn wrap_checked(&self, pieces: &[u32]) -> Tokens {
        let keep = pieces.len().min(self.max - 2);
        let mut ids = Vec::with_capacity(keep + 2);
        ids.push(self.cls);
        ids.extend_from_slice(&pieces[..keep]);
        ids.push(self.sep);
        Tokens {
            ids,
            truncated: pieces.len() - keep,
        }
    }
}
