//! A row's ids without building an `Encoding`, with each pre-tokenized word's ids
//! remembered per thread. Chat data repeats its words massively; the `tokenizers`
//! pipeline (`encode`) tokenizes each word with the model again (its BPE cache
//! saves the merges, not the `Token`s and strings built per token) and then builds
//! an `Encoding` with offsets, token strings and type ids that rows never read.
//!
//! The steps are the pipeline's own, called through its public API: added tokens
//! split out and the rest normalized (`extract_and_normalize`), pre-tokenized, then
//! each word's ids from the model, from the cache when seen before. The model
//! tokenizes a word by its text alone, so the ids are `encode(text, false)`'s (the
//! tokenizer is loaded without truncation or padding, and post-processing adds
//! nothing without special tokens); a model that samples (BPE dropout) is never
//! cached.

use std::{cell::RefCell, collections::HashMap, sync::atomic::AtomicU64};

use tokenizers::{Model, ModelWrapper, OffsetReferential, OffsetType, PreTokenizer, Tokenizer};

/// Words remembered per thread before the cache starts over (bounds its memory:
/// about 100 bytes a word).
const CAPACITY: usize = 1 << 18;

/// Tells encoders (and so tokenizers) apart in a thread's cache.
static NEXT_OWNER: AtomicU64 = AtomicU64::new(0);

/// A word's text (after normalizing and pre-tokenizing) and its ids.
type Words = HashMap<String, Box<[u32]>>;

thread_local! {
    /// The encoder that filled it, and its words.
    static WORDS: RefCell<(u64, Words)> = RefCell::new((u64::MAX, HashMap::new()));
}

/// The ids of a text and where its added tokens are.
pub struct Ids {
    pub ids: Vec<u32>,
    /// Per added token (`<|im_start|>`): the count of ids up to and including it,
    /// and the byte where it ends in the text.
    pub added: Vec<(usize, usize)>,
}

pub struct WordIds {
    owner: u64,
    cacheable: bool,
}

impl WordIds {
    pub fn new(tokenizer: &Tokenizer) -> WordIds {
        let cacheable = match tokenizer.get_model() {
            ModelWrapper::BPE(bpe) => bpe.dropout.is_none_or(|p| p == 0.0),
            _ => true,
        };
        WordIds { owner: NEXT_OWNER.fetch_add(1, std::sync::atomic::Ordering::Relaxed), cacheable }
    }

    /// `text`'s ids as `tokenizer.encode(text, false)` gives them.
    pub fn ids(&self, tokenizer: &Tokenizer, text: &str) -> Result<Ids, String> {
        let failed = |e: tokenizers::Error| format!("the tokenizer failed: {e}");
        let mut pretokenized = tokenizer.get_added_vocabulary().extract_and_normalize(tokenizer.get_normalizer(), text);
        if let Some(pre) = tokenizer.get_pre_tokenizer() {
            pre.pre_tokenize(&mut pretokenized).map_err(failed)?;
        }
        let model = tokenizer.get_model();
        let mut out = Ids { ids: Vec::with_capacity(text.len() / 3), added: Vec::new() };
        WORDS.with_borrow_mut(|(owner, words)| {
            if *owner != self.owner || words.len() >= CAPACITY {
                *owner = self.owner;
                words.clear();
            }
            for (word, (_, end), tokens) in pretokenized.get_splits(OffsetReferential::Original, OffsetType::Byte) {
                if let Some(tokens) = tokens {
                    // Only added tokens are tokenized before the model runs.
                    out.ids.extend(tokens.iter().map(|t| t.id));
                    out.added.push((out.ids.len(), end));
                    continue;
                }
                if let Some(ids) = words.get(word) {
                    out.ids.extend_from_slice(ids);
                    continue;
                }
                let ids: Box<[u32]> = model.tokenize(word).map_err(failed)?.iter().map(|t| t.id).collect();
                out.ids.extend_from_slice(&ids);
                if self.cacheable {
                    words.insert(word.to_string(), ids);
                }
            }
            Ok(out)
        })
    }
}
