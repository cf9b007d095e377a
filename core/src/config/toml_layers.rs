//! The text of a configuration layer: read from a file, parsed as TOML (earlier
//! versions' flat `[model]` keys moved or refused), its keys' sources recorded, and
//! merged over the layers before it.

use std::{collections::BTreeMap, path::Path};

use super::{move_flat_keys, refuse_flat_keys};
use crate::error::{ConfigError, Error};

/// A configuration file's text. What is no TOML text (a directory, bytes that are
/// not UTF-8) is refused as a bad configuration (exit 2), naming the file and where.
pub(super) fn read_file(path: &Path) -> Result<String, Error> {
    let bad = |message: String| ConfigError { origin: path.display().to_string(), key: String::new(), message }.into();
    if path.is_dir() {
        return Err(bad("is a directory: --config takes a TOML file".into()));
    }
    let bytes = std::fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::MissingFile { what: "config file", path: path.to_owned() },
        _ => Error::Io { path: path.to_owned(), source: e },
    })?;
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let line = e.as_bytes()[..at].iter().filter(|b| **b == b'\n').count() + 1;
        bad(format!("not UTF-8 text: line {line}, byte {at} (a TOML file is UTF-8)"))
    })
}

pub(super) fn parse_layer(text: &str, origin: &str) -> Result<toml::Table, ConfigError> {
    let mut layer = parse_toml(text, origin)?;
    flat_model_keys(&mut layer, origin, false)?;
    Ok(layer)
}

pub(super) fn parse_toml(text: &str, origin: &str) -> Result<toml::Table, ConfigError> {
    text.parse().map_err(|e: toml::de::Error| ConfigError {
        origin: origin.to_string(),
        key: String::new(),
        message: e.to_string().trim().replace('\n', " "),
    })
}

/// Earlier versions' flat `[model]` keys: read into their tables in a `recorded`
/// configuration ([`move_flat_keys`]), refused elsewhere naming the key's name now.
pub(super) fn flat_model_keys(layer: &mut toml::Table, origin: &str, recorded: bool) -> Result<(), ConfigError> {
    let Some(toml::Value::Table(model)) = layer.get_mut("model") else { return Ok(()) };
    let found = if recorded { move_flat_keys(model) } else { refuse_flat_keys(model) };
    found.map_err(|(key, message)| ConfigError { origin: origin.into(), key, message })
}

/// Records the dotted path of every value in `layer` (tables are walked into).
pub(super) fn record_keys(layer: &toml::Table, prefix: &str, source: &str, out: &mut BTreeMap<String, String>) {
    for (key, value) in layer {
        let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
        match value {
            toml::Value::Table(t) => record_keys(t, &path, source, out),
            _ => {
                out.insert(path, source.to_string());
            }
        }
    }
}

pub(super) fn parse_value(raw: &str) -> toml::Value {
    format!("v = {raw}").parse::<toml::Table>().ok().and_then(|mut t| t.remove("v")).unwrap_or_else(|| toml::Value::String(raw.to_string()))
}

/// Deep merge: tables merge key by key, everything else (arrays too) is replaced.
pub(super) fn merge(base: &mut toml::Table, layer: toml::Table) {
    for (key, value) in layer {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(base_table)), toml::Value::Table(layer_table)) => merge(base_table, layer_table),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}
