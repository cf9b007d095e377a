//! A line of rollouts: one prompt's group of completions with their rewards, as a
//! generation server, an earlier run or a debugging session wrote it. The prompt is
//! `prompt_ids` (token ids) or `prompt` (a string, or a message list rendered with the
//! chat template and its generation prompt); the completions are `completion_ids` (a
//! list of id lists) or `completions` (strings, or TRL's conversational form, a list
//! holding one assistant message), tokenized as they are (a completion that ended with
//! EOS says so: its text ends with the EOS token's text); `rewards` is one number per
//! completion, or one list per reward function (`[[grpo.rewards]]`, in order), where
//! `null` (TRL's `None`) is a reward that function did not give. Other columns are the
//! row's own (an `answer`, a `solution`). A row that cannot train as it is is refused,
//! naming what is wrong (the caller names the file and line).

use minijinja::{value::ValueKind, Value};

use crate::data::{
    reader::Record,
    text::{
        chat::Chat,
        encode::Encoder,
        messages::{self, kind_name},
    },
};

/// One prompt's scored completions.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    pub prompt: Vec<u32>,
    pub completions: Vec<Vec<u32>>,
    /// `[functions][completions]`; NaN where a function gave no reward.
    pub rewards: Vec<Vec<f64>>,
}

/// What a row must hold to be a group.
pub struct Expect<'a> {
    pub generations: usize,
    /// Reward functions a row's per-function lists must number (`[[grpo.rewards]]`);
    /// 0: a row gives one number per completion.
    pub functions: usize,
    pub encoder: &'a Encoder,
    pub columns: &'a crate::config::ColumnMap,
}

/// The group `record` holds.
pub fn group(record: &Record, expect: &Expect) -> Result<Group, String> {
    let get = |name: &str| record.get(name).filter(|v| !v.is_none());
    let prompt = match (get("prompt_ids"), get("prompt")) {
        (Some(ids), _) => token_ids(ids, "prompt_ids")?,
        (None, Some(prompt)) => prompt_ids(record, prompt, expect)?,
        (None, None) => return Err(format!("a rollout row needs `prompt_ids` or `prompt`; the row's columns: {}", record.column_names())),
    };
    let completions: Vec<Vec<u32>> = match (get("completion_ids"), get("completions")) {
        (Some(lists), _) => list(lists, "completion_ids")?.iter().map(|ids| token_ids(ids, "completion_ids")).collect::<Result<_, _>>()?,
        (None, Some(texts)) => list(texts, "completions")?.iter().map(|c| completion_ids(c, expect.encoder)).collect::<Result<_, _>>()?,
        (None, None) => return Err(format!("a rollout row needs `completion_ids` or `completions`; the row's columns: {}", record.column_names())),
    };
    if completions.len() != expect.generations {
        return Err(format!("the group holds {} completions, grpo.num_generations = {}", completions.len(), expect.generations));
    }
    if let Some(i) = completions.iter().position(Vec::is_empty) {
        return Err(format!("completion {i} is empty"));
    }
    let rewards = rewards(get("rewards").ok_or("a rollout row needs `rewards`")?, expect)?;
    Ok(Group { prompt, completions, rewards })
}

fn list(v: &Value, column: &str) -> Result<Vec<Value>, String> {
    match v.kind() {
        ValueKind::Seq => Ok(v.try_iter().map_err(|e| e.to_string())?.collect()),
        _ => Err(format!("`{column}` is {}, not a list", kind_name(v))),
    }
}

fn token_ids(v: &Value, column: &str) -> Result<Vec<u32>, String> {
    list(v, column)?
        .iter()
        .map(|id| id.as_i64().and_then(|i| u32::try_from(i).ok()).ok_or_else(|| format!("`{column}` holds {id}, not a token id")))
        .collect()
}

/// The prompt's tokens: a string as it is, or messages rendered with the generation prompt.
fn prompt_ids(record: &Record, prompt: &Value, expect: &Expect) -> Result<Vec<u32>, String> {
    expect.encoder.ids(&prompt_text(record, prompt, expect.encoder, expect.columns)?, false)
}

/// The prompt as the model sees it: a string as it is, or messages rendered with the
/// chat template and its generation prompt (as TRL renders conversational prompts).
pub fn prompt_text(record: &Record, prompt: &Value, encoder: &Encoder, columns: &crate::config::ColumnMap) -> Result<String, String> {
    match prompt.as_str() {
        Some(text) => Ok(text.to_string()),
        None => {
            let template = encoder.template.as_ref().ok_or("`prompt` is a message list and the tokenizer has no chat template")?;
            let chat = Chat::read(record, columns, messages::messages(prompt, "prompt", columns)?)?;
            Ok(template.render(chat.conversation(), true)?.text)
        }
    }
}

/// A completion's tokens: a string, or one assistant message (TRL's conversational form).
fn completion_ids(v: &Value, encoder: &Encoder) -> Result<Vec<u32>, String> {
    let text = match (v.as_str(), v.kind()) {
        (Some(text), _) => text.to_string(),
        (None, ValueKind::Seq) => {
            let turns = list(v, "completions")?;
            match turns.as_slice() {
                [turn] => messages::get(turn, "content")
                    .and_then(|c| c.as_str().map(str::to_string))
                    .ok_or("a completion message needs a string `content`")?,
                _ => return Err(format!("a conversational completion is one assistant message, not {}", turns.len())),
            }
        }
        _ => return Err(format!("`completions` holds {}, not a string or a message list", kind_name(v))),
    };
    encoder.ids(&text, false)
}

/// A reward: a number, or null (NaN: the function gave none).
fn reward(v: &Value) -> Result<f64, String> {
    match v.kind() {
        ValueKind::None | ValueKind::Undefined => Ok(f64::NAN),
        ValueKind::Number => Ok(f64::try_from(v.clone()).map_err(|e| e.to_string())?),
        _ => Err(format!("`rewards` holds {}, not a number or null", kind_name(v))),
    }
}

/// `[functions][completions]`: one list per function, or one number per completion.
fn rewards(v: &Value, expect: &Expect) -> Result<Vec<Vec<f64>>, String> {
    let items = list(v, "rewards")?;
    let per_function = items.first().is_some_and(|i| i.kind() == ValueKind::Seq);
    let lists: Vec<Vec<f64>> = match per_function {
        true => items.iter().map(|l| list(l, "rewards")?.iter().map(reward).collect()).collect::<Result<_, String>>()?,
        false => vec![items.iter().map(reward).collect::<Result<_, _>>()?],
    };
    let functions = expect.functions.max(1);
    if lists.len() != functions {
        return Err(match expect.functions {
            0 => format!("`rewards` holds {} lists: name the reward functions with one [[grpo.rewards]] each", lists.len()),
            n => format!("`rewards` holds {} per-function lists, and {n} [[grpo.rewards]] are configured", lists.len()),
        });
    }
    if let Some(l) = lists.iter().find(|l| l.len() != expect.generations) {
        return Err(format!("`rewards` holds {} rewards for {} completions", l.len(), expect.generations));
    }
    Ok(lists)
}
