//! `[plugins.<name>]` tables: the host's keys (cadence, queue) and the plugin's own
//! options, which are passed through to the plugin as JSON.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use ptrain_plugin_api::unknown_key::{closest, edit_distance};

use super::origins::KeyOrigins;
use crate::{
    error::{ConfigError, Error},
    schedule::Cadence,
};

/// Keys of a plugin table that override a cadence; with the keys below the host's
/// keys. Every other key is a plugin option.
const CADENCE_KEYS: &[&str] = &["every", "every_secs", "first_step", "at_eval", "at_checkpoint", "at_end"];
/// The host's keys of any plugin's table besides the cadence keys.
const OTHER_HOST_KEYS: &[&str] = &["hook_warn_s", "critical"];
/// The host's keys of a worker plugin's table only: its queue and its drain at the end.
const WORKER_KEYS: &[&str] = &["queue", "on_full", "finish_timeout_s"];

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
    /// Seconds a worker plugin gets to drain its queue at the end.
    pub finish_timeout_s: f64,
    /// Seconds a plugin's call may run before a watchdog warns (a stall).
    pub hook_warn_s: f64,
    /// A failure of the plugin (error, panic, a stall, abandonment at the end) fails the run.
    pub critical: bool,
    /// The remaining keys, for the plugin.
    pub options: serde_json::Value,
}

impl PluginSettings {
    /// Splits `table`; `attachments` are the names the plugin declares, so that
    /// `[plugins.x.<attachment>]` tables are recognised as cadences, not options.
    /// `scheduled_primary`: whether the plugin's first attachment has a cadence for
    /// the table's cadence keys to override; when it has none, they are options.
    /// `worker`: whether the plugin runs on its own thread; an inline plugin's table
    /// refuses the worker keys (`queue`, `on_full`, `finish_timeout_s`), which would
    /// otherwise be accepted and mean nothing.
    pub fn parse(
        plugin: &str,
        table: &toml::Table,
        attachments: &[&str],
        scheduled_primary: bool,
        worker: bool,
    ) -> Result<PluginSettings, ConfigError> {
        let source = format!("[plugins.{plugin}]");
        let empty = toml::Table::new();
        let mut settings = PluginSettings {
            primary: cadence(&source, &format!("plugins.{plugin}"), if scheduled_primary { table } else { &empty })?,
            attachments: BTreeMap::new(),
            queue: 1024,
            on_full: OnFull::default(),
            finish_timeout_s: 30.0,
            hook_warn_s: 60.0,
            critical: false,
            options: serde_json::Value::Object(Default::default()),
        };
        let mut options = serde_json::Map::new();
        for (key, value) in table {
            let path = format!("plugins.{plugin}.{key}");
            let err = |message: String| ConfigError { origin: source.clone(), key: path.clone(), message };
            match key.as_str() {
                k if CADENCE_KEYS.contains(&k) && scheduled_primary => {}
                k if WORKER_KEYS.contains(&k) && !worker => {
                    return Err(err(format!(
                    "applies to worker plugins only: `{plugin}` runs inline, on the training thread, with no queue and nothing to drain at the end"
                )))
                }
                "critical" => settings.critical = value.as_bool().ok_or_else(|| err("must be true or false".into()))?,
                "queue" => settings.queue = value.as_integer().filter(|q| *q >= 1).ok_or_else(|| err("must be an integer >= 1".into()))? as usize,
                "on_full" => settings.on_full = value.clone().try_into().map_err(|_| err("must be \"drop_oldest\" or \"block\"".into()))?,
                "finish_timeout_s" | "hook_warn_s" => {
                    let secs = value
                        .as_float()
                        .or_else(|| value.as_integer().map(|i| i as f64))
                        .filter(|s| s.is_finite() && *s > 0.0)
                        .ok_or_else(|| err(format!("{value} is out of range: must be a number of seconds > 0")))?;
                    if key == "hook_warn_s" {
                        settings.hook_warn_s = secs;
                    } else {
                        settings.finish_timeout_s = secs;
                    }
                }
                k if attachments.contains(&k) => {
                    let sub = value.as_table().ok_or_else(|| err(format!("`{k}` is an attachment: expected a table of cadence keys")))?;
                    if let Some(unknown) = sub.keys().find(|k| !CADENCE_KEYS.contains(&k.as_str())) {
                        let hint = closest(unknown, CADENCE_KEYS.iter().copied()).map(|k| format!("did you mean `{k}`? ")).unwrap_or_default();
                        return Err(ConfigError {
                            origin: source,
                            key: format!("{path}.{unknown}"),
                            message: format!("unknown cadence key ({hint}expected one of {})", CADENCE_KEYS.join(", ")),
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

/// A plugin's refusal of its options (from `Plugin::new`), with what the host knows
/// and the plugin does not: where the offending key was set (`(in configs/a.toml)`),
/// and, for an unknown key, the host's keys and the plugin's attachments it may have
/// meant (`evry` for `every`, `grad` for the attachment `grads`).
pub fn explain_option_error(plugin: &str, error: &str, attachments: &[&str], scheduled_primary: bool, worker: bool, origins: &KeyOrigins) -> String {
    let table = format!("plugins.{plugin}");
    let unknown = error.split("unknown field `").nth(1).and_then(|rest| rest.split('`').next());
    // The key the error is about: the unknown field, or the longest key path it names.
    let field_keys = unknown.map(|field| origins.keys_under(&format!("{table}.{field}"))).unwrap_or_default();
    let key = origins.keys_under(&table).into_iter().filter(|k| error.contains(k)).chain(field_keys).max_by_key(|k| k.len());
    let layers = origins.of(key.unwrap_or(&table));
    let mut message = error.to_string();
    if !layers.is_empty() {
        message += &format!(" (in {})", layers.join(", "));
    }
    if let Some(field) = unknown {
        let cadence = if scheduled_primary { CADENCE_KEYS } else { &[] };
        let worker_keys = if worker { WORKER_KEYS } else { &[] };
        let host: Vec<&str> = cadence.iter().chain(worker_keys).chain(OTHER_HOST_KEYS).copied().collect();
        match closest(field, host.iter().chain(attachments).copied()) {
            Some(k) if attachments.contains(&k) => message += &format!("; did you mean `{k}`, the plugin's attachment ([{table}.{k}])?"),
            Some(k) => message += &format!("; did you mean `{k}`, a key of the host?"),
            None => message += ";",
        }
        let tables =
            if attachments.is_empty() { String::new() } else { format!(", a table per attachment of the plugin ({})", attachments.join(", ")) };
        message += &format!(" [{table}] takes the host's keys {}{tables}, and the plugin's own options", host.join(", "));
    }
    message
}

/// Refuses a `[plugins.<name>]` table that neither a loaded plugin claims (by name, or
/// by the name or path it was requested as) nor names an installed plugin: a misspelt
/// table would otherwise be ignored. A table of an installed plugin that is not loaded
/// this time is kept for when it is (a config file may configure more plugins than
/// one run uses). Names the closest plugin.
pub fn check_tables_claimed(tables: &BTreeMap<String, toml::Table>, claimed: &[&str], installed: &[String]) -> Result<(), Error> {
    for table in tables.keys().filter(|t| !claimed.contains(&t.as_str())) {
        if installed.contains(table) {
            tracing::debug!("[plugins.{table}] is not used: the plugin {table} is installed but not loaded in this run");
            continue;
        }
        // A plugin requested by name is claimed by its name twice (request and descriptor).
        let mut loaded: Vec<&str> = Vec::new();
        for name in claimed.iter().copied().filter(|c| !c.contains('/') && !c.ends_with(".so")) {
            if !loaded.contains(&name) {
                loaded.push(name);
            }
        }
        let mut names: Vec<&str> = loaded.iter().copied().chain(installed.iter().map(String::as_str)).collect();
        names.sort();
        names.dedup();
        let hint = match names.iter().copied().min_by_key(|name| edit_distance(table, name)) {
            None => "no plugin is loaded or installed".to_string(),
            Some(name) => format!("did you mean `{name}`? (loaded: {}; installed: {})", loaded.join(", "), installed.join(", ")),
        };
        return Err(Error::Plugin {
            name: table.clone(),
            message: format!("[plugins.{table}] configures a plugin that is neither loaded nor installed: {hint}; fix the name or remove the table"),
        });
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tables(names: &[&str]) -> BTreeMap<String, toml::Table> {
        names.iter().map(|n| (n.to_string(), toml::Table::new())).collect()
    }

    #[test]
    fn a_refused_option_is_explained_with_its_file_and_the_key_meant() {
        let set = [("plugins.g.evry", "a.toml"), ("plugins.g.grad.every", "b.toml"), ("plugins.g.limit", "a.toml")];
        let origins = KeyOrigins::new(set.map(|(k, v)| (k.to_string(), v.to_string())).into());
        let explain = |error: &str, scheduled: bool| explain_option_error("g", error, &["grads"], scheduled, true, &origins);
        let e = explain("invalid options: plugins.g.evry: unknown field `evry`, expected `limit`", true);
        assert!(
            e.starts_with(
                "invalid options: plugins.g.evry: unknown field `evry`, expected `limit` (in a.toml); did you mean `every`, a key of the host?"
            ),
            "{e}"
        );
        assert!(e.ends_with("[plugins.g] takes the host's keys every, every_secs, first_step, at_eval, at_checkpoint, at_end, queue, on_full, finish_timeout_s, hook_warn_s, critical, a table per attachment of the plugin (grads), and the plugin's own options"), "{e}");
        // An inline plugin's table has no worker keys to offer.
        let e = explain_option_error("g", "unknown field `qeue`", &[], true, false, &origins);
        assert!(e.ends_with("takes the host's keys every, every_secs, first_step, at_eval, at_checkpoint, at_end, hook_warn_s, critical, and the plugin's own options"), "{e}");
        let e = explain("unknown field `grad`, expected `limit`", true);
        assert!(e.contains("(in b.toml); did you mean `grads`, the plugin's attachment ([plugins.g.grads])?"), "{e}");
        // Without a scheduled first attachment the cadence keys are the plugin's options.
        let e = explain("invalid options: plugins.g.evry: unknown field `evry`", false);
        assert!(!e.contains("did you mean") && e.contains("takes the host's keys queue, on_full"), "{e}");
        let e = explain("invalid options: plugins.g.limit: invalid type: string \"x\", expected f64", true);
        assert!(e.ends_with("expected f64 (in a.toml)"), "{e}");
        let e = explain("option `path` is required", true);
        assert_eq!(e, "option `path` is required (in a.toml, b.toml)", "a table from two files names both");
    }

    #[test]
    fn a_table_of_no_installed_plugin_is_refused_naming_the_closest_one() {
        // As the loader claims them: each plugin's name, then what it was requested as.
        let claimed = ["jsonl", "jsonl", "gradwatch", "./target/release/libptrain_plugin_gradwatch.so"];
        let installed = ["jsonl".to_string(), "checkpoint".to_string()];
        assert!(check_tables_claimed(&tables(&["jsonl", "gradwatch"]), &claimed, &installed).is_ok());
        // Installed, not loaded this time: kept for a run that loads it.
        assert!(check_tables_claimed(&tables(&["checkpoint"]), &claimed, &installed).is_ok());
        let e = check_tables_claimed(&tables(&["gradwach"]), &claimed, &installed).unwrap_err().to_string();
        assert!(e.starts_with("plugin gradwach: [plugins.gradwach] configures a plugin that is neither loaded nor installed"), "{e}");
        assert!(e.contains("did you mean `gradwatch`? (loaded: jsonl, gradwatch;"), "each loaded plugin once: {e}");
        let e = check_tables_claimed(&tables(&["chekpoint"]), &[], &installed).unwrap_err().to_string();
        assert!(e.contains("did you mean `checkpoint`?"), "{e}");
        let e = check_tables_claimed(&tables(&["flops"]), &[], &[]).unwrap_err().to_string();
        assert!(e.contains("no plugin is loaded or installed"), "{e}");
    }
}
