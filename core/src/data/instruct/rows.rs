//! One JSONL row of instruction data, as TRL reads it: a conversation
//! (`{"messages": [{"role", "content"}]}`, or ShareGPT's `{"conversations":
//! [{"from", "value"}]}`), or a prompt and its completion, both strings or both
//! message lists.

use serde_json::{Map, Value};

use crate::{config::DataKind, data::chat_template::Message};

/// A parsed row.
#[derive(Debug, Clone, PartialEq)]
pub enum Example {
    Chat(Vec<Message>),
    /// Plain text: the completion is followed by the EOS token.
    Text {
        prompt: String,
        completion: String,
    },
    /// Message lists: rendered with the chat template.
    Conversation {
        prompt: Vec<Message>,
        completion: Vec<Message>,
    },
}

const ROLES: &[&str] = &["system", "user", "assistant"];

/// ShareGPT's speaker names.
fn sharegpt_role(from: &str) -> &str {
    match from {
        "human" => "user",
        "gpt" => "assistant",
        other => other,
    }
}

fn messages(value: &Value, field: &str) -> Result<Vec<Message>, String> {
    let list = value.as_array().ok_or_else(|| format!("`{field}` is not a list of messages"))?;
    if list.is_empty() {
        return Err(format!("`{field}` is empty"));
    }
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let m = m.as_object().ok_or_else(|| format!("{field}[{i}] is not an object"))?;
            let (role, content) = match (m.get("role"), m.get("from")) {
                (Some(role), _) => (role, m.get("content")),
                (None, Some(from)) => (from, m.get("value")),
                (None, None) => return Err(format!("{field}[{i}] has no `role` (or ShareGPT `from`)")),
            };
            let role = role.as_str().ok_or_else(|| format!("{field}[{i}].role is not a string"))?;
            let role = sharegpt_role(role);
            if !ROLES.contains(&role) {
                return Err(format!("{field}[{i}] has the unknown role {role:?} (known: system, user, assistant; ShareGPT's human, gpt)"));
            }
            let content = match content {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(_) => return Err(format!("{field}[{i}].content is not a string")),
            };
            Ok(Message { role: role.to_string(), content })
        })
        .collect()
}

/// Parses one line of `kind` data; the error says what is wrong with it.
pub fn parse(line: &str, kind: DataKind) -> Result<Example, String> {
    let row: Map<String, Value> = serde_json::from_str(line).map_err(|e| format!("not a JSON object: {e}"))?;
    match kind {
        DataKind::Chat => {
            let (field, list) = match (row.get("messages"), row.get("conversations")) {
                (Some(m), _) => ("messages", m),
                (None, Some(c)) => ("conversations", c),
                (None, None) => return Err("no `messages` (or ShareGPT `conversations`) field".into()),
            };
            let messages = messages(list, field)?;
            if !messages.iter().any(|m| m.role == "assistant") {
                return Err(format!("`{field}` has no assistant message: nothing to train on"));
            }
            Ok(Example::Chat(messages))
        }
        _ => {
            let (Some(prompt), Some(completion)) = (row.get("prompt"), row.get("completion")) else {
                return Err("a prompt/completion row needs both `prompt` and `completion`".into());
            };
            match (prompt, completion) {
                (Value::String(p), Value::String(c)) => Ok(Example::Text { prompt: p.clone(), completion: c.clone() }),
                (Value::Array(_), Value::Array(_)) => {
                    Ok(Example::Conversation { prompt: messages(prompt, "prompt")?, completion: messages(completion, "completion")? })
                }
                _ => Err("`prompt` and `completion` must both be strings or both be message lists".into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: &str, content: &str) -> Message {
        Message { role: role.into(), content: content.into() }
    }

    #[test]
    fn reads_messages_and_sharegpt_conversations_alike() {
        let a = parse(r#"{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}"#, DataKind::Chat).unwrap();
        let b = parse(r#"{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}"#, DataKind::Chat).unwrap();
        assert_eq!(a, Example::Chat(vec![msg("user", "hi"), msg("assistant", "yo")]));
        assert_eq!(a, b);
    }

    #[test]
    fn names_what_is_wrong() {
        let err = |line, kind| parse(line, kind).unwrap_err();
        assert!(err(r#"{"text": "x"}"#, DataKind::Chat).contains("no `messages`"));
        assert!(err(r#"{"messages": [{"role": "robot", "content": "x"}]}"#, DataKind::Chat).contains("unknown role \"robot\""));
        assert!(err(r#"{"messages": [{"role": "user", "content": "x"}]}"#, DataKind::Chat).contains("no assistant"));
        assert!(err(r#"{"prompt": "x"}"#, DataKind::PromptCompletion).contains("both `prompt` and `completion`"));
        assert!(err(r#"{"prompt": "x", "completion": []}"#, DataKind::PromptCompletion).contains("both be strings"));
        assert!(err("[1]", DataKind::Chat).contains("not a JSON object"));
    }

    #[test]
    fn prompt_completion_rows_are_text_or_conversations() {
        let text = parse(r#"{"prompt": "2+2=", "completion": "4"}"#, DataKind::PromptCompletion).unwrap();
        assert_eq!(text, Example::Text { prompt: "2+2=".into(), completion: "4".into() });
        let conv = parse(
            r#"{"prompt": [{"role": "user", "content": "2+2?"}], "completion": [{"role": "assistant", "content": "4"}]}"#,
            DataKind::PromptCompletion,
        )
        .unwrap();
        assert_eq!(conv, Example::Conversation { prompt: vec![msg("user", "2+2?")], completion: vec![msg("assistant", "4")] });
    }
}
