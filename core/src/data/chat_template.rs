//! A model's chat template: the Jinja string of `tokenizer_config.json` (or the
//! `chat_template.jinja` file newer `transformers` save beside it), rendered with
//! `minijinja` and Python's string methods, as `apply_chat_template` renders it.

use std::path::{Path, PathBuf};

use minijinja::{context, syntax::SyntaxConfig, Environment, Error as JinjaError, ErrorKind, Value as JinjaValue};
use serde_json::Value;

use crate::error::{Error, Result};

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// A loaded template with the special tokens it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: PathBuf,
    pub bos_token: String,
    pub eos_token: String,
}

/// `eos_token` may be a string or `{"content": ...}` (an AddedToken).
fn token_text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(o)) => o.get("content").and_then(Value::as_str).unwrap_or_default().to_string(),
        _ => String::new(),
    }
}

impl ChatTemplate {
    /// The template saved with the tokenizer in `dir`, or `None` when it has none.
    pub fn find(dir: &Path) -> Result<Option<ChatTemplate>> {
        let config_path = dir.join("tokenizer_config.json");
        let config: serde_json::Map<String, Value> = match std::fs::read_to_string(&config_path) {
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
                Some(Value::String(s)) => s.clone(),
                // A list of named templates: the one named "default".
                Some(Value::Array(named)) => named
                    .iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                    .and_then(|t| t.get("template")?.as_str())
                    .map(str::to_string)
                    .ok_or_else(|| Error::Data { path: config_path.clone(), message: "chat_template lists no template named \"default\"".into() })?,
                _ => return Ok(None),
            };
            (text, config_path.clone())
        };
        let text = without_generation_tags(&text);
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> std::result::Result<String, JinjaError> {
            Err(JinjaError::new(ErrorKind::InvalidOperation, message))
        });
        // transformers renders with trim_blocks and lstrip_blocks.
        env.set_syntax(SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build().expect("default delimiters"));
        env.add_template_owned("chat", text)
            .map_err(|e| Error::Data { path: source.clone(), message: format!("the chat template does not parse: {e}") })?;
        Ok(Some(ChatTemplate { env, source, bos_token: token_text(config.get("bos_token")), eos_token: token_text(config.get("eos_token")) }))
    }

    /// Where the template came from, for messages.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// The conversation as text, ending with the assistant's turn opened when
    /// `add_generation_prompt`.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let template = self.env.get_template("chat").expect("added above");
        let messages: Vec<JinjaValue> =
            messages.iter().map(|m| JinjaValue::from_pairs([("role", m.role.as_str()), ("content", m.content.as_str())])).collect();
        template
            .render(context! { messages => messages, add_generation_prompt => add_generation_prompt, bos_token => self.bos_token.as_str(), eos_token => self.eos_token.as_str() })
            .map_err(|e| Error::Data { path: self.source.clone(), message: format!("the chat template failed to render: {e}") })
    }
}

/// `{% generation %}` / `{% endgeneration %}` (transformers' marks for
/// `return_assistant_tokens_mask`, which TRL's `assistant_only_loss` reads) are not
/// Jinja: each becomes a block that always renders, keeping its whitespace control
/// (`{%- generation -%}`). ptrain finds the trained tokens by rendering prefixes
/// instead (see `data::instruct::encode`), so templates with and without the marks
/// train the same tokens.
fn without_generation_tags(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find("{%") {
        out.push_str(&rest[..open]);
        let Some(close) = rest[open..].find("%}").map(|c| open + c + 2) else {
            out.push_str(&rest[open..]);
            return out;
        };
        let tag = &rest[open..close];
        let inner = tag[2..tag.len() - 2].trim_start_matches('-').trim_end_matches('-').trim();
        let (left, right) = (if tag.starts_with("{%-") { "-" } else { "" }, if tag.ends_with("-%}") { "-" } else { "" });
        match inner {
            "generation" => out.push_str(&format!("{{%{left} if true {right}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{left} endif {right}%}}")),
            _ => out.push_str(tag),
        }
        rest = &rest[close..];
    }
    out.push_str(rest);
    out
}

/// The `eos_token` of the `tokenizer_config.json` in `dir` (empty when none).
pub fn eos_token(dir: &Path) -> String {
    let path = dir.join("tokenizer_config.json");
    let config: Option<serde_json::Map<String, Value>> = std::fs::read_to_string(path).ok().and_then(|t| serde_json::from_str(&t).ok());
    token_text(config.as_ref().and_then(|c| c.get("eos_token")))
}

#[cfg(test)]
mod tests {
    use super::without_generation_tags;

    #[test]
    fn generation_marks_become_blocks_that_always_render() {
        let t = "{%- if x %}a{% generation %}b{%- endgeneration -%}{% endif %}";
        assert_eq!(without_generation_tags(t), "{%- if x %}a{% if true %}b{%- endif -%}{% endif %}");
        assert_eq!(without_generation_tags("no tags {{ x }}"), "no tags {{ x }}");
    }
}
