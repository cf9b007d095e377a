//! Relative paths: in a configuration file they name files beside that file (as in
//! cargo), so a file works from any working directory; on the command line
//! (`--set`, flags) they are relative to the working directory, as every shell
//! path is. A run records its configuration with absolute paths, so that
//! `<run-dir>/config.toml` means the same files wherever it is read from.

use std::path::{Path, PathBuf};

use super::Config;

/// `gpt2`, `openai-community/gpt2`: what a hub model id looks like (a
/// `model.init_from` that is one is not a path to rebase).
pub(crate) fn looks_like_hub_name(spec: &str) -> bool {
    let part =
        |s: &str| s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric()) && s.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    let parts: Vec<&str> = spec.split('/').collect();
    parts.len() <= 2 && parts.iter().all(|p| part(p)) && !spec.contains("..")
}

/// The keys whose values are paths, by table (`data.datasets` entries' `path` too).
const PATH_KEYS: &[(&str, &str)] = &[
    ("run", "run_dir"),
    ("data", "path"),
    ("data", "val_path"),
    ("data", "tokenizer"),
    ("data", "tokens_cache"),
    ("model", "init_from"),
    ("model.torchscript", "path"),
];

/// Not a file: `data.tokenizer = "bytes"` (raw bytes, no tokenizer).
fn is_path(key: &str, value: &str) -> bool {
    let bytes = key == "tokenizer" && value == super::BYTES_TOKENIZER;
    !value.is_empty() && !bytes
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_owned())
}

/// Rewrites the relative paths of a file's layer against `base` (the file's folder).
/// `model.init_from` that is nowhere (beside the file or in the working directory)
/// and looks like a hub id (`gpt2`, `openai-community/gpt2`) is left as written,
/// so that its error can say how to download it.
pub(super) fn resolve_in_file(layer: &mut toml::Table, base: &Path) {
    let base = absolute(base);
    let rebase = |key: &str, value: &mut toml::Value| {
        let Some(text) = value.as_str() else { return };
        if !is_path(key, text) || Path::new(text).is_absolute() {
            return;
        }
        let joined = base.join(text);
        let hub_id = looks_like_hub_name(text) && !Path::new(text).exists();
        if key == "init_from" && !joined.exists() && hub_id {
            return;
        }
        *value = toml::Value::String(joined.display().to_string());
    };
    for (section, key) in PATH_KEYS {
        let mut table = Some(&mut *layer);
        for part in section.split('.') {
            table = table.and_then(|t| t.get_mut(part)).and_then(toml::Value::as_table_mut);
        }
        if let Some(value) = table.and_then(|t| t.get_mut(*key)) {
            rebase(key, value);
        }
    }
    let datasets = layer.get_mut("data").and_then(toml::Value::as_table_mut).and_then(|t| t.get_mut("datasets")).and_then(toml::Value::as_array_mut);
    for entry in datasets.into_iter().flatten() {
        if let Some(value) = entry.as_table_mut().and_then(|t| t.get_mut("path")) {
            rebase("path", value);
        }
    }
}

impl Config {
    /// The configuration as a run records it (`<run-dir>/config.toml`, each
    /// checkpoint's): [`Config::to_toml`] with every relative path made absolute.
    pub fn to_recorded_toml(&self) -> String {
        let mut config = self.clone();
        let fix = |key: &str, value: &mut String| {
            if is_path(key, value) && Path::new(value.as_str()).is_relative() {
                *value = absolute(Path::new(value.as_str())).display().to_string();
            }
        };
        fix("run_dir", &mut config.run.run_dir);
        fix("path", &mut config.data.path);
        fix("val_path", &mut config.data.val_path);
        fix("tokenizer", &mut config.data.tokenizer);
        fix("tokens_cache", &mut config.data.tokens_cache);
        fix("path", &mut config.model.torchscript.path);
        if Path::new(&config.model.init_from).exists() {
            fix("init_from", &mut config.model.init_from);
        }
        for d in &mut config.data.datasets {
            fix("path", &mut d.path);
        }
        // Where the checkpoints are: resuming from another working directory looks there.
        if let Some(toml::Value::String(dir)) = config.plugins.get_mut("checkpoint").and_then(|t| t.get_mut("dir")) {
            fix("dir", dir);
        }
        config.to_toml()
    }
}
