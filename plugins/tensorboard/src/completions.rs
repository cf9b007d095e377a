//! The `completions` record of a GRPO run that samples (`grpo.log_completions_every`) as
//! TensorBoard text: a markdown table, one row per completion (TensorBoard's text
//! dashboard renders markdown). The record is a `Text` metric named `completions`
//! holding a JSON table, `{"columns": [...], "rows": [[...], ...]}` (the core's
//! `rollout::record`); anything else named so is written as the text it is.

/// The metric's name.
pub const NAME: &str = "completions";

/// The markdown table of a `completions` record, or `None` when `json` is not one.
pub fn markdown(json: &str) -> Option<String> {
    let table: serde_json::Value = serde_json::from_str(json).ok()?;
    let columns = table.get("columns")?.as_array()?;
    let rows = table.get("rows")?.as_array()?;
    let line = |cells: Vec<String>| format!("| {} |\n", cells.join(" | "));
    let mut out = line(columns.iter().map(cell).collect());
    out.push_str(&line(vec!["---".to_string(); columns.len()]));
    for row in rows {
        out.push_str(&line(row.as_array()?.iter().map(cell).collect()));
    }
    Some(out)
}

/// A value as a table cell: strings as they are, `|` escaped and line breaks as `<br>`
/// (a cell is one line of the table), anything else as JSON.
fn cell(v: &serde_json::Value) -> String {
    let text = match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    text.replace('|', "\\|").replace("\r\n", "<br>").replace(['\r', '\n'], "<br>")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_completions_table_is_a_markdown_table_whose_cells_stay_on_their_line() {
        let json = r#"{"columns": ["step", "prompt", "completion", "len", "advantage"],
                       "rows": [[3, "a|b", "x\ny", 1.5, null], [3, "c", "z", -2, 0.25]]}"#;
        let expected = "| step | prompt | completion | len | advantage |\n| --- | --- | --- | --- | --- |\n\
                        | 3 | a\\|b | x<br>y | 1.5 | null |\n| 3 | c | z | -2 | 0.25 |\n";
        assert_eq!(markdown(json).as_deref(), Some(expected));
        assert_eq!(markdown("plain text"), None);
        assert_eq!(markdown(r#"{"rows": []}"#), None);
    }
}
