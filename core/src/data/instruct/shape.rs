//! A row of instruction data as what the encoder renders: a conversation
//! (`data.kind = "chat"`: OpenAI `messages`, ShareGPT `conversations`, or Alpaca
//! `instruction` / `input` / `output` with optional `system` and `history`, made
//! into messages as LLaMA-Factory's converter makes them), or a prompt and its
//! completion (strings, or message lists rendered with the template). `tools` and
//! `chat_template_kwargs` go to the template. A column that is neither read nor
//! passed to the template is an error naming it, unless `data.ignore_columns`
//! lists it: nothing a row holds is dropped silently. (The rows' reading settings,
//! [`Shaper`], are the text layer's; making a row an [`Example`] is instruction data's.)

use minijinja::{value::ValueKind, Value};

use crate::{
    config::DataKind,
    data::{
        reader::Record,
        text::{
            chat::{Chat, Example, KWARGS},
            messages::{self, get, kind_name},
            Shaper,
        },
    },
};

impl Shaper {
    /// The example `record` holds; the error says what is wrong with it (the
    /// caller names the file and line).
    pub fn shape(&self, record: &Record) -> Result<Example, String> {
        let c = &self.columns;
        let (example, mut used): (Example, Vec<&str>) = match self.kind {
            DataKind::Chat => {
                let (messages, used) = if let Some(list) = record.get(&c.messages) {
                    (messages::messages(list, &c.messages, c)?, vec![c.messages.as_str()])
                } else if let Some(list) = record.get(&c.conversations) {
                    (messages::messages(list, &c.conversations, c)?, vec![c.conversations.as_str()])
                } else if record.get(&c.instruction).is_some() || record.get(&c.output).is_some() {
                    self.alpaca(record)?
                } else {
                    return Err(format!(
                        "no `{}` (OpenAI), `{}` (ShareGPT) or `{}`/`{}` (Alpaca) column; the row's columns: {} (other names: data.columns)",
                        c.messages,
                        c.conversations,
                        c.instruction,
                        c.output,
                        record.column_names()
                    ));
                };
                if !messages.iter().any(|m| get(m, "role").and_then(|r| r.as_str().map(|r| r == "assistant")).unwrap_or(false)) {
                    return Err(format!("`{}` has no assistant message: nothing to train on", used[0]));
                }
                (Example::Chat(Chat::read(record, c, messages)?), used)
            }
            _ => self.prompt_completion(record)?,
        };
        if !matches!(example, Example::Text { .. }) {
            used.extend([c.tools.as_str(), KWARGS]);
        }
        if let Some((name, _)) = record.columns.iter().find(|(name, _)| !used.contains(&&**name) && !self.ignore.iter().any(|i| **i == **name)) {
            let read: Vec<&str> = used.iter().filter(|u| record.get(u).is_some()).copied().collect();
            return Err(format!(
                "column `{name}` is neither read nor passed to the chat template (this row's are: {}); \
                 if it is not needed, leave it out with data.ignore_columns = [\"{name}\"], or name it in data.columns",
                read.join(", ")
            ));
        }
        Ok(example)
    }

    /// Alpaca: `history` pairs, then one user turn (instruction and input joined
    /// by a newline, each when not empty) and the answer; `system` first when set.
    fn alpaca(&self, record: &Record) -> Result<(Vec<Value>, Vec<&str>), String> {
        let c = &self.columns;
        let text = |column: &str| -> Result<Option<String>, String> {
            match record.get(column) {
                None => Ok(None),
                Some(v) if v.is_none() => Ok(None),
                Some(v) => v.as_str().map(|s| Some(s.to_string())).ok_or_else(|| format!("`{column}` is {}, not a string", kind_name(v))),
            }
        };
        let msg = |role: &str, content: String| Value::from_pairs([("role", Value::from(role)), ("content", Value::from(content))]);
        let output = text(&c.output)?.ok_or_else(|| format!("an Alpaca row needs `{}` (the answer)", c.output))?;
        let mut messages = Vec::new();
        if let Some(system) = text(&c.system)?.filter(|s| !s.is_empty()) {
            messages.push(msg("system", system));
        }
        if let Some(history) = record.get(&c.history).filter(|h| !h.is_none()) {
            if history.kind() != ValueKind::Seq {
                return Err(format!("`{}` is {}, not a list of [user, assistant] pairs", c.history, kind_name(history)));
            }
            let pairs: Vec<Value> = history.try_iter().map_err(|e| e.to_string())?.collect();
            for (i, pair) in pairs.iter().enumerate() {
                let turns: Vec<String> = match pair.kind() {
                    ValueKind::Seq => pair.try_iter().map(|t| t.filter_map(|s| s.as_str().map(str::to_string)).collect()).unwrap_or_default(),
                    _ => Vec::new(),
                };
                let [user, assistant] =
                    <[String; 2]>::try_from(turns).map_err(|_| format!("`{}`[{i}] is not a [user, assistant] pair of strings", c.history))?;
                messages.extend([msg("user", user), msg("assistant", assistant)]);
            }
        }
        let query: Vec<String> = [text(&c.instruction)?, text(&c.input)?].into_iter().flatten().filter(|s| !s.is_empty()).collect();
        messages.extend([msg("user", query.join("\n")), msg("assistant", output)]);
        Ok((messages, vec![c.instruction.as_str(), c.input.as_str(), c.output.as_str(), c.system.as_str(), c.history.as_str()]))
    }

    fn prompt_completion(&self, record: &Record) -> Result<(Example, Vec<&str>), String> {
        let c = &self.columns;
        let (Some(prompt), Some(completion)) = (record.get(&c.prompt), record.get(&c.completion)) else {
            return Err(format!(
                "a prompt/completion row needs both `{}` and `{}`; the row's columns: {} (other names: data.columns)",
                c.prompt,
                c.completion,
                record.column_names()
            ));
        };
        let used = vec![c.prompt.as_str(), c.completion.as_str()];
        let example = match (prompt.kind(), completion.kind()) {
            (ValueKind::String, ValueKind::String) => {
                Example::Text { prompt: prompt.as_str().unwrap_or_default().into(), completion: completion.as_str().unwrap_or_default().into() }
            }
            (ValueKind::Seq, ValueKind::Seq) => {
                let mut all = messages::messages(prompt, &c.prompt, c)?;
                let prompt_len = all.len();
                all.extend(messages::messages(completion, &c.completion, c)?);
                Example::Conversation { chat: Chat::read(record, c, all)?, prompt: prompt_len }
            }
            _ => return Err(format!("`{}` and `{}` must both be strings or both be message lists", c.prompt, c.completion)),
        };
        Ok((example, used))
    }
}

#[cfg(test)]
mod tests;
