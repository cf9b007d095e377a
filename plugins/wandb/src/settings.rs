//! What the plugin is told: `[plugins.wandb]` options, then the `WANDB_*`
//! environment variables the W&B SDK reads, then defaults. An explicit option wins
//! over the environment, as an argument to `wandb.init` does.

use std::{path::PathBuf, time::Duration};

use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Options {
    pub mode: Option<String>,
    pub project: Option<String>,
    pub entity: Option<String>,
    pub name: Option<String>,
    pub tags: Option<Vec<String>>,
    pub id: Option<String>,
    pub group: Option<String>,
    pub job_type: Option<String>,
    pub notes: Option<String>,
    pub dir: Option<PathBuf>,
    pub base_url: Option<String>,
    pub upload_timeout_secs: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Offline,
    Online,
    Disabled,
}

#[derive(Debug, Clone)]
pub struct Settings {
    pub mode: Mode,
    pub project: String,
    pub entity: Option<String>,
    pub name: Option<String>,
    pub tags: Vec<String>,
    pub id: Option<String>,
    pub group: Option<String>,
    pub job_type: Option<String>,
    pub notes: Option<String>,
    /// The directory `wandb/` goes in; `None`: the run directory.
    pub dir: Option<PathBuf>,
    pub base_url: String,
    pub api_key: Option<String>,
    /// How long the end of the run waits for the upload to finish.
    pub upload_timeout: Duration,
}

pub const DEFAULT_PROJECT: &str = "ptrain";
pub const DEFAULT_BASE_URL: &str = "https://api.wandb.ai";

/// W&B refuses these in project names and run ids.
const FORBIDDEN: &[char] = &['/', '\\', '#', '?', '%', ':'];

fn check_name(what: &str, value: &str) -> Result<(), String> {
    if value.is_empty() || value.len() > 128 {
        return Err(format!("{what} must be 1 to 128 characters, got {value:?}"));
    }
    if let Some(c) = value.chars().find(|c| FORBIDDEN.contains(c) || c.is_whitespace()) {
        return Err(format!("{what} {value:?} contains {c:?}; W&B does not allow whitespace or any of / \\ # ? % :"));
    }
    Ok(())
}

fn non_empty(value: Option<String>) -> Option<String> {
    value.map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

impl Settings {
    /// `env` looks up an environment variable (a parameter so tests need not touch
    /// the process environment).
    pub fn resolve(options: Options, env: impl Fn(&str) -> Option<String>) -> Result<Settings, String> {
        let pick = |option: Option<String>, var: &str| non_empty(option).or_else(|| non_empty(env(var)));
        let mode = match pick(options.mode, "WANDB_MODE").as_deref() {
            None | Some("offline") | Some("dryrun") => Mode::Offline,
            Some("online") | Some("run") => Mode::Online,
            Some("disabled") => Mode::Disabled,
            Some(other) => return Err(format!("mode must be \"offline\", \"online\" or \"disabled\", got {other:?}")),
        };
        let project = pick(options.project, "WANDB_PROJECT").unwrap_or_else(|| DEFAULT_PROJECT.to_string());
        check_name("project", &project)?;
        let entity = pick(options.entity, "WANDB_ENTITY");
        if let Some(e) = &entity {
            check_name("entity", e)?;
        }
        let id = pick(options.id, "WANDB_RUN_ID");
        if let Some(id) = &id {
            check_name("run id", id)?;
        }
        let tags: Vec<String> = match options.tags {
            Some(tags) => tags.into_iter().filter_map(|t| non_empty(Some(t))).collect(),
            None => env("WANDB_TAGS").map(|t| t.split(',').filter_map(|t| non_empty(Some(t.to_string()))).collect()).unwrap_or_default(),
        };
        if let Some(long) = tags.iter().find(|t| t.chars().count() > 64) {
            return Err(format!("tags must be at most 64 characters: {long:?}"));
        }
        let timeout = options.upload_timeout_secs.unwrap_or(60.0);
        if !(timeout.is_finite() && timeout >= 0.0) {
            return Err(format!("upload_timeout_secs must be a number of seconds >= 0, got {timeout}"));
        }
        let base_url = pick(options.base_url, "WANDB_BASE_URL").unwrap_or_else(|| DEFAULT_BASE_URL.to_string());
        let base_url = base_url.trim_end_matches('/').to_string();
        if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
            return Err(format!("base_url must start with http:// or https://, got {base_url:?}"));
        }
        let api_key = non_empty(env("WANDB_API_KEY"));
        if mode == Mode::Online && api_key.is_none() {
            return Err("online mode needs WANDB_API_KEY in the environment (or use mode = \"offline\" and `wandb sync` later)".into());
        }
        Ok(Settings {
            mode,
            project,
            entity,
            name: pick(options.name, "WANDB_NAME"),
            tags,
            id,
            group: pick(options.group, "WANDB_RUN_GROUP"),
            job_type: pick(options.job_type, "WANDB_JOB_TYPE"),
            notes: pick(options.notes, "WANDB_NOTES"),
            dir: options.dir.or_else(|| non_empty(env("WANDB_DIR")).map(PathBuf::from)),
            base_url,
            api_key,
            upload_timeout: Duration::from_secs_f64(timeout),
        })
    }

    /// Where people look at the run: the app, not the API host.
    pub fn run_url(&self, entity: &str, project: &str, id: &str) -> String {
        let app = if self.base_url == DEFAULT_BASE_URL { "https://wandb.ai" } else { self.base_url.as_str() };
        format!("{app}/{entity}/{project}/runs/{id}")
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn resolve(options: serde_json::Value, env: &[(&str, &str)]) -> Result<Settings, String> {
        let env: HashMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let options: Options = serde_json::from_value(options).map_err(|e| e.to_string())?;
        Settings::resolve(options, |k| env.get(k).cloned())
    }

    #[test]
    fn defaults_are_offline_in_the_ptrain_project() {
        let s = resolve(serde_json::json!({}), &[]).unwrap();
        assert_eq!(s.mode, Mode::Offline);
        assert_eq!(s.project, DEFAULT_PROJECT);
        assert_eq!(s.base_url, DEFAULT_BASE_URL);
        assert!(s.entity.is_none() && s.id.is_none() && s.tags.is_empty() && s.dir.is_none());
    }

    #[test]
    fn the_environment_fills_what_the_options_leave_out() {
        let env = [
            ("WANDB_PROJECT", "envproj"),
            ("WANDB_ENTITY", "team"),
            ("WANDB_NAME", "nice run"),
            ("WANDB_TAGS", "a, b,,c"),
            ("WANDB_RUN_ID", "abc123"),
            ("WANDB_DIR", "/tmp/w"),
            ("WANDB_BASE_URL", "http://127.0.0.1:9/"),
            ("WANDB_RUN_GROUP", "g"),
        ];
        let s = resolve(serde_json::json!({ "project": "optproj", "tags": ["x"] }), &env).unwrap();
        assert_eq!(s.project, "optproj", "an option wins over the environment");
        assert_eq!(s.tags, vec!["x"]);
        assert_eq!(s.entity.as_deref(), Some("team"));
        assert_eq!(s.name.as_deref(), Some("nice run"));
        assert_eq!(s.id.as_deref(), Some("abc123"));
        assert_eq!(s.dir, Some(PathBuf::from("/tmp/w")));
        assert_eq!(s.base_url, "http://127.0.0.1:9");
        assert_eq!(s.group.as_deref(), Some("g"));
        let s = resolve(serde_json::json!({}), &env).unwrap();
        assert_eq!(s.project, "envproj");
        assert_eq!(s.tags, vec!["a", "b", "c"]);
    }

    #[test]
    fn online_needs_a_key_and_modes_are_checked() {
        let err = resolve(serde_json::json!({}), &[("WANDB_MODE", "online")]).unwrap_err();
        assert!(err.contains("WANDB_API_KEY"), "{err}");
        let s = resolve(serde_json::json!({}), &[("WANDB_MODE", "online"), ("WANDB_API_KEY", "k")]).unwrap();
        assert_eq!((s.mode, s.api_key.as_deref()), (Mode::Online, Some("k")));
        assert_eq!(resolve(serde_json::json!({}), &[("WANDB_MODE", "disabled")]).unwrap().mode, Mode::Disabled);
        assert_eq!(resolve(serde_json::json!({}), &[("WANDB_MODE", "dryrun")]).unwrap().mode, Mode::Offline);
        assert!(resolve(serde_json::json!({ "mode": "sometimes" }), &[]).unwrap_err().contains("sometimes"));
    }

    #[test]
    fn bad_names_and_unknown_options_are_one_clear_error() {
        assert!(resolve(serde_json::json!({ "project": "a/b" }), &[]).unwrap_err().contains("project"));
        assert!(resolve(serde_json::json!({ "id": "x y" }), &[]).unwrap_err().contains("run id"));
        assert!(resolve(serde_json::json!({ "tags": ["t".repeat(65)] }), &[]).unwrap_err().contains("64"));
        assert!(resolve(serde_json::json!({ "base_url": "api.wandb.ai" }), &[]).unwrap_err().contains("http"));
        assert!(resolve(serde_json::json!({ "upload_timeout_secs": -1 }), &[]).unwrap_err().contains("upload_timeout_secs"));
        assert!(resolve(serde_json::json!({ "projekt": "p" }), &[]).unwrap_err().contains("projekt"));
    }

    #[test]
    fn the_run_page_is_on_the_app_host() {
        let s = resolve(serde_json::json!({}), &[]).unwrap();
        assert_eq!(s.run_url("e", "p", "id"), "https://wandb.ai/e/p/runs/id");
        let s = resolve(serde_json::json!({ "base_url": "https://wandb.corp" }), &[]).unwrap();
        assert_eq!(s.run_url("e", "p", "id"), "https://wandb.corp/e/p/runs/id");
    }
}
