//! transformers' `{% generation %}` ... `{% endgeneration %}` marks (what
//! `return_assistant_tokens_mask` and TRL's `assistant_only_loss` read) are not
//! Jinja. Each becomes a block that always renders and writes a sentinel character
//! where the mark is, keeping the tag's whitespace control (`{%- generation -%}`)
//! and Jinja's `trim_blocks` / `lstrip_blocks` around it; after rendering, the
//! sentinels are taken out and their places are the marked spans.

/// Written where `{% generation %}` is: a Unicode noncharacter, never text.
pub const START: char = '\u{FDD0}';
/// Written where `{% endgeneration %}` is.
pub const END: char = '\u{FDD1}';

/// The template with its marks made into sentinel-writing blocks, and whether it
/// had any.
pub fn rewrite(text: &str) -> (String, bool) {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut found = false;
    while let Some(open) = rest.find("{%") {
        out.push_str(&rest[..open]);
        let Some(close) = rest[open..].find("%}").map(|c| open + c + 2) else {
            out.push_str(&rest[open..]);
            return (out, found);
        };
        let tag = &rest[open..close];
        let inner = tag[2..tag.len() - 2].trim_start_matches('-').trim_end_matches(['-', '+']).trim();
        let (left, right) = (if tag.starts_with("{%-") { "-" } else { "" }, if tag.ends_with("-%}") { "-" } else { "" });
        let sentinel = match inner {
            "generation" => Some(START),
            "endgeneration" => Some(END),
            _ => None,
        };
        match sentinel {
            Some(c) => {
                found = true;
                out.push_str(&format!("{{%{left} if true %}}{{{{ '{c}' }}}}{{% endif {right}%}}"));
            }
            None => out.push_str(tag),
        }
        rest = &rest[close..];
    }
    out.push_str(rest);
    (out, found)
}

/// `rendered` without its sentinels, and the byte spans between each start and
/// end; an error when they do not pair up (a template that nests marks, or data
/// holding the sentinel characters).
pub fn extract(rendered: &str) -> Result<(String, Vec<(usize, usize)>), String> {
    let mut text = String::with_capacity(rendered.len());
    let mut spans = Vec::new();
    let mut open: Option<usize> = None;
    for c in rendered.chars() {
        match (c, open) {
            (START, None) => open = Some(text.len()),
            (END, Some(start)) => {
                spans.push((start, text.len()));
                open = None;
            }
            (START | END, _) => {
                return Err("the chat template's {% generation %} marks do not pair up (nested, or U+FDD0/U+FDD1 in the data)".into());
            }
            _ => text.push(c),
        }
    }
    if open.is_some() {
        return Err("a {% generation %} block of the chat template is not closed".into());
    }
    Ok((text, spans))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_become_sentinel_blocks_keeping_whitespace_control() {
        let (t, found) = rewrite("{%- if x %}a{% generation %}b{%- endgeneration -%}{% endif %}");
        assert!(found);
        assert_eq!(
            t,
            format!("{{%- if x %}}a{{% if true %}}{{{{ '{START}' }}}}{{% endif %}}b{{%- if true %}}{{{{ '{END}' }}}}{{% endif -%}}{{% endif %}}")
        );
        assert_eq!(rewrite("no tags {{ x }}"), ("no tags {{ x }}".to_string(), false));
    }

    #[test]
    fn spans_are_where_the_sentinels_were() {
        let rendered = format!("ab{START}cd{END}e{START}{END}");
        assert_eq!(extract(&rendered).unwrap(), ("abcde".to_string(), vec![(2, 4), (5, 5)]));
        assert!(extract(&format!("{START}{START}")).is_err());
        assert!(extract(&format!("{START}x")).is_err());
    }
}
