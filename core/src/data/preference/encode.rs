//! A pair's tokens exactly as TRL 1.16's `DPOTrainer` makes them: the prompt
//! tokenized alone (with the generation prompt, for conversations), prompt + chosen
//! and prompt + rejected tokenized whole; the completions start where the prompt's
//! tokens and each whole's first differ (`common_prefix_length`, the smaller of the
//! two), so a template that renders the prompt alone differently, or tokens that
//! merge across the boundary, never put prompt tokens in a completion. Plain text
//! gets the tokenizer's special tokens (as `tokenizer(text)` adds them) and the EOS
//! after each completion that does not end with it; a conversation's text is the
//! template's, tokenized without adding any (as `apply_chat_template` does), so no
//! BOS or EOS is doubled (TRL #1930, axolotl #1616).

use super::rows::Pair;
use crate::data::instruct::encode::Encoder;

/// A pair's ids: the shared prompt, then each completion.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EncodedPair {
    pub prompt: Vec<u32>,
    pub chosen: Vec<u32>,
    pub rejected: Vec<u32>,
}

fn ids(encoder: &Encoder, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, String> {
    Ok(encoder.tokenizer.encode_fast(text, add_special_tokens).map_err(|e| format!("the tokenizer failed: {e}"))?.get_ids().to_vec())
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The pair's ids; an error when a completion adds no token after the prompt.
pub fn encode(encoder: &Encoder, pair: &Pair) -> Result<EncodedPair, String> {
    let (prompt, whole_chosen, whole_rejected) = match pair {
        Pair::Text { prompt, chosen, rejected } => {
            let eos = |c: &str| if encoder.eos.is_empty() || c.ends_with(&encoder.eos) { c.to_string() } else { format!("{c}{}", encoder.eos) };
            (
                ids(encoder, prompt, true)?,
                ids(encoder, &format!("{prompt}{}", eos(chosen)), true)?,
                ids(encoder, &format!("{prompt}{}", eos(rejected)), true)?,
            )
        }
        Pair::Conversation { chat, chosen, rejected } => {
            let template = encoder
                .template
                .as_ref()
                .ok_or("conversational pairs need a chat template (tokenizer_config.json `chat_template` or chat_template.jinja)")?;
            let render = |completion: &[minijinja::Value], generation_prompt: bool| -> Result<Vec<u32>, String> {
                let mut all = chat.clone();
                all.messages.extend(completion.iter().cloned());
                ids(encoder, &template.render(all.conversation(), generation_prompt)?.text, false)
            };
            (render(&[], true)?, render(chosen, false)?, render(rejected, false)?)
        }
    };
    let at = common_prefix(&prompt, &whole_chosen).min(common_prefix(&prompt, &whole_rejected));
    let out = EncodedPair { prompt: prompt[..at].to_vec(), chosen: whole_chosen[at..].to_vec(), rejected: whole_rejected[at..].to_vec() };
    match (out.chosen.is_empty(), out.rejected.is_empty()) {
        (true, _) => Err("the chosen completion adds no token after the prompt".into()),
        (_, true) => Err("the rejected completion adds no token after the prompt".into()),
        _ => Ok(out),
    }
}
