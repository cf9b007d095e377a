//! A GRPO run's `completions` record (`grpo.log_completions_every`: a `Text` metric
//! holding `{"columns": [...], "rows": [[...], ...]}`) as a W&B table, as the Python
//! SDK logs a `wandb.Table`: the table's JSON in the run's files under
//! `media/table/<name>_<step>_<sha256[:20]>.table.json`, a files record naming it (so
//! `wandb sync` uploads it), and in the history row a `table-file` value pointing at
//! it. Online, the same file is uploaded and the streamed row carries the same value
//! (see [`crate::online`]).

use std::{io, path::Path};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// The metric's name.
pub const NAME: &str = "completions";

/// A table written under `files`: its path relative to `files` and the history value.
pub struct Written {
    pub path: String,
    pub value: String,
}

/// Writes the record `text` of `step` as a table file under `files`; `None` when `text`
/// is not a table (it is then logged as the text it is).
pub fn write(files: &Path, name: &str, step: u64, text: &str) -> io::Result<Option<Written>> {
    let Ok(record) = serde_json::from_str::<Value>(text) else { return Ok(None) };
    let (Some(columns), Some(rows)) = (record.get("columns").and_then(Value::as_array), record.get("rows").and_then(Value::as_array)) else {
        return Ok(None);
    };
    let body = json!({ "columns": columns, "data": rows }).to_string();
    let sha256: String = Sha256::digest(body.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    let path = format!("media/table/{}_{step}_{}.table.json", name.replace('/', "_"), &sha256[..20]);
    let file = files.join(&path);
    std::fs::create_dir_all(file.parent().unwrap_or(files))?;
    std::fs::write(&file, &body)?;
    let value = json!({
        "_type": "table-file",
        "path": path,
        "sha256": sha256,
        "size": body.len(),
        "ncols": columns.len(),
        "nrows": rows.len(),
        "log_mode": "IMMUTABLE",
    });
    Ok(Some(Written { path, value: value.to_string() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_written_as_the_sdk_writes_a_table() {
        let dir = tempfile::tempdir().unwrap();
        let text =
            r#"{"columns": ["step", "prompt", "completion", "len", "advantage"], "rows": [[1, "a", "b|c", 1.0, 0.5], [1, "x", "y", null, -0.5]]}"#;
        let written = write(dir.path(), NAME, 1, text).unwrap().unwrap();
        // The Python SDK's file for the same table (wandb 0.31, `wandb.Table(columns, data)`).
        let sdk = r#"{"columns":["step","prompt","completion","len","advantage"],"data":[[1,"a","b|c",1.0,0.5],[1,"x","y",null,-0.5]]}"#;
        assert_eq!(std::fs::read_to_string(dir.path().join(&written.path)).unwrap(), sdk);
        assert_eq!(written.path, "media/table/completions_1_5da95de870ec05152bf5.table.json", "the SDK's hash of the same bytes");
        let value: Value = serde_json::from_str(&written.value).unwrap();
        assert_eq!((value["_type"].as_str(), value["nrows"].as_u64(), value["ncols"].as_u64()), (Some("table-file"), Some(2), Some(5)));
        assert_eq!(value["size"].as_u64(), Some(sdk.len() as u64));
        assert!(write(dir.path(), NAME, 1, "plain text").unwrap().is_none());
    }
}
