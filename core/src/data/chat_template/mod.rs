//! A model's chat template: the Jinja string of `tokenizer_config.json` (or the
//! `chat_template.jinja` file newer `transformers` save beside it), rendered with
//! `minijinja` as `apply_chat_template` renders it: Python's string methods,
//! transformers' `tojson`, `raise_exception` and `strftime_now`, `trim_blocks` and
//! `lstrip_blocks`, the messages as they are (every key), `tools`, the special
//! tokens, and the `{% generation %}` marks ([`marks`]).

mod marks;
pub mod pyjson;

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use minijinja::{syntax::SyntaxConfig, Environment, Error as JinjaError, ErrorKind, Value};
use serde_json::Value as Json;

use crate::error::{Error, Result};

/// One message of a conversation, for callers that have plain text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// What a template renders: the messages (maps, every key passed as it is), the
/// tool schemas (`none` when the row has none) and extra variables
/// (`chat_template_kwargs`).
#[derive(Debug, Clone, Copy)]
pub struct Conversation<'a> {
    pub messages: &'a [Value],
    pub tools: &'a Value,
    pub kwargs: &'a [(Arc<str>, Value)],
}

/// A rendered conversation: its text and, for a template with `{% generation %}`
/// marks, the byte spans they enclose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub text: String,
    pub marked: Vec<(usize, usize)>,
}

/// A loaded template with the special tokens it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: PathBuf,
    /// `bos_token`, `eos_token`, ... as `apply_chat_template` passes them.
    special: Vec<(String, String)>,
    /// The template has `{% generation %}` marks: they decide the trained tokens.
    pub has_marks: bool,
    /// The template calls `strftime_now` (its text changes with the date).
    pub uses_date: bool,
    pub eos_token: String,
}

/// `eos_token` may be a string or `{"content": ...}` (an AddedToken).
fn token_text(v: Option<&Json>) -> String {
    match v {
        Some(Json::String(s)) => s.clone(),
        Some(Json::Object(o)) => o.get("content").and_then(Json::as_str).unwrap_or_default().to_string(),
        _ => String::new(),
    }
}

impl ChatTemplate {
    /// The template saved with the tokenizer in `dir`, or `None` when it has none.
    pub fn find(dir: &Path) -> Result<Option<ChatTemplate>> {
        let config_path = dir.join("tokenizer_config.json");
        let config: serde_json::Map<String, Json> = match std::fs::read_to_string(&config_path) {
            Ok(text) => {
                serde_json::from_str(&text).map_err(|e| Error::Data { path: config_path.clone(), message: format!("not a JSON object: {e}") })?
            }
            Err(_) => serde_json::Map::new(),
        };
        let file = dir.join("chat_template.jinja");
        let (text, source) = if file.is_file() {
            (std::fs::read_to_string(&file).map_err(|e| Error::Io { path: file.clone(), source: e })?, file)
        } else {
            let text = match config.get("chat_template") {
                Some(Json::String(s)) => s.clone(),
                // A list of named templates: the one named "default".
                Some(Json::Array(named)) => named
                    .iter()
                    .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
                    .and_then(|t| t.get("template")?.as_str())
                    .map(str::to_string)
                    .ok_or_else(|| Error::Data { path: config_path.clone(), message: "chat_template lists no template named \"default\"".into() })?,
                _ => return Ok(None),
            };
            (text, config_path.clone())
        };
        let special = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]
            .into_iter()
            .filter_map(|k| config.get(k).map(|v| (k.to_string(), token_text(Some(v)))))
            .collect();
        Self::from_text(&text, source, special, token_text(config.get("eos_token")))
    }

    /// A template from its Jinja text (`source` names it in messages).
    pub fn from_text(text: &str, source: PathBuf, special: Vec<(String, String)>, eos_token: String) -> Result<Option<ChatTemplate>> {
        let (text, has_marks) = marks::rewrite(text);
        let uses_date = text.contains("strftime_now");
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> std::result::Result<String, JinjaError> {
            Err(JinjaError::new(ErrorKind::InvalidOperation, message))
        });
        env.add_function("strftime_now", |format: String| chrono::Local::now().format(&format).to_string());
        env.add_filter("tojson", pyjson::tojson);
        // transformers renders with trim_blocks and lstrip_blocks.
        env.set_syntax(SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build().expect("default delimiters"));
        env.add_template_owned("chat", text)
            .map_err(|e| Error::Data { path: source.clone(), message: format!("the chat template does not parse: {e}") })?;
        Ok(Some(ChatTemplate { env, source, special, has_marks, uses_date, eos_token }))
    }

    /// Where the template came from, for messages.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// The conversation as text, ending with the assistant's turn opened when
    /// `add_generation_prompt`; the error is the template's own message.
    pub fn render(&self, conversation: Conversation, add_generation_prompt: bool) -> std::result::Result<Rendered, String> {
        let template = self.env.get_template("chat").expect("added above");
        let mut context: Vec<(&str, Value)> = self.special.iter().map(|(k, v)| (k.as_str(), Value::from(v.as_str()))).collect();
        context.extend(conversation.kwargs.iter().map(|(k, v)| (&**k, v.clone())));
        context.extend([
            ("messages", Value::from(conversation.messages.to_vec())),
            ("tools", conversation.tools.clone()),
            ("documents", Value::from(())),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
        ]);
        let text = template.render(Value::from_pairs(context)).map_err(|e| format!("the chat template failed to render: {}", describe(&e)))?;
        if !self.has_marks {
            return Ok(Rendered { text, marked: Vec::new() });
        }
        let (text, marked) = marks::extract(&text)?;
        Ok(Rendered { text, marked })
    }

    /// Plain messages rendered (for `ptrain generate --chat`).
    pub fn render_messages(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let messages: Vec<Value> = messages.iter().map(|m| Value::from_pairs([("role", m.role.as_str()), ("content", m.content.as_str())])).collect();
        let conversation = Conversation { messages: &messages, tools: &Value::from(()), kwargs: &[] };
        self.render(conversation, add_generation_prompt).map(|r| r.text).map_err(|message| Error::Data { path: self.source.clone(), message })
    }
}

/// A template error with its cause (minijinja puts the detail in the source chain).
fn describe(e: &JinjaError) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    text
}

/// The `eos_token` of the `tokenizer_config.json` in `dir` (empty when none).
pub fn eos_token(dir: &Path) -> String {
    let path = dir.join("tokenizer_config.json");
    let config: Option<serde_json::Map<String, Json>> = std::fs::read_to_string(path).ok().and_then(|t| serde_json::from_str(&t).ok());
    token_text(config.as_ref().and_then(|c| c.get("eos_token")))
}

#[cfg(test)]
mod tests;
