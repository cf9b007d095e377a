//! Metrics batches as W&B history rows (`_step`, `_timestamp`, `_runtime` plus
//! every metric, each value JSON-encoded), and the running summary of latest values.

use std::collections::BTreeMap;

use ptrain_plugin_api::{Histogram, MetricBatch, MetricValue};

/// A number as the W&B SDK encodes it: JSON, except that NaN and infinities are
/// written as `NaN`, `Infinity` and `-Infinity`, which W&B accepts.
pub fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else {
        serde_json::Number::from_f64(v).map(|n| n.to_string()).unwrap_or_else(|| "NaN".into())
    }
}

/// W&B's histogram type: `bins` are the `len(values) + 1` bucket edges.
fn histogram(h: &Histogram) -> String {
    let bins: Vec<String> = std::iter::once(h.min).chain(h.bucket_limits.iter().copied()).map(number).collect();
    let values: Vec<String> = h.bucket_counts.iter().map(|&c| number(c)).collect();
    format!("{{\"_type\":\"histogram\",\"values\":[{}],\"bins\":[{}]}}", values.join(","), bins.join(","))
}

/// One history row: `(key, value_json)` pairs, the metrics first.
pub struct Row {
    pub step: u64,
    pub items: Vec<(String, String)>,
}

impl Row {
    /// `runtime` is seconds since the W&B run started.
    pub fn from_batch(batch: &MetricBatch, runtime: f64) -> Row {
        let mut items: Vec<(String, String)> = Vec::with_capacity(batch.metrics.len() + 3);
        for m in batch.metrics.iter() {
            let value = match &m.value {
                MetricValue::Scalar(v) => number(*v),
                MetricValue::Histogram(h) if h.num > 0.0 && !h.bucket_counts.is_empty() => histogram(h),
                MetricValue::Histogram(_) => continue,
                MetricValue::Text(t) => serde_json::Value::String(t.to_string()).to_string(),
            };
            items.push((m.name.to_string(), value));
        }
        items.push(("_step".into(), batch.step.to_string()));
        items.push(("_timestamp".into(), number(batch.wall_time)));
        items.push(("_runtime".into(), number(runtime)));
        Row { step: batch.step, items }
    }

    /// The row as one line of `wandb-history.jsonl`, for the online file stream.
    pub fn json_line(&self) -> String {
        json_object(self.items.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }
}

fn json_object<'a>(items: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let mut line = String::from("{");
    for (i, (k, v)) in items.enumerate() {
        if i > 0 {
            line.push(',');
        }
        line.push_str(&serde_json::Value::String(k.to_string()).to_string());
        line.push(':');
        line.push_str(v);
    }
    line.push('}');
    line
}

/// The latest value of every key, which is what W&B shows as the run summary.
#[derive(Default)]
pub struct Latest {
    values: BTreeMap<String, String>,
}

impl Latest {
    pub fn update(&mut self, row: &Row) {
        for (k, v) in &row.items {
            self.values.insert(k.clone(), v.clone());
        }
    }

    /// The summary items, with W&B's own `_wandb.runtime` (whole seconds).
    pub fn items(&self, runtime: f64) -> Vec<(String, String)> {
        let mut items: Vec<(String, String)> = self.values.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        items.push(("_wandb".into(), format!("{{\"runtime\":{}}}", runtime.max(0.0) as i64)));
        items
    }

    pub fn json(&self, runtime: f64) -> String {
        let items = self.items(runtime);
        json_object(items.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }
}

#[cfg(test)]
mod tests {
    use ptrain_plugin_api::Metric;

    use super::*;

    fn batch(metrics: Vec<Metric>) -> MetricBatch {
        MetricBatch { step: 30, wall_time: 1_700_000_000.5, elapsed_s: 3.0, metrics: metrics.into() }
    }

    #[test]
    fn a_row_has_the_metrics_and_step_timestamp_runtime() {
        let row = Row::from_batch(&batch(vec![Metric::scalar("train/loss", 0.5), Metric::text("note", "a \"q\"")]), 12.25);
        let line: serde_json::Value = serde_json::from_str(&row.json_line()).unwrap();
        assert_eq!(line, serde_json::json!({"train/loss": 0.5, "note": "a \"q\"", "_step": 30, "_timestamp": 1_700_000_000.5, "_runtime": 12.25}));
        assert_eq!(row.step, 30);
    }

    #[test]
    fn non_finite_values_use_the_sdk_spelling() {
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(f64::INFINITY), "Infinity");
        assert_eq!(number(f64::NEG_INFINITY), "-Infinity");
        assert_eq!(number(0.1).parse::<f64>().unwrap(), 0.1);
    }

    #[test]
    fn histograms_have_one_more_bin_edge_than_values() {
        let h = Histogram::from_values(&[0.0, 1.0, 1.0, 3.0], 3);
        let row = Row::from_batch(&batch(vec![Metric::histogram("params/w", h), Metric::histogram("grads/none", Histogram::default())]), 1.0);
        let line: serde_json::Value = serde_json::from_str(&row.json_line()).unwrap();
        let w = &line["params/w"];
        assert_eq!(w["_type"], "histogram");
        assert_eq!(w["values"], serde_json::json!([1.0, 2.0, 1.0]));
        assert_eq!(w["bins"], serde_json::json!([0.0, 1.0, 2.0, 3.0]));
        assert!(line.get("grads/none").is_none(), "empty histograms are skipped");
    }

    #[test]
    fn the_summary_keeps_the_latest_value_of_each_key() {
        let mut latest = Latest::default();
        latest.update(&Row::from_batch(&batch(vec![Metric::scalar("a", 1.0), Metric::scalar("b", 2.0)]), 1.0));
        let mut second = batch(vec![Metric::scalar("a", 3.0)]);
        second.step = 40;
        latest.update(&Row::from_batch(&second, 2.0));
        let summary: serde_json::Value = serde_json::from_str(&latest.json(7.9)).unwrap();
        assert_eq!(summary["a"], 3.0);
        assert_eq!(summary["b"], 2.0);
        assert_eq!(summary["_step"], 40);
        assert_eq!(summary["_wandb"], serde_json::json!({"runtime": 7}));
    }
}
