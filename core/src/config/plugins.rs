//! `[plugins.<name>]` tables: the host's keys (cadence, queue) and the plugin's own
//! options, which are passed through to the plugin as JSON.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{error::ConfigError, hooks::Cadence};

/// Keys of a plugin table that override a cadence; with `queue` and `on_full` the
/// host's keys. Every other key is a plugin option.
const CADENCE_KEYS: &[&str] = &["every", "every_secs", "first_step", "at_eval", "at_checkpoint", "at_end"];

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnFull {
    /// Drop the oldest queued item and count it: a slow sink never stalls training.
    #[default]
    DropOldest,
    /// Wait for room: nothing is lost, but a slow sink slows training.
    Block,
}

/// Overrides of one cadence; `None` keeps the plugin's default.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CadenceOverride {
    pub every: Option<u64>,
    pub every_secs: Option<f64>,
    pub first_step: Option<bool>,
    pub at_eval: Option<bool>,
    pub at_checkpoint: Option<bool>,
    pub at_end: Option<bool>,
}

impl CadenceOverride {
    pub fn is_empty(&self) -> bool {
        *self == CadenceOverride::default()
    }

    /// `cadence` with the overridden fields replaced.
    pub fn apply(&self, cadence: Cadence) -> Cadence {
        Cadence {
            every_steps: self.every.unwrap_or(cadence.every_steps),
            every_secs: self.every_secs.unwrap_or(cadence.every_secs),
            first_step: self.first_step.unwrap_or(cadence.first_step),
            at_eval: self.at_eval.unwrap_or(cadence.at_eval),
            at_checkpoint: self.at_checkpoint.unwrap_or(cadence.at_checkpoint),
            at_end: self.at_end.unwrap_or(cadence.at_end),
        }
    }
}

/// A plugin table, split into what the host applies and what the plugin receives.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginSettings {
    /// Applies to the plugin's first (primary) attachment.
    pub primary: CadenceOverride,
    /// `[plugins.<name>.<attachment>]` tables.
    pub attachments: BTreeMap<String, CadenceOverride>,
    pub queue: usize,
    pub on_full: OnFull,
    /// The remaining keys, for the plugin.
    pub options: serde_json::Value,
}

impl PluginSettings {
    /// Splits `table`; `attachments` are the names the plugin declares, so that
    /// `[plugins.x.<attachment>]` tables are recognised as cadences, not options.
    /// `scheduled_primary`: whether the plugin's first attachment has a cadence for
    /// the table's cadence keys to override; when it has none, they are options.
    pub fn parse(plugin: &str, table: &toml::Table, attachments: &[&str], scheduled_primary: bool) -> Result<PluginSettings, ConfigError> {
        let source = format!("[plugins.{plugin}]");
        let empty = toml::Table::new();
        let mut settings = PluginSettings {
            primary: cadence(&source, &format!("plugins.{plugin}"), if scheduled_primary { table } else { &empty })?,
            attachments: BTreeMap::new(),
            queue: 1024,
            on_full: OnFull::default(),
            options: serde_json::Value::Object(Default::default()),
        };
        let mut options = serde_json::Map::new();
        for (key, value) in table {
            let path = format!("plugins.{plugin}.{key}");
            let err = |message: String| ConfigError { origin: source.clone(), key: path.clone(), message };
            match key.as_str() {
                k if CADENCE_KEYS.contains(&k) && scheduled_primary => {}
                "queue" => settings.queue = value.as_integer().filter(|q| *q >= 1).ok_or_else(|| err("must be an integer >= 1".into()))? as usize,
                "on_full" => settings.on_full = value.clone().try_into().map_err(|_| err("must be \"drop_oldest\" or \"block\"".into()))?,
                k if attachments.contains(&k) => {
                    let sub = value.as_table().ok_or_else(|| err(format!("`{k}` is an attachment: expected a table of cadence keys")))?;
                    if let Some(unknown) = sub.keys().find(|k| !CADENCE_KEYS.contains(&k.as_str())) {
                        return Err(ConfigError {
                            origin: source,
                            key: format!("{path}.{unknown}"),
                            message: format!("unknown cadence key (expected one of {})", CADENCE_KEYS.join(", ")),
                        });
                    }
                    settings.attachments.insert(k.to_string(), cadence(&source, &path, sub)?);
                }
                _ => {
                    let json = serde_json::to_value(value).map_err(|e| err(e.to_string()))?;
                    options.insert(key.clone(), json);
                }
            }
        }
        settings.options = serde_json::Value::Object(options);
        Ok(settings)
    }
}

fn cadence(source: &str, prefix: &str, table: &toml::Table) -> Result<CadenceOverride, ConfigError> {
    let err = |key: &str, message: &str| ConfigError { origin: source.into(), key: format!("{prefix}.{key}"), message: message.into() };
    let int = |key: &str| -> Result<Option<u64>, ConfigError> {
        table.get(key).map(|v| v.as_integer().filter(|n| *n >= 0).map(|n| n as u64).ok_or_else(|| err(key, "must be an integer >= 0"))).transpose()
    };
    let float = |key: &str| -> Result<Option<f64>, ConfigError> {
        table
            .get(key)
            .map(|v| v.as_float().or_else(|| v.as_integer().map(|i| i as f64)).filter(|x| *x >= 0.0).ok_or_else(|| err(key, "must be a number >= 0")))
            .transpose()
    };
    let flag = |key: &str| -> Result<Option<bool>, ConfigError> {
        table.get(key).map(|v| v.as_bool().ok_or_else(|| err(key, "must be true or false"))).transpose()
    };
    Ok(CadenceOverride {
        every: int("every")?,
        every_secs: float("every_secs")?,
        first_step: flag("first_step")?,
        at_eval: flag("at_eval")?,
        at_checkpoint: flag("at_checkpoint")?,
        at_end: flag("at_end")?,
    })
}
