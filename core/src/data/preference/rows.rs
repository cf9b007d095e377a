//! A preference row as TRL's `DPOTrainer` reads it: `prompt`, `chosen` and
//! `rejected`, all strings (plain text) or all message lists (conversational, with
//! optional `tools` and `chat_template_kwargs` for the template); without `prompt`,
//! the prompt is what `chosen` and `rejected` share at their start (TRL's
//! `extract_prompt`). A row TRL would train on something meaningless (an empty
//! completion, chosen equal to rejected) is refused, naming what is wrong.

use minijinja::{value::ValueKind, Value};

use crate::{
    config::ColumnMap,
    data::{
        reader::Record,
        text::{
            chat::{Chat, KWARGS},
            messages::{self, kind_name},
        },
    },
};

/// A pair ready to encode.
#[derive(Debug, Clone)]
pub enum Pair {
    /// Message lists: `chat.messages` is the prompt's; `chosen` and `rejected`
    /// follow it. `chat.tools` and `chat.kwargs` go to the template.
    Conversation { chat: Chat, chosen: Vec<Value>, rejected: Vec<Value> },
    /// Plain text: each completion is followed by the EOS token.
    Text { prompt: String, chosen: String, rejected: String },
}

/// The pair `record` holds; the error says what is wrong with it (the caller names
/// the file and row). Columns other than these and `ignore`'s are refused.
pub fn shape(record: &Record, columns: &ColumnMap, ignore: &[String]) -> Result<Pair, String> {
    let get = |name: &str| record.get(name).filter(|v| !v.is_none());
    let (Some(chosen), Some(rejected)) = (get("chosen"), get("rejected")) else {
        return Err(format!("a preference row needs `chosen` and `rejected`; the row's columns: {}", record.column_names()));
    };
    let prompt = get(&columns.prompt);
    let mut used = vec!["chosen", "rejected", columns.prompt.as_str()];
    let conversational = chosen.kind() == ValueKind::Seq;
    if [prompt, Some(rejected)].into_iter().flatten().any(|v| (v.kind() == ValueKind::Seq) != conversational) {
        return Err(format!(
            "`{}`, `chosen` and `rejected` mix strings and message lists: a preference row's columns are all strings or all message lists",
            columns.prompt
        ));
    }
    if conversational {
        used.extend([columns.tools.as_str(), KWARGS]);
    }
    if let Some((name, _)) = record.columns.iter().find(|(name, _)| !used.contains(&&**name) && !ignore.iter().any(|i| **i == **name)) {
        return Err(format!(
            "column `{name}` is neither read nor passed to the chat template (a preference row has {}, chosen, rejected{}); \
             if it is not needed, leave it out with data.ignore_columns = [\"{name}\"]",
            columns.prompt,
            if conversational { ", tools, chat_template_kwargs" } else { "" }
        ));
    }
    let pair = match (prompt, conversational) {
        (Some(p), false) => Pair::Text { prompt: text(p, &columns.prompt)?, chosen: text(chosen, "chosen")?, rejected: text(rejected, "rejected")? },
        (None, false) => {
            let (prompt, chosen, rejected) = split_text(&text(chosen, "chosen")?, &text(rejected, "rejected")?);
            Pair::Text { prompt, chosen, rejected }
        }
        (Some(p), true) => {
            let prompt = messages::messages(p, &columns.prompt, columns)?;
            let chosen = messages::messages(chosen, "chosen", columns)?;
            let rejected = messages::messages(rejected, "rejected", columns)?;
            Pair::Conversation { chat: Chat::read(record, columns, prompt)?, chosen, rejected }
        }
        (None, true) => {
            let (c, r) = (list(chosen, "chosen")?, list(rejected, "rejected")?);
            let shared = shared_messages(&c, &r);
            let prompt = Value::from(c[..shared].to_vec());
            if shared == 0 {
                return Err("`chosen` and `rejected` share no leading message: there is no prompt (give it as `prompt`)".into());
            }
            let prompt = messages::messages(&prompt, "chosen", columns)?;
            let chosen = messages::messages(&Value::from(c[shared..].to_vec()), "chosen", columns)?;
            let rejected = messages::messages(&Value::from(r[shared..].to_vec()), "rejected", columns)?;
            Pair::Conversation { chat: Chat::read(record, columns, prompt)?, chosen, rejected }
        }
    };
    check(&pair)?;
    Ok(pair)
}

fn text(v: &Value, column: &str) -> Result<String, String> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("`{column}` is {}; a preference row's columns are all strings or all message lists", kind_name(v)))
}

fn list(v: &Value, column: &str) -> Result<Vec<Value>, String> {
    match v.kind() {
        ValueKind::Seq => Ok(v.try_iter().map_err(|e| e.to_string())?.collect()),
        _ => Err(format!("`{column}` is {}, not a list of messages", kind_name(v))),
    }
}

/// The leading messages `chosen` and `rejected` share (TRL's `extract_prompt` on
/// lists): up to the first that differs; when one list is a prefix of the other,
/// all but the last of the shorter, as TRL's loop leaves it.
fn shared_messages(chosen: &[Value], rejected: &[Value]) -> usize {
    let n = chosen.len().min(rejected.len());
    (0..n).find(|&i| chosen[i] != rejected[i]).unwrap_or(n.saturating_sub(1))
}

/// TRL's `extract_prompt` on strings: the prompt is the characters both share, less
/// a space just before where they differ (it goes to the completions).
fn split_text(chosen: &str, rejected: &str) -> (String, String, String) {
    let (c, r): (Vec<char>, Vec<char>) = (chosen.chars().collect(), rejected.chars().collect());
    let n = c.len().min(r.len());
    let mut at = match (0..n).find(|&i| c[i] != r[i]) {
        // Python's `chosen[idx - 1]` at idx 0 reads the last character.
        Some(i) if c[(i + c.len() - 1) % c.len().max(1)] == ' ' => i.saturating_sub(1),
        Some(i) => i,
        None => n.saturating_sub(1),
    };
    at = at.min(n);
    let s = |v: &[char]| v.iter().collect::<String>();
    (s(&c[..at]), s(&c[at..]), s(&r[at..]))
}

/// Refuses pairs with nothing to compare.
fn check(pair: &Pair) -> Result<(), String> {
    let (chosen_empty, rejected_empty, same) = match pair {
        Pair::Text { chosen, rejected, .. } => (chosen.is_empty(), rejected.is_empty(), chosen == rejected),
        Pair::Conversation { chosen, rejected, .. } => (chosen.is_empty(), rejected.is_empty(), chosen == rejected),
    };
    match (chosen_empty, rejected_empty, same) {
        (true, _, _) => Err("the chosen completion is empty".into()),
        (_, true, _) => Err("the rejected completion is empty".into()),
        (_, _, true) => Err("`chosen` equals `rejected`: the pair prefers nothing".into()),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_implicit_prompt_is_what_both_share_as_trl_extracts_it() {
        let (p, c, r) = split_text("The sky is blue.", "The sky is green.");
        assert_eq!((p.as_str(), c.as_str(), r.as_str()), ("The sky is", " blue.", " green."));
        let (p, c, r) = split_text("ab", "ac");
        assert_eq!((p.as_str(), c.as_str(), r.as_str()), ("a", "b", "c"));
        let m = |s: &str| Value::from(s);
        assert_eq!(shared_messages(&[m("u"), m("a")], &[m("u"), m("b")]), 1);
        assert_eq!(shared_messages(&[m("u"), m("a")], &[m("u"), m("a"), m("x")]), 1, "TRL's loop ends one short");
    }
}
