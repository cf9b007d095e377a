//! A row's token ids and which of them are trained.
//!
//! The ids are what `apply_chat_template(messages, tokenize=True)` gives: the
//! conversation rendered with the model's own template, tokenized without added
//! special tokens. The trained tokens are found portably, as TRL finds a
//! completion: each assistant turn is where the rendering of the conversation up
//! to it (with the generation prompt) ends, and it ends where the rendering that
//! includes it ends; both must tokenize to a prefix of the whole, or the row is
//! refused. Within a turn, the tokens after its last special token (the
//! end-of-turn token: `<|im_end|>`, `<|eot_id|>`, `</s>`) are not trained: the
//! newline a template writes after it is never generated.

use std::collections::HashSet;

use tokenizers::Tokenizer;

use super::rows::Example;
use crate::{
    config::TrainOn,
    data::chat_template::{ChatTemplate, Message},
};

/// Token ids and, per id, whether the loss is computed on predicting it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Encoded {
    pub ids: Vec<u32>,
    pub trained: Vec<bool>,
}

pub struct Encoder {
    pub tokenizer: Tokenizer,
    pub template: Option<ChatTemplate>,
    /// Resolved: never `Auto`.
    pub train_on: TrainOn,
    /// Appended to plain-text completions that do not end with it.
    pub eos: String,
    special: HashSet<u32>,
}

impl Encoder {
    pub fn new(tokenizer: Tokenizer, template: Option<ChatTemplate>, train_on: TrainOn, eos: String) -> Encoder {
        let special = tokenizer.get_added_tokens_decoder().into_iter().filter(|(_, t)| t.special).map(|(id, _)| id).collect();
        Encoder { tokenizer, template, train_on, eos, special }
    }

    fn ids(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, String> {
        Ok(self.tokenizer.encode(text, add_special_tokens).map_err(|e| format!("the tokenizer failed: {e}"))?.get_ids().to_vec())
    }

    fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String, String> {
        let template =
            self.template.as_ref().ok_or("the tokenizer has no chat template (tokenizer_config.json `chat_template` or chat_template.jinja)")?;
        template.render(messages, add_generation_prompt).map_err(|e| e.to_string())
    }

    /// The tokens of `messages[..upto]` rendered: their count, checked to be a
    /// prefix of `whole`.
    fn prefix_len(&self, messages: &[Message], upto: usize, generation_prompt: bool, whole: &[u32]) -> Result<usize, String> {
        let ids = self.ids(&self.render(&messages[..upto], generation_prompt)?, false)?;
        if !whole.starts_with(&ids) {
            return Err(format!(
                "the chat template's rendering of the first {upto} messages{} is not a prefix of the whole conversation's, \
                 so the trained tokens cannot be told apart (a template that renders earlier turns differently, or tokens \
                 that merge across the turn boundary); use data.train_on = \"all\" or another template",
                if generation_prompt { " with the generation prompt" } else { "" }
            ));
        }
        Ok(ids.len())
    }

    /// Marks `[start, end)` trained up to and including its last special token.
    fn train_turn(&self, out: &mut Encoded, start: usize, end: usize) {
        let last_special = (start..end).rev().find(|&i| self.special.contains(&out.ids[i]));
        let end = last_special.map_or(end, |i| i + 1);
        out.trained[start..end].iter_mut().for_each(|t| *t = true);
    }

    pub fn encode(&self, example: &Example) -> Result<Encoded, String> {
        match example {
            Example::Chat(messages) => self.chat(messages),
            Example::Conversation { prompt, completion } => {
                let all: Vec<Message> = prompt.iter().chain(completion).cloned().collect();
                let ids = self.ids(&self.render(&all, false)?, false)?;
                let mut out = Encoded { trained: vec![self.train_on == TrainOn::All; ids.len()], ids };
                if self.train_on != TrainOn::All {
                    let start = self.prefix_len(&all, prompt.len(), true, &out.ids)?;
                    let end = out.ids.len();
                    self.train_turn(&mut out, start, end);
                }
                Ok(out)
            }
            Example::Text { prompt, completion } => {
                // As TRL: EOS closes the completion, and the completion starts where
                // the tokenized prompt and prompt + completion diverge.
                let mut text = format!("{prompt}{completion}");
                if !self.eos.is_empty() && !completion.ends_with(&self.eos) {
                    text.push_str(&self.eos);
                }
                let ids = self.ids(&text, true)?;
                let prompt_ids = self.ids(prompt, true)?;
                let start = prompt_ids.iter().zip(&ids).take_while(|(a, b)| a == b).count();
                let trained = (0..ids.len()).map(|i| self.train_on == TrainOn::All || i >= start).collect();
                Ok(Encoded { ids, trained })
            }
        }
    }

    fn chat(&self, messages: &[Message]) -> Result<Encoded, String> {
        let ids = self.ids(&self.render(messages, false)?, false)?;
        let mut out = Encoded { trained: vec![self.train_on == TrainOn::All; ids.len()], ids };
        if self.train_on == TrainOn::All {
            return Ok(out);
        }
        let last = messages.iter().rposition(|m| m.role == "assistant");
        for (i, _) in messages.iter().enumerate().filter(|(_, m)| m.role == "assistant") {
            if self.train_on == TrainOn::LastAssistant && Some(i) != last {
                continue;
            }
            let start = self.prefix_len(messages, i, true, &out.ids)?;
            let end = self.prefix_len(messages, i + 1, false, &out.ids)?;
            if end < start {
                return Err(format!("assistant message {i} renders to no tokens after its generation prompt"));
            }
            self.train_turn(&mut out, start, end);
        }
        Ok(out)
    }
}
