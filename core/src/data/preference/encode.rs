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
use crate::data::text::encode::{Encoded, Encoder, Shown};

/// A pair's ids: the shared prompt, then each completion.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EncodedPair {
    pub prompt: Vec<u32>,
    pub chosen: Vec<u32>,
    pub rejected: Vec<u32>,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The texts a pair is tokenized from (the prompt, prompt + chosen, prompt +
/// rejected) and whether the tokenizer adds its special tokens to them.
fn texts(encoder: &Encoder, pair: &Pair) -> Result<([String; 3], bool), String> {
    match pair {
        Pair::Text { prompt, chosen, rejected } => {
            let eos = |c: &str| if encoder.eos.is_empty() || c.ends_with(&encoder.eos) { c.to_string() } else { format!("{c}{}", encoder.eos) };
            Ok(([prompt.clone(), format!("{prompt}{}", eos(chosen)), format!("{prompt}{}", eos(rejected))], true))
        }
        Pair::Conversation { chat, chosen, rejected } => {
            let template = encoder
                .template
                .as_ref()
                .ok_or("conversational pairs need a chat template (tokenizer_config.json `chat_template` or chat_template.jinja)")?;
            let render = |completion: &[minijinja::Value], generation_prompt: bool| -> Result<String, String> {
                let mut all = chat.clone();
                all.messages.extend(completion.iter().cloned());
                Ok(template.render(all.conversation(), generation_prompt)?.text)
            };
            Ok(([render(&[], true)?, render(chosen, false)?, render(rejected, false)?], false))
        }
    }
}

/// The pair's ids from the prompt's and each whole's; an error when a completion
/// adds no token after the prompt.
fn split(prompt: &[u32], whole_chosen: &[u32], whole_rejected: &[u32]) -> Result<EncodedPair, String> {
    let at = common_prefix(prompt, whole_chosen).min(common_prefix(prompt, whole_rejected));
    let out = EncodedPair { prompt: prompt[..at].to_vec(), chosen: whole_chosen[at..].to_vec(), rejected: whole_rejected[at..].to_vec() };
    match (out.chosen.is_empty(), out.rejected.is_empty()) {
        (true, _) => Err("the chosen completion adds no token after the prompt".into()),
        (_, true) => Err("the rejected completion adds no token after the prompt".into()),
        _ => Ok(out),
    }
}

/// The pair's ids; an error when a completion adds no token after the prompt.
pub fn encode(encoder: &Encoder, pair: &Pair) -> Result<EncodedPair, String> {
    let ([prompt, chosen, rejected], special) = texts(encoder, pair)?;
    split(&encoder.ids(&prompt, special)?, &encoder.ids(&chosen, special)?, &encoder.ids(&rejected, special)?)
}

/// For `ptrain tokenize --show`: prompt + chosen and prompt + rejected as the model
/// sees them, their completion tokens trained, and the pair's ids.
pub fn show(encoder: &Encoder, pair: &Pair) -> Result<([Shown; 2], EncodedPair), String> {
    let ([prompt, chosen, rejected], special) = texts(encoder, pair)?;
    let whole = |text: String| -> Result<(String, tokenizers::Encoding), String> {
        let encoding = encoder.tokenizer.encode(text.as_str(), special).map_err(|e| format!("the tokenizer failed: {e}"))?;
        Ok((text, encoding))
    };
    let (chosen, rejected) = (whole(chosen)?, whole(rejected)?);
    let encoded = split(&encoder.ids(&prompt, special)?, chosen.1.get_ids(), rejected.1.get_ids())?;
    let at = encoded.prompt.len();
    let shown = |(text, encoding): (String, tokenizers::Encoding)| {
        let ids = encoding.get_ids().to_vec();
        let trained = (0..ids.len()).map(|i| i >= at).collect();
        Shown::new(text, encoding.get_offsets().to_vec(), Encoded { ids, trained, untrained: None })
    };
    Ok(([shown(chosen), shown(rejected)], encoded))
}
