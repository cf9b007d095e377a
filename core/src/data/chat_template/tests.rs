use minijinja::Value;

use super::*;

fn template(text: &str) -> ChatTemplate {
    ChatTemplate::from_text(text, PathBuf::from("t.jinja"), vec![("eos_token".into(), "</s>".into())], "</s>".into()).unwrap().unwrap()
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

fn render(t: &ChatTemplate, messages: &str, tools: &str) -> std::result::Result<Rendered, String> {
    let messages: Vec<Value> = json(messages).try_iter().unwrap().collect();
    let tools = json(tools);
    t.render(Conversation { messages: &messages, tools: &tools, kwargs: &[] }, false)
}

#[test]
fn messages_and_tools_reach_the_template_as_they_are() {
    // Every message key, the tools, the special tokens; maps keep their order and
    // tojson writes what Python's json.dumps writes.
    let t = template(
        "{% for t in tools %}{{ t | tojson }}\n{% endfor %}{% for m in messages %}{{ m.role }}:{{ m.content }}\
         {% for c in m.tool_calls %}<{{ c.function.name }} {{ c.function.arguments | tojson }}>{% endfor %}|{% endfor %}{{ eos_token }}",
    );
    let tools = r#"[{"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": "<&>"}}}]"#;
    let messages = r#"[{"role": "user", "content": "hi"}, {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"y": 2.0, "b": [1, 2]}}}]}]"#;
    let out = render(&t, messages, tools).unwrap();
    assert_eq!(
        out.text,
        "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"z\": 1, \"a\": \"<&>\"}}}\n\
         user:hi|assistant:None<f {\"y\": 2.0, \"b\": [1, 2]}>|</s>"
    );
}

#[test]
fn a_null_content_added_to_text_fails_as_in_jinja2() {
    // Qwen2.5's template concatenates the content: Jinja2 raises a TypeError on None.
    let t = template("{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content }}{% endfor %}");
    let err = render(&t, r#"[{"role": "user", "content": null}]"#, "null").unwrap_err();
    assert!(err.contains("failed to render"), "{err}");
}

#[test]
fn generation_marks_give_the_spans_they_enclose() {
    let t = template("{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' %}{% generation %}{{ m.content }}</s>{% endgeneration %}{% else %}{{ m.content }}{% endif %}\n{% endfor %}");
    assert!(t.has_marks);
    let out = render(&t, r#"[{"role": "user", "content": "a"}, {"role": "assistant", "content": "bc"}]"#, "null").unwrap();
    // trim_blocks takes the newline after `{% endif %}`, as Jinja2 does.
    assert_eq!(out.text, "<user>a<assistant>bc</s>");
    assert_eq!(&out.text[out.marked[0].0..out.marked[0].1], "bc</s>");
}

#[test]
fn raise_exception_and_strftime_now_are_there() {
    let t = template("{% if messages|length > 1 %}{{ raise_exception('one message only') }}{% endif %}{{ strftime_now('%Y') }}");
    let year = render(&t, r#"[{"role": "user", "content": "a"}]"#, "null").unwrap().text;
    assert_eq!(year, chrono::Local::now().format("%Y").to_string());
    assert!(t.uses_date);
    let err = render(&t, r#"[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]"#, "null").unwrap_err();
    assert!(err.contains("one message only"), "{err}");
}
