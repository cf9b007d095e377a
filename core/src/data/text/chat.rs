//! What a chat template renders for one row ([`Chat`]: messages, tool schemas and
//! extra template variables, read from a row the same way for every row kind), and
//! what the encoder encodes ([`Example`]).

use std::sync::Arc;

use minijinja::{value::ValueKind, Value};

use super::messages::{self, kind_name};
use crate::{config::ColumnMap, data::reader::Record};

/// The column of extra template variables (TRL's).
pub const KWARGS: &str = "chat_template_kwargs";

/// What a template renders for one row.
#[derive(Debug, Clone)]
pub struct Chat {
    pub messages: Vec<Value>,
    /// The tool schemas (`none`: the row has none).
    pub tools: Value,
    /// `chat_template_kwargs`: more variables for the template.
    pub kwargs: Vec<(Arc<str>, Value)>,
}

impl Chat {
    /// `messages` with the row's tool schemas (`columns.tools`) and template variables.
    pub fn read(record: &Record, columns: &ColumnMap, messages: Vec<Value>) -> Result<Chat, String> {
        Ok(Chat { messages, tools: tools(record, &columns.tools)?, kwargs: kwargs(record)? })
    }

    pub fn conversation(&self) -> crate::data::chat_template::Conversation<'_> {
        crate::data::chat_template::Conversation { messages: &self.messages, tools: &self.tools, kwargs: &self.kwargs }
    }
}

/// A row ready to encode.
#[derive(Debug, Clone)]
pub enum Example {
    Chat(Chat),
    /// Message lists: the first `prompt` messages are the prompt.
    Conversation {
        chat: Chat,
        prompt: usize,
    },
    /// Plain text: the completion is followed by the EOS token.
    Text {
        prompt: String,
        completion: String,
    },
}

/// The tool schemas in `column`: a list (as it is), or a JSON string of one (parsed,
/// as TRL does); `none` when absent or null.
fn tools(record: &Record, column: &str) -> Result<Value, String> {
    let Some(tools) = record.get(column) else { return Ok(Value::from(())) };
    let tools = match tools.as_str() {
        Some(text) => serde_json::from_str::<Value>(text).map_err(|e| format!("`{column}` is a string that is not JSON: {e}"))?,
        None => tools.clone(),
    };
    match tools.kind() {
        ValueKind::Seq | ValueKind::None | ValueKind::Undefined => Ok(tools),
        _ => Err(format!("`{column}` is {}, not a list of tool schemas", kind_name(&tools))),
    }
}

/// `chat_template_kwargs`: an object of extra template variables.
fn kwargs(record: &Record) -> Result<Vec<(Arc<str>, Value)>, String> {
    let Some(value) = record.get(KWARGS).filter(|v| !v.is_none()) else { return Ok(Vec::new()) };
    if value.kind() != ValueKind::Map {
        return Err(format!("`{KWARGS}` is {}, not an object", kind_name(value)));
    }
    Ok(messages::keys(value).into_iter().map(|k| (Arc::from(k.as_str()), messages::get(value, &k).unwrap_or(Value::from(())))).collect())
}
