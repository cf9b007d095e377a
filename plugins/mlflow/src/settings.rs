//! `[plugins.mlflow]` options and the environment variables the Python client reads.

use std::time::Duration;

use ptrain_mlflow::{auth::URI_VAR, check_uri, Auth};
use serde::Deserialize;

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Options {
    /// The tracking server (`MLFLOW_TRACKING_URI`).
    pub uri: Option<String>,
    /// Experiment name, created when missing (`MLFLOW_EXPERIMENT_NAME`, else `Default`).
    pub experiment: Option<String>,
    /// The MLflow run name (default: ptrain's run name).
    pub run_name: Option<String>,
    /// Seconds one HTTP request may take.
    pub timeout_secs: Option<f64>,
    /// Seconds a request is retried (5xx, network errors) before its items go to pending.jsonl.
    pub retry_secs: Option<f64>,
    /// Seconds the end of the run waits for what is still queued.
    pub end_timeout_secs: Option<f64>,
    /// Least seconds between two metric requests: values logged meanwhile share a request.
    pub flush_secs: Option<f64>,
    /// Seconds between attempts to reach a server that went away.
    pub reconnect_secs: Option<f64>,
}

#[derive(Debug, Clone)]
pub struct Settings {
    /// The URI as given (for run.json and messages).
    pub uri: String,
    /// Why ptrain cannot talk to `uri` (not http or https): logged once, and every item
    /// goes to pending.jsonl for `ptrain sync mlflow --uri`.
    pub uri_problem: Option<String>,
    pub experiment: String,
    pub run_name: Option<String>,
    pub auth: Auth,
    pub timeout: Duration,
    pub retry: Duration,
    pub end_timeout: Duration,
    pub flush: Duration,
    pub reconnect: Duration,
}

pub const DEFAULT_EXPERIMENT: &str = "Default";

fn seconds(name: &str, value: Option<f64>, default: f64, min: f64) -> Result<Duration, String> {
    let v = value.unwrap_or(default);
    if !(v.is_finite() && v >= min) {
        return Err(format!("{name} must be a number of seconds >= {min}, got {v}"));
    }
    Ok(Duration::from_secs_f64(v))
}

fn non_empty(v: Option<String>) -> Option<String> {
    v.map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

impl Settings {
    /// `env` looks a variable up (a parameter so tests need not touch the process environment).
    pub fn resolve(options: Options, env: impl Fn(&str) -> Option<String>, auth: Auth) -> Result<Settings, String> {
        let uri = non_empty(options.uri).or_else(|| non_empty(env(URI_VAR))).ok_or_else(|| {
            format!("no tracking server: set `uri` in [plugins.mlflow] or {URI_VAR} (for example http://127.0.0.1:5000, as `mlflow server` prints)")
        })?;
        let uri_problem = check_uri(&uri).err();
        let uri = check_uri(&uri).unwrap_or(uri);
        let experiment =
            non_empty(options.experiment).or_else(|| non_empty(env("MLFLOW_EXPERIMENT_NAME"))).unwrap_or_else(|| DEFAULT_EXPERIMENT.into());
        if experiment.chars().count() > 500 {
            return Err("experiment names are at most 500 characters".into());
        }
        Ok(Settings {
            uri,
            uri_problem,
            experiment,
            run_name: non_empty(options.run_name),
            auth,
            timeout: seconds("timeout_secs", options.timeout_secs, 10.0, 0.1)?,
            retry: seconds("retry_secs", options.retry_secs, 30.0, 0.0)?,
            end_timeout: seconds("end_timeout_secs", options.end_timeout_secs, 30.0, 0.0)?,
            flush: seconds("flush_secs", options.flush_secs, 1.0, 0.0)?,
            reconnect: seconds("reconnect_secs", options.reconnect_secs, 30.0, 0.1)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn resolve(options: serde_json::Value, env: &[(&str, &str)]) -> Result<Settings, String> {
        let env: HashMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let options: Options = serde_json::from_value(options).map_err(|e| e.to_string())?;
        Settings::resolve(options, |k| env.get(k).cloned(), Auth::None)
    }

    #[test]
    fn the_option_wins_over_the_environment() {
        let env = [("MLFLOW_TRACKING_URI", "http://env:5000/"), ("MLFLOW_EXPERIMENT_NAME", "envexp")];
        let s = resolve(serde_json::json!({}), &env).unwrap();
        assert_eq!((s.uri.as_str(), s.experiment.as_str()), ("http://env:5000", "envexp"));
        let s = resolve(serde_json::json!({ "uri": "https://opt", "experiment": "mine", "run_name": "r" }), &env).unwrap();
        assert_eq!((s.uri.as_str(), s.experiment.as_str(), s.run_name.as_deref()), ("https://opt", "mine", Some("r")));
        let s = resolve(serde_json::json!({ "uri": "http://x" }), &[]).unwrap();
        assert_eq!(s.experiment, DEFAULT_EXPERIMENT);
        assert_eq!(
            (s.timeout, s.retry, s.end_timeout, s.flush),
            (Duration::from_secs(10), Duration::from_secs(30), Duration::from_secs(30), Duration::from_secs(1))
        );
    }

    #[test]
    fn a_missing_server_and_bad_numbers_are_errors_but_a_wrong_scheme_is_not() {
        assert!(resolve(serde_json::json!({}), &[]).unwrap_err().contains("MLFLOW_TRACKING_URI"));
        assert!(resolve(serde_json::json!({ "uri": "http://x", "retry_secs": -1 }), &[]).unwrap_err().contains("retry_secs"));
        assert!(resolve(serde_json::json!({ "uri": "http://x", "timeout_secs": 0 }), &[]).unwrap_err().contains("timeout_secs"));
        assert!(resolve(serde_json::json!({ "uri": "http://x", "experimnt": "e" }), &[]).unwrap_err().contains("experimnt"));
        let s = resolve(serde_json::json!({ "uri": "file:///tmp/mlruns" }), &[]).unwrap();
        assert!(s.uri_problem.unwrap().contains("http"));
        assert_eq!(s.uri, "file:///tmp/mlruns");
    }
}
