//! A row's token ids and which of them are trained.
//!
//! The ids are what `apply_chat_template(messages, tools=tools, tokenize=True)`
//! gives: the conversation rendered with the model's own template, tokenized
//! without added special tokens. Which are trained (for `train_on = "assistant"`):
//!
//! - a template with `{% generation %}` marks: the tokens the marks enclose,
//!   exactly as transformers' `return_assistant_tokens_mask` finds them (the
//!   masks TRL's `assistant_only_loss` trains);
//! - otherwise, each assistant turn (tool-call turns too) found portably, as TRL
//!   finds a completion: it starts where the rendering of the conversation up to it
//!   with the generation prompt ends, and ends where the rendering that includes it
//!   ends; both must tokenize to a prefix of the whole, or the row is refused.
//!   Within a turn, the tokens after its last special token (the end-of-turn
//!   token: `<|im_end|>`, `<|eot_id|>`, `</s>`) are not trained: the newline a
//!   template writes after it is never generated. Tool results and every other
//!   message are context.
//!
//! Checking a prefix does not re-encode it whole: text between added tokens
//! (`<|im_start|>`, `<|im_end|>`) is tokenized on its own, so a prefix's ids are
//! the whole's up to its last added token and then those of its short tail; the
//! tail alone is encoded and compared. When that does not match (or added tokens
//! strip whitespace), the prefix is encoded whole, as before.
//!
//! Rows going to the cache are encoded without offsets, through [`WordIds`]
//! (each word's ids remembered per thread); `ptrain tokenize --show` and
//! templates with `{% generation %}` marks need each token's place in the text
//! and take the tokenizer's `encode`.

use std::collections::HashSet;

use tokenizers::Tokenizer;

use super::{
    chat::{Chat, Example},
    words::WordIds,
};
use crate::{config::TrainOn, data::chat_template::ChatTemplate};

/// Token ids and, per id, whether the loss is computed on predicting it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Encoded {
    pub ids: Vec<u32>,
    pub trained: Vec<bool>,
    /// Why nothing is trained, when nothing is.
    pub untrained: Option<String>,
}

impl Encoded {
    /// Whether a token other than the first (never a target) is trained.
    pub fn trains(&self) -> bool {
        self.trained.iter().skip(1).any(|&t| t)
    }
}

/// A row as the model sees it, for `ptrain tokenize --show`: the text and where
/// each token lies in it (bytes).
pub struct Shown {
    pub text: String,
    /// Empty when the row was encoded for the cache (offsets not needed).
    pub offsets: Vec<(usize, usize)>,
    pub encoded: Encoded,
    /// Per added token (`<|im_start|>`, `<|im_end|>`): the count of ids up to
    /// and including it, and the byte where it ends.
    added: Vec<(usize, usize)>,
}

impl Shown {
    pub fn new(text: String, offsets: Vec<(usize, usize)>, encoded: Encoded) -> Shown {
        Shown { text, offsets, encoded, added: Vec::new() }
    }

    fn tokens(&self) -> Tokens<'_> {
        Tokens { text: &self.text, ids: &self.encoded.ids, added: &self.added }
    }
}

pub struct Encoder {
    pub tokenizer: Tokenizer,
    pub template: Option<ChatTemplate>,
    /// Resolved: never `Auto`.
    pub train_on: TrainOn,
    /// Appended to plain-text completions that do not end with it.
    pub eos: String,
    special: HashSet<u32>,
    /// Added tokens, at which the tokenizer splits its input before anything
    /// else; empty when one of them strips whitespace (the split then moves).
    splits: HashSet<u32>,
    words: WordIds,
}

/// A tokenized text.
struct Tokens<'a> {
    text: &'a str,
    ids: &'a [u32],
    added: &'a [(usize, usize)],
}

const NO_TEMPLATE: &str = "the tokenizer has no chat template (tokenizer_config.json `chat_template` or chat_template.jinja)";

impl Encoder {
    pub fn new(tokenizer: Tokenizer, template: Option<ChatTemplate>, train_on: TrainOn, eos: String) -> Encoder {
        let added = tokenizer.get_added_tokens_decoder();
        let special = added.iter().filter(|(_, t)| t.special).map(|(&id, _)| id).collect();
        let plain = added.values().all(|t| !t.lstrip && !t.rstrip && !t.single_word);
        let splits = if plain { added.keys().copied().collect() } else { HashSet::new() };
        let words = WordIds::new(&tokenizer);
        Encoder { tokenizer, template, train_on, eos, special, splits, words }
    }

    pub(crate) fn ids(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, String> {
        Ok(self.tokenizer.encode_fast(text, add_special_tokens).map_err(|e| format!("the tokenizer failed: {e}"))?.get_ids().to_vec())
    }

    fn template(&self) -> Result<&ChatTemplate, String> {
        self.template.as_ref().ok_or_else(|| NO_TEMPLATE.to_string())
    }

    /// The text of `chat`'s first `upto` messages.
    fn render(&self, chat: &Chat, upto: usize, add_generation_prompt: bool) -> Result<String, String> {
        let mut part = chat.conversation();
        part.messages = &chat.messages[..upto];
        Ok(self.template()?.render(part, add_generation_prompt)?.text)
    }

    /// The tokens of `text` (the rendering of the first `upto` messages): their
    /// count, checked to be a prefix of `whole`.
    fn prefix_len(&self, text: &str, upto: usize, generation_prompt: bool, whole: &Tokens) -> Result<usize, String> {
        if let Some(n) = self.prefix_by_tail(text, whole)? {
            return Ok(n);
        }
        let ids = self.words.ids(&self.tokenizer, text)?.ids;
        if !whole.ids.starts_with(&ids) {
            return Err(format!(
                "the chat template's rendering of the first {upto} messages{} is not a prefix of the whole conversation's, \
                 so the trained tokens cannot be told apart (a template that renders earlier turns differently, or tokens \
                 that merge across the turn boundary); use data.train_on = \"all\" or another template",
                if generation_prompt { " with the generation prompt" } else { "" }
            ));
        }
        Ok(ids.len())
    }

    /// The token count of `text` as a prefix of `whole`, from the tail after its
    /// last added token alone; `None` when that cannot tell.
    fn prefix_by_tail(&self, text: &str, whole: &Tokens) -> Result<Option<usize>, String> {
        if self.splits.is_empty() || !whole.text.starts_with(text) {
            return Ok(None);
        }
        let Some(&(count, end)) = whole.added.iter().rev().find(|&&(_, end)| end <= text.len()) else {
            return Ok(None);
        };
        let tail = self.words.ids(&self.tokenizer, &text[end..])?.ids;
        Ok(whole.ids[count..].starts_with(&tail).then(|| count + tail.len()))
    }

    /// Marks `[start, end)` trained up to and including its last special token.
    fn train_turn(&self, out: &mut Encoded, start: usize, end: usize) {
        let last_special = (start..end).rev().find(|&i| self.special.contains(&out.ids[i]));
        let end = last_special.map_or(end, |i| i + 1);
        out.trained[start..end].iter_mut().for_each(|t| *t = true);
    }

    pub fn encode(&self, example: &Example) -> Result<Encoded, String> {
        self.shown(example, false).map(|s| s.encoded)
    }

    /// The row's text, tokens (with their places in the text) and trained tokens.
    pub fn show(&self, example: &Example) -> Result<Shown, String> {
        self.shown(example, true)
    }

    fn shown(&self, example: &Example, offsets: bool) -> Result<Shown, String> {
        let mut shown = match example {
            Example::Chat(chat) => self.chat(chat, offsets)?,
            Example::Conversation { chat, prompt } => {
                let rendered = self.template()?.render(chat.conversation(), false)?;
                let mut shown = self.tokens(rendered.text, offsets)?;
                if self.train_on != TrainOn::All {
                    let start = self.prefix_len(&self.render(chat, *prompt, true)?, *prompt, true, &shown.tokens())?;
                    let end = shown.encoded.ids.len();
                    self.train_turn(&mut shown.encoded, start, end);
                }
                shown
            }
            Example::Text { prompt, completion } => {
                // As TRL: EOS closes the completion, and the completion starts where
                // the tokenized prompt and prompt + completion diverge.
                let mut text = format!("{prompt}{completion}");
                if !self.eos.is_empty() && !completion.ends_with(&self.eos) {
                    text.push_str(&self.eos);
                }
                let encoding = self.tokenizer.encode(text.as_str(), true).map_err(|e| format!("the tokenizer failed: {e}"))?;
                let ids = encoding.get_ids().to_vec();
                let prompt_ids = self.ids(prompt, true)?;
                let start = prompt_ids.iter().zip(&ids).take_while(|(a, b)| a == b).count();
                let trained = (0..ids.len()).map(|i| self.train_on == TrainOn::All || i >= start).collect();
                Shown::new(text, encoding.get_offsets().to_vec(), Encoded { ids, trained, untrained: None })
            }
        };
        if !shown.encoded.trains() && shown.encoded.untrained.is_none() {
            shown.encoded.untrained = Some(match (example, self.train_on) {
                (Example::Text { .. }, _) => "the completion adds no token after the prompt".into(),
                _ => "the chat template renders the trained messages to no tokens after their generation prompt".into(),
            });
        }
        Ok(shown)
    }

    /// `text` tokenized (without special tokens), nothing trained yet; with each
    /// token's offsets when `offsets`.
    fn tokens(&self, text: String, offsets: bool) -> Result<Shown, String> {
        let (ids, offsets, added) = if offsets {
            let encoding = self.tokenizer.encode(text.as_str(), false).map_err(|e| format!("the tokenizer failed: {e}"))?;
            let (ids, offsets) = (encoding.get_ids().to_vec(), encoding.get_offsets().to_vec());
            let added = (0..ids.len()).filter(|&t| self.splits.contains(&ids[t])).map(|t| (t + 1, offsets[t].1)).collect();
            (ids, offsets, added)
        } else {
            let found = self.words.ids(&self.tokenizer, &text)?;
            (found.ids, Vec::new(), found.added)
        };
        let encoded = Encoded { trained: vec![self.train_on == TrainOn::All; ids.len()], ids, untrained: None };
        Ok(Shown { offsets, text, encoded, added })
    }

    fn chat(&self, chat: &Chat, offsets: bool) -> Result<Shown, String> {
        let template = self.template()?;
        let rendered = template.render(chat.conversation(), false)?;
        let marked = rendered.marked.clone();
        // `{% generation %}` spans are found by the tokens' offsets.
        let mut shown = self.tokens(rendered.text, offsets || template.has_marks)?;
        if self.train_on == TrainOn::All {
            return Ok(shown);
        }
        if template.has_marks {
            let spans = generation_tokens(&shown.text, &shown.offsets, &marked);
            let spans = if self.train_on == TrainOn::LastAssistant { spans.last().cloned().into_iter().collect() } else { spans };
            for (start, end) in spans {
                shown.encoded.trained[start..end].iter_mut().for_each(|t| *t = true);
            }
            if !shown.encoded.trains() {
                shown.encoded.untrained = Some("the chat template's {% generation %} marks enclose no token of this row".into());
            }
            return Ok(shown);
        }
        let assistant = |m: &minijinja::Value| m.get_attr("role").ok().and_then(|r| r.as_str().map(|r| r == "assistant")).unwrap_or(false);
        let last = chat.messages.iter().rposition(assistant);
        for i in (0..chat.messages.len()).filter(|&i| assistant(&chat.messages[i])) {
            if self.train_on == TrainOn::LastAssistant && Some(i) != last {
                continue;
            }
            let with_prompt = self.render(chat, i, true)?;
            if with_prompt == self.render(chat, i, false)? {
                shown.encoded.untrained = Some(
                    "the chat template writes nothing for add_generation_prompt, so an assistant reply cannot be told from its header; \
                     use a template with a generation prompt or {% generation %} marks, or data.train_on = \"all\""
                        .into(),
                );
                shown.encoded.trained.iter_mut().for_each(|t| *t = false);
                return Ok(shown);
            }
            let start = self.prefix_len(&with_prompt, i, true, &shown.tokens())?;
            let end = self.prefix_len(&self.render(chat, i + 1, false)?, i + 1, false, &shown.tokens())?;
            if end < start {
                return Err(format!("assistant message {i} renders to no tokens after its generation prompt"));
            }
            self.train_turn(&mut shown.encoded, start, end);
        }
        Ok(shown)
    }
}

/// The token ranges `{% generation %}` spans cover, found as transformers finds
/// them: from the token holding a span's first character to the token holding
/// its last (to the end when that is token 0 or none); a span whose first
/// character is in no token ends the search.
fn generation_tokens(text: &str, offsets: &[(usize, usize)], spans: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let token_at = |pos: usize| offsets.iter().position(|&(s, e)| pos >= s && pos < e);
    let mut out = Vec::new();
    for &(start, end) in spans {
        let Some(first) = token_at(start) else { break };
        // The last character's first byte (Python indexes characters).
        let last_char = text[..end].char_indices().next_back().map(|(i, _)| i);
        let last = match last_char.and_then(token_at) {
            Some(t) if t > 0 => t + 1,
            _ => offsets.len(),
        };
        if last > first {
            out.push((first, last));
        }
    }
    out
}
