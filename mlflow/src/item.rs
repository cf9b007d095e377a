//! What is sent to an MLflow run, one [`Item`] at a time: the unit the plugin queues,
//! writes to `pending.jsonl` when the server cannot take it, and `ptrain sync mlflow`
//! reads back. Every item already fits the server's limits.

use serde::{Deserialize, Serialize};

/// The tracking server's limits (mlflow/utils/validation.py).
pub const MAX_METRICS_PER_BATCH: usize = 1000;
pub const MAX_PARAMS_TAGS_PER_BATCH: usize = 100;
pub const MAX_PARAM_VALUE_LENGTH: usize = 6000;
pub const MAX_TAG_VALUE_LENGTH: usize = 8000;
pub const MAX_KEY_LENGTH: usize = 250;

/// One value of a metric. MLflow keys a stored metric by (key, step, timestamp, value),
/// so sending the same point twice stores it once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricPoint {
    pub key: String,
    #[serde(with = "json_f64")]
    pub value: f64,
    /// Unix time in milliseconds.
    pub timestamp: i64,
    pub step: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyValue {
    pub key: String,
    pub value: String,
}

impl KeyValue {
    pub fn new(key: impl Into<String>, value: impl Into<String>) -> KeyValue {
        KeyValue { key: key.into(), value: value.into() }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RunStatus {
    Running,
    Finished,
    Failed,
    Killed,
}

impl RunStatus {
    /// How a ptrain run that ended with `exit_code` ends in MLflow: 0 is FINISHED,
    /// 130/143 (SIGINT/SIGTERM) KILLED, anything else FAILED.
    pub fn from_exit_code(exit_code: i32) -> RunStatus {
        match exit_code {
            0 => RunStatus::Finished,
            130 | 143 => RunStatus::Killed,
            _ => RunStatus::Failed,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "RUNNING",
            RunStatus::Finished => "FINISHED",
            RunStatus::Failed => "FAILED",
            RunStatus::Killed => "KILLED",
        }
    }
}

/// One line of `pending.jsonl`, e.g. `{"metrics":[{"key":"train/loss","value":2.3,"timestamp":1700000000123,"step":10}]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Item {
    /// At most [`MAX_METRICS_PER_BATCH`] points.
    Metrics(Vec<MetricPoint>),
    /// At most [`MAX_PARAMS_TAGS_PER_BATCH`] params, values already cut to the limit.
    Params(Vec<KeyValue>),
    Tags(Vec<KeyValue>),
    Status {
        status: RunStatus,
        /// Unix milliseconds; none while the run is running.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        end_time: Option<i64>,
    },
    /// A file of the run directory (`path` is relative to it) to upload as an artifact
    /// under its file name.
    Artifact {
        path: String,
    },
}

impl Item {
    /// How many metrics, params or tags it holds (1 for the others): the server's unit.
    pub fn entries(&self) -> usize {
        match self {
            Item::Metrics(m) => m.len(),
            Item::Params(p) | Item::Tags(p) => p.len(),
            Item::Status { .. } | Item::Artifact { .. } => 1,
        }
    }

    /// `items` of one kind in chunks the server accepts in one call.
    pub fn chunked_metrics(points: Vec<MetricPoint>) -> Vec<Item> {
        chunks(points, MAX_METRICS_PER_BATCH).into_iter().map(Item::Metrics).collect()
    }

    pub fn chunked_params(params: Vec<KeyValue>) -> Vec<Item> {
        chunks(params, MAX_PARAMS_TAGS_PER_BATCH).into_iter().map(Item::Params).collect()
    }

    pub fn chunked_tags(tags: Vec<KeyValue>) -> Vec<Item> {
        chunks(tags, MAX_PARAMS_TAGS_PER_BATCH).into_iter().map(Item::Tags).collect()
    }
}

fn chunks<T>(mut all: Vec<T>, size: usize) -> Vec<Vec<T>> {
    let mut out = Vec::new();
    while all.len() > size {
        let rest = all.split_off(size);
        out.push(std::mem::replace(&mut all, rest));
    }
    if !all.is_empty() {
        out.push(all);
    }
    out
}

/// How many leading `items` go to the server in one call: consecutive metrics items
/// share a `log-batch` up to the server's limit; anything else goes alone.
pub fn request_len<'a>(items: impl IntoIterator<Item = &'a Item>) -> usize {
    let mut n = 0;
    let mut metrics = 0;
    for item in items {
        match item {
            Item::Metrics(points) if n == 0 || metrics > 0 => {
                if n > 0 && metrics + points.len() > MAX_METRICS_PER_BATCH {
                    break;
                }
                metrics += points.len();
                n += 1;
            }
            _ if n == 0 => return 1,
            _ => break,
        }
    }
    n
}

/// A metric or param name MLflow accepts: only alphanumerics, `_ - . : / space`, no
/// empty, `.` or `..` path segments, at most 250 characters. Anything else becomes `_`.
pub fn sanitize_key(name: &str) -> String {
    let cleaned: String = name.chars().map(|c| if c.is_alphanumeric() || "_-.: /".contains(c) { c } else { '_' }).collect();
    let segments: Vec<&str> = cleaned.split('/').filter(|s| !s.is_empty()).map(|s| if s == "." || s == ".." { "_" } else { s }).collect();
    let key = if segments.is_empty() { "_".to_string() } else { segments.join("/") };
    cut(&key, MAX_KEY_LENGTH).to_string()
}

/// `s` cut to at most `max` characters (on a character boundary).
pub fn cut(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((at, _)) => &s[..at],
        None => s,
    }
}

/// The run's resolved configuration as MLflow params: one per leaf key, named by its
/// dotted path (`optim.lr`), valued as the TOML writes it (strings without quotes).
/// Values longer than the server allows are cut; the second value lists their keys.
pub fn params_from_toml(config_toml: &str) -> Result<(Vec<KeyValue>, Vec<String>), String> {
    let table: toml::Table = toml::from_str(config_toml).map_err(|e| format!("cannot read the run's configuration: {e}"))?;
    let mut params = Vec::new();
    flatten("", &table, &mut params);
    let mut cut_keys = Vec::new();
    for p in &mut params {
        p.key = sanitize_key(&p.key);
        if p.value.chars().count() > MAX_PARAM_VALUE_LENGTH {
            p.value = cut(&p.value, MAX_PARAM_VALUE_LENGTH).to_string();
            cut_keys.push(p.key.clone());
        }
    }
    Ok((params, cut_keys))
}

fn flatten(prefix: &str, table: &toml::Table, out: &mut Vec<KeyValue>) {
    for (key, value) in table {
        let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
        match value {
            toml::Value::Table(inner) => flatten(&path, inner, out),
            toml::Value::String(s) => out.push(KeyValue::new(path, s.clone())),
            other => out.push(KeyValue::new(path, other.to_string())),
        }
    }
}

/// JSON has no NaN or infinities; MLflow's REST API (protobuf JSON) takes and gives
/// them as the strings `"NaN"`, `"Infinity"` and `"-Infinity"`.
pub mod json_f64 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        if v.is_nan() {
            s.serialize_str("NaN")
        } else if v.is_infinite() {
            s.serialize_str(if *v > 0.0 { "Infinity" } else { "-Infinity" })
        } else {
            s.serialize_f64(*v)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Number(f64),
            Text(String),
        }
        match Repr::deserialize(d)? {
            Repr::Number(v) => Ok(v),
            Repr::Text(t) => match t.as_str() {
                "NaN" => Ok(f64::NAN),
                "Infinity" => Ok(f64::INFINITY),
                "-Infinity" => Ok(f64::NEG_INFINITY),
                other => other.parse().map_err(serde::de::Error::custom),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(key: &str, value: f64, step: u64) -> MetricPoint {
        MetricPoint { key: key.into(), value, timestamp: 1_700_000_000_000 + step as i64, step }
    }

    #[test]
    fn exit_codes_map_to_run_statuses() {
        assert_eq!(RunStatus::from_exit_code(0), RunStatus::Finished);
        assert_eq!(RunStatus::from_exit_code(130), RunStatus::Killed);
        assert_eq!(RunStatus::from_exit_code(143), RunStatus::Killed);
        assert_eq!(RunStatus::from_exit_code(1), RunStatus::Failed);
        assert_eq!(RunStatus::from_exit_code(2), RunStatus::Failed);
    }

    #[test]
    fn items_round_trip_through_a_line_with_non_finite_values() {
        let items = vec![
            Item::Metrics(vec![point("train/loss", f64::NAN, 1), point("a", f64::INFINITY, 1), point("b", f64::NEG_INFINITY, 1), point("c", 0.1, 2)]),
            Item::Params(vec![KeyValue::new("optim.lr", "0.001")]),
            Item::Status { status: RunStatus::Killed, end_time: Some(5) },
            Item::Status { status: RunStatus::Running, end_time: None },
            Item::Artifact { path: "config.toml".into() },
        ];
        for item in items {
            let line = serde_json::to_string(&item).unwrap();
            assert!(!line.contains('\n'));
            let back: Item = serde_json::from_str(&line).unwrap();
            match (&item, &back) {
                (Item::Metrics(a), Item::Metrics(b)) => {
                    for (x, y) in a.iter().zip(b) {
                        assert!(x.value == y.value || (x.value.is_nan() && y.value.is_nan()), "{line}");
                        assert_eq!((&x.key, x.step, x.timestamp), (&y.key, y.step, y.timestamp));
                    }
                }
                _ => assert_eq!(item, back),
            }
        }
        let line = serde_json::to_string(&Item::Metrics(vec![point("x", f64::NAN, 3)])).unwrap();
        assert_eq!(line, r#"{"metrics":[{"key":"x","value":"NaN","timestamp":1700000000003,"step":3}]}"#);
        assert_eq!(
            serde_json::to_string(&Item::Status { status: RunStatus::Finished, end_time: Some(7) }).unwrap(),
            r#"{"status":{"status":"FINISHED","end_time":7}}"#
        );
    }

    #[test]
    fn requests_respect_the_server_limits() {
        let metrics = |n: usize| Item::Metrics((0..n).map(|i| point("m", 1.0, i as u64)).collect());
        let queue = [metrics(400), metrics(500), metrics(200), Item::Artifact { path: "x".into() }];
        assert_eq!(request_len(&queue), 2, "400 + 500 fit, 200 more do not");
        assert_eq!(request_len(&queue[2..]), 1);
        assert_eq!(request_len(&queue[3..]), 1);
        assert_eq!(request_len(&[Item::Params(vec![]), metrics(1)]), 1);
        assert_eq!(request_len(&[metrics(1), Item::Tags(vec![])]), 1);
        assert_eq!(request_len(&[] as &[Item]), 0);
        let chunked = Item::chunked_metrics((0..2500).map(|i| point("m", 1.0, i)).collect());
        assert_eq!(chunked.iter().map(Item::entries).collect::<Vec<_>>(), vec![1000, 1000, 500]);
        let params = Item::chunked_params((0..250).map(|i| KeyValue::new(format!("k{i}"), "v")).collect());
        assert_eq!(params.iter().map(Item::entries).collect::<Vec<_>>(), vec![100, 100, 50]);
    }

    #[test]
    fn keys_are_made_acceptable_to_the_server() {
        assert_eq!(sanitize_key("train/loss"), "train/loss");
        assert_eq!(sanitize_key("dataset/wiki (en)/loss"), "dataset/wiki _en_/loss");
        assert_eq!(sanitize_key("a//b/"), "a/b");
        assert_eq!(sanitize_key("/../x/./y"), "_/x/_/y");
        assert_eq!(sanitize_key("perf/µs"), "perf/µs");
        assert_eq!(sanitize_key("a,b\"c"), "a_b_c");
        assert_eq!(sanitize_key(""), "_");
        assert_eq!(sanitize_key(&"k".repeat(300)).len(), MAX_KEY_LENGTH);
    }

    #[test]
    fn the_configuration_becomes_dotted_params_cut_at_the_limit() {
        let long = "x".repeat(MAX_PARAM_VALUE_LENGTH + 10);
        let toml = format!("[optim]\nlr = 0.0006\nbetas = [0.9, 0.95]\nname = \"adamw\"\n[plugins.mlflow]\nflag = true\nnote = \"{long}\"\n");
        let (params, cut_keys) = params_from_toml(&toml).unwrap();
        let get = |k: &str| params.iter().find(|p| p.key == k).map(|p| p.value.clone());
        assert_eq!(get("optim.lr").as_deref(), Some("0.0006"));
        assert_eq!(get("optim.betas").as_deref(), Some("[0.9, 0.95]"));
        assert_eq!(get("optim.name").as_deref(), Some("adamw"));
        assert_eq!(get("plugins.mlflow.flag").as_deref(), Some("true"));
        assert_eq!(get("plugins.mlflow.note").unwrap().len(), MAX_PARAM_VALUE_LENGTH);
        assert_eq!(cut_keys, vec!["plugins.mlflow.note"]);
        assert!(params_from_toml("not [toml").is_err());
    }
}
