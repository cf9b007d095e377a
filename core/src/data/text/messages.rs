//! A conversation's messages as a chat template gets them: OpenAI's form
//! (`role`, `content`, `tool_calls`, ...: every key passed as it is, as
//! `apply_chat_template` passes it) or ShareGPT's (`from` / `value`, with
//! `human`, `gpt`, `system`, and LLaMA-Factory's `observation` (a tool result) and
//! `function_call` (a tool call, its value a JSON call or list of calls)).
//! Shared by every row kind that holds conversations.

use minijinja::{value::ValueKind, Value};

use crate::config::ColumnMap;

/// Roles a template may get; assistant turns are the ones trained.
pub const ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool", "ipython"];

/// ShareGPT's speaker names and what they are.
fn sharegpt_role(from: &str) -> Option<&'static str> {
    Some(match from {
        "human" => "user",
        "gpt" => "assistant",
        "observation" => "tool",
        "function_call" => "assistant",
        _ => return None,
    })
}

/// A key of a map value, `None` when absent.
pub fn get(map: &Value, key: &str) -> Option<Value> {
    map.get_attr(key).ok().filter(|v| !v.is_undefined())
}

/// The keys of a map value.
pub fn keys(map: &Value) -> Vec<String> {
    map.try_iter().map(|keys| keys.filter_map(|k| k.as_str().map(str::to_string)).collect()).unwrap_or_default()
}

/// What kind of value, for messages.
pub fn kind_name(v: &Value) -> &'static str {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => "null",
        ValueKind::Bool => "a boolean",
        ValueKind::Number => "a number",
        ValueKind::String => "a string",
        ValueKind::Seq | ValueKind::Iterable => "a list",
        ValueKind::Map => "an object",
        _ => "another kind of value",
    }
}

/// `value` (the `field` of a row, or a column named by `data.columns`) as the
/// list of messages a template gets.
pub fn messages(value: &Value, field: &str, columns: &ColumnMap) -> Result<Vec<Value>, String> {
    if !matches!(value.kind(), ValueKind::Seq) {
        return Err(format!("`{field}` is {}, not a list of messages", kind_name(value)));
    }
    let list: Vec<Value> = value.try_iter().map_err(|e| e.to_string())?.collect();
    if list.is_empty() {
        return Err(format!("`{field}` is empty"));
    }
    list.iter().enumerate().map(|(i, m)| message(m, &format!("{field}[{i}]"), columns)).collect()
}

/// One message, checked; rebuilt only when its keys are spelled otherwise.
fn message(m: &Value, at: &str, columns: &ColumnMap) -> Result<Value, String> {
    if m.kind() != ValueKind::Map {
        return Err(format!("{at} is {}, not a message object", kind_name(m)));
    }
    let (role_key, content_key) = match (get(m, &columns.role), get(m, "from")) {
        (Some(_), _) => (columns.role.as_str(), columns.content.as_str()),
        (None, Some(_)) => ("from", "value"),
        (None, None) => {
            return Err(format!("{at} has no `{}` (nor ShareGPT's `from`); its keys: {}", columns.role, keys(m).join(", ")));
        }
    };
    let role_value = get(m, role_key).expect("found above");
    let written = role_value.as_str().ok_or_else(|| format!("{at}.{role_key} is {}, not a string", kind_name(&role_value)))?;
    let role = match (ROLES.iter().find(|r| **r == written), sharegpt_role(written)) {
        (Some(r), _) => *r,
        (None, Some(r)) => r,
        (None, None) => {
            return Err(format!(
                "{at} has the unknown role {written:?} (known: {}; ShareGPT's human, gpt, observation, function_call)",
                ROLES.join(", ")
            ));
        }
    };
    let mut content = get(m, content_key);
    let mut tool_calls = get(m, "tool_calls").filter(|t| !t.is_none());
    if written == "function_call" {
        let text =
            content.as_ref().and_then(|c| c.as_str()).ok_or_else(|| format!("{at}: a function_call's `{content_key}` must be a JSON string"))?;
        tool_calls = Some(function_call(text).map_err(|e| format!("{at}: a function_call's `{content_key}` {e}"))?);
        content = Some(Value::from(""));
    }
    if let Some(calls) = &tool_calls {
        check_tool_calls(calls, at)?;
    }
    match content.as_ref().map(Value::kind) {
        Some(ValueKind::String | ValueKind::Seq) => {}
        // OpenAI's form: an assistant turn that only calls tools has no content.
        Some(ValueKind::None) | None if role == "assistant" && tool_calls.is_some() => {}
        Some(ValueKind::None) | None => {
            return Err(format!(
                "{at} has no `{content_key}` (or it is null): transformers' templates fail on it; only an assistant message with tool_calls may have none"
            ));
        }
        Some(_) => return Err(format!("{at}.{content_key} is {}, not a string", kind_name(content.as_ref().expect("some")))),
    }
    let reasoning = ["reasoning_content", "thinking", "reasoning"].iter().find_map(|k| get(m, k).filter(|v| !v.is_none()));
    let respelled = role_key != "role" || content_key != "content" || role != written || reasoning.is_some();
    if !respelled {
        return Ok(m.clone());
    }
    // Rebuilt: role and content under their names, the other keys as they are,
    // and a reasoning under the names templates read (as transformers aliases it).
    let mut pairs: Vec<(String, Value)> = Vec::new();
    if let Some(r) = &reasoning {
        pairs.push(("thinking".into(), r.clone()));
    }
    for key in keys(m) {
        let value = match key.as_str() {
            k if k == role_key => ("role".to_string(), Value::from(role)),
            k if k == content_key => ("content".to_string(), content.clone().unwrap_or(Value::from(()))),
            _ => (key.clone(), get(m, &key).unwrap_or(Value::from(()))),
        };
        set(&mut pairs, value);
    }
    if let Some(calls) = tool_calls.filter(|_| written == "function_call") {
        set(&mut pairs, ("tool_calls".into(), calls));
    }
    if let Some(r) = reasoning {
        set(&mut pairs, ("reasoning_content".into(), r));
    }
    Ok(Value::from_pairs(pairs))
}

/// Sets `key` in place if present, else appends it (a Python dict's update).
fn set(pairs: &mut Vec<(String, Value)>, (key, value): (String, Value)) {
    match pairs.iter_mut().find(|(k, _)| *k == key) {
        Some(slot) => slot.1 = value,
        None => pairs.push((key, value)),
    }
}

/// LLaMA-Factory's `function_call` value (`{"name", "arguments"}` or a list of
/// them, as JSON text) as OpenAI `tool_calls`.
fn function_call(text: &str) -> Result<Value, String> {
    let parsed: Value = serde_json::from_str(text).map_err(|e| format!("is not JSON: {e}"))?;
    let calls: Vec<Value> = match parsed.kind() {
        ValueKind::Seq => parsed.try_iter().map_err(|e| e.to_string())?.collect(),
        ValueKind::Map => vec![parsed],
        _ => return Err("is neither a call ({\"name\", \"arguments\"}) nor a list of calls".into()),
    };
    Ok(calls.into_iter().map(|function| Value::from_pairs([("type", Value::from("function")), ("function", function)])).collect())
}

/// `tool_calls`: a list of OpenAI calls, `{"type": "function", "function":
/// {"name", "arguments"}}` (or the function's keys directly); `arguments` an
/// object or a JSON string, passed as it is.
fn check_tool_calls(calls: &Value, at: &str) -> Result<(), String> {
    if calls.kind() != ValueKind::Seq {
        return Err(format!("{at}.tool_calls is {}, not a list", kind_name(calls)));
    }
    for (i, call) in calls.try_iter().map_err(|e| e.to_string())?.enumerate() {
        let function = get(&call, "function").filter(|f| f.kind() == ValueKind::Map).unwrap_or(call.clone());
        if function.kind() != ValueKind::Map || get(&function, "name").and_then(|n| n.as_str().map(str::to_string)).is_none() {
            return Err(format!(
                "{at}.tool_calls[{i}] has no function name (OpenAI form: {{\"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}})"
            ));
        }
        match get(&function, "arguments").map(|a| a.kind()) {
            Some(ValueKind::Map | ValueKind::String | ValueKind::None) | None => {}
            Some(_) => return Err(format!("{at}.tool_calls[{i}].arguments must be an object or a JSON string")),
        }
    }
    Ok(())
}
