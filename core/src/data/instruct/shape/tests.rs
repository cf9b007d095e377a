use std::{path::Path, sync::Arc};

use minijinja::Value;

use super::*;
use crate::{
    config::ColumnMap,
    data::reader::{At, Place},
};

fn record(json: &str) -> Record {
    let columns = crate::data::reader::tests_support::parse(json);
    Record { place: Place { file: Arc::from(Path::new("rows.jsonl")), at: At::Line(1) }, columns }
}

fn shaper(kind: DataKind) -> Shaper {
    Shaper { kind, columns: ColumnMap::default(), ignore: Vec::new() }
}

fn chat(json: &str) -> Result<Chat, String> {
    match shaper(DataKind::Chat).shape(&record(json))? {
        Example::Chat(chat) => Ok(chat),
        other => panic!("not a chat: {other:?}"),
    }
}

fn as_json(messages: &[Value]) -> String {
    serde_json::to_string(messages).unwrap()
}

#[test]
fn openai_messages_pass_with_every_key() {
    let c = chat(r#"{"messages": [{"role": "user", "content": "2+2?", "name": "bob"}, {"role": "assistant", "content": "4"}], "tools": "[{\"name\": \"f\"}]"}"#).unwrap();
    assert_eq!(as_json(&c.messages), r#"[{"role":"user","content":"2+2?","name":"bob"},{"role":"assistant","content":"4"}]"#);
    assert_eq!(serde_json::to_string(&c.tools).unwrap(), r#"[{"name":"f"}]"#, "a JSON string of tools is parsed, as TRL does");
}

#[test]
fn sharegpt_with_tool_turns_becomes_openai_messages() {
    let c = chat(
        r#"{"conversations": [{"from": "human", "value": "weather?"}, {"from": "function_call", "value": "{\"name\": \"get\", \"arguments\": {\"city\": \"Paris\"}}"},
            {"from": "observation", "value": "sunny"}, {"from": "gpt", "value": "Sunny."}]}"#,
    )
    .unwrap();
    assert_eq!(
        as_json(&c.messages),
        r#"[{"role":"user","content":"weather?"},{"role":"assistant","content":"","tool_calls":[{"type":"function","function":{"name":"get","arguments":{"city":"Paris"}}}]},{"role":"tool","content":"sunny"},{"role":"assistant","content":"Sunny."}]"#
    );
}

#[test]
fn alpaca_is_made_into_messages_as_llama_factory_does() {
    let c = chat(r#"{"instruction": "Add", "input": "2 and 2", "output": "4", "system": "Be brief.", "history": [["hi", "hello"]]}"#).unwrap();
    assert_eq!(
        as_json(&c.messages),
        r#"[{"role":"system","content":"Be brief."},{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},{"role":"user","content":"Add\n2 and 2"},{"role":"assistant","content":"4"}]"#
    );
    let c = chat(r#"{"instruction": "Say hi", "input": "", "output": "hi"}"#).unwrap();
    assert_eq!(as_json(&c.messages), r#"[{"role":"user","content":"Say hi"},{"role":"assistant","content":"hi"}]"#);
}

#[test]
fn other_names_through_the_column_map() {
    let mut s = shaper(DataKind::Chat);
    s.columns.messages = "dialog".into();
    s.columns.role = "speaker".into();
    s.columns.content = "text".into();
    let Example::Chat(c) =
        s.shape(&record(r#"{"dialog": [{"speaker": "user", "text": "a"}, {"speaker": "assistant", "text": "b", "lang": "en"}]}"#)).unwrap()
    else {
        panic!()
    };
    assert_eq!(as_json(&c.messages), r#"[{"role":"user","content":"a"},{"role":"assistant","content":"b","lang":"en"}]"#);
}

#[test]
fn nothing_is_dropped_silently() {
    let err = chat(r#"{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "id": 7}"#).unwrap_err();
    assert!(err.contains("column `id` is neither read nor passed") && err.contains("data.ignore_columns = [\"id\"]"), "{err}");
    let mut s = shaper(DataKind::Chat);
    s.ignore = vec!["id".into()];
    assert!(s.shape(&record(r#"{"messages": [{"role": "assistant", "content": "b"}], "id": 7}"#)).is_ok());
    // A plain prompt/completion row passes no tools to a template.
    let err = shaper(DataKind::PromptCompletion).shape(&record(r#"{"prompt": "a", "completion": "b", "tools": []}"#)).unwrap_err();
    assert!(err.contains("column `tools`"), "{err}");
}

#[test]
fn bad_rows_are_named() {
    let cases = [
        (r#"{"text": "x"}"#, "no `messages` (OpenAI), `conversations` (ShareGPT) or `instruction`/`output` (Alpaca) column; the row's columns: text"),
        (r#"{"messages": [{"role": "robot", "content": "x"}]}"#, "messages[0] has the unknown role \"robot\""),
        (r#"{"messages": [{"role": "user", "content": "x"}]}"#, "has no assistant message"),
        (
            r#"{"messages": [{"role": "user", "content": null}, {"role": "assistant", "content": "x"}]}"#,
            "messages[0] has no `content` (or it is null)",
        ),
        (r#"{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": null}]}"#, "messages[1] has no `content`"),
        (
            r#"{"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {"arguments": {}}}]}]}"#,
            "tool_calls[0] has no function name",
        ),
        (r#"{"messages": [{"role": "assistant", "content": "x"}], "tools": {"name": "f"}}"#, "`tools` is an object, not a list"),
        (r#"{"instruction": "x"}"#, "an Alpaca row needs `output`"),
    ];
    for (row, expected) in cases {
        let err = chat(row).unwrap_err();
        assert!(err.contains(expected), "{row}: {err}");
    }
    // An assistant turn that only calls tools may have no content (OpenAI's form).
    assert!(chat(r#"{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}"#).is_ok());
}
