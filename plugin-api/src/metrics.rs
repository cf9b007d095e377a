//! The metrics bus: what plugins emit and what sinks receive.

use abi_stable::{
    std_types::{RStr, RString, RVec},
    StableAbi,
};

/// A borrowed scalar, as in [`crate::StepContext::scalars`].
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy)]
pub struct Scalar<'a> {
    pub name: RStr<'a>,
    pub value: f64,
}

/// Bucketed histogram, the shape TensorBoard stores.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Default)]
pub struct Histogram {
    pub min: f64,
    pub max: f64,
    pub num: f64,
    pub sum: f64,
    pub sum_squares: f64,
    /// Right edges of the buckets, increasing.
    pub bucket_limits: RVec<f64>,
    pub bucket_counts: RVec<f64>,
}

impl Histogram {
    /// A histogram of `values` in `buckets` equal-width buckets between their extrema.
    pub fn from_values(values: &[f64], buckets: usize) -> Histogram {
        if values.is_empty() {
            return Histogram::default();
        }
        let (mut min, mut max, mut sum, mut sum_squares) = (f64::INFINITY, f64::NEG_INFINITY, 0.0, 0.0);
        for &v in values {
            min = min.min(v);
            max = max.max(v);
            sum += v;
            sum_squares += v * v;
        }
        let buckets = buckets.max(1);
        let width = (max - min) / buckets as f64;
        let mut counts = vec![0.0; buckets];
        for &v in values {
            let i = if width > 0.0 { (((v - min) / width) as usize).min(buckets - 1) } else { 0 };
            counts[i] += 1.0;
        }
        Histogram {
            min,
            max,
            num: values.len() as f64,
            sum,
            sum_squares,
            bucket_limits: Histogram::equal_width_limits(min, max, buckets).collect(),
            bucket_counts: counts.into_iter().collect(),
        }
    }

    /// Right edges of `buckets` equal-width buckets from `min` to `max` (the last
    /// is `max` itself, free of rounding).
    pub fn equal_width_limits(min: f64, max: f64, buckets: usize) -> impl Iterator<Item = f64> {
        let width = (max - min) / buckets as f64;
        (1..=buckets).map(move |i| if i == buckets { max } else { min + width * i as f64 })
    }
}

#[repr(u8)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub enum MetricValue {
    Scalar(f64),
    Histogram(Histogram),
    Text(RString),
}

/// A named value. Names are `/`-separated: `train/loss`, `flops/step`, `dataset/wiki/loss`.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct Metric {
    pub name: RString,
    pub value: MetricValue,
}

impl Metric {
    pub fn scalar(name: impl Into<RString>, value: f64) -> Metric {
        Metric { name: name.into(), value: MetricValue::Scalar(value) }
    }

    pub fn histogram(name: impl Into<RString>, histogram: Histogram) -> Metric {
        Metric { name: name.into(), value: MetricValue::Histogram(histogram) }
    }

    pub fn text(name: impl Into<RString>, text: impl Into<RString>) -> Metric {
        Metric { name: name.into(), value: MetricValue::Text(text.into()) }
    }

    pub fn as_scalar(&self) -> Option<f64> {
        match self.value {
            MetricValue::Scalar(v) => Some(v),
            _ => None,
        }
    }
}

/// Everything emitted at one step, as delivered to sinks.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct MetricBatch {
    pub step: u64,
    /// Unix time when the batch was assembled, seconds.
    pub wall_time: f64,
    /// Seconds since the run started.
    pub elapsed_s: f64,
    pub metrics: RVec<Metric>,
}

impl MetricBatch {
    pub fn get(&self, name: &str) -> Option<&Metric> {
        self.metrics.iter().find(|m| m.name.as_str() == name)
    }

    pub fn scalar(&self, name: &str) -> Option<f64> {
        self.get(name).and_then(Metric::as_scalar)
    }

    pub fn scalars(&self) -> impl Iterator<Item = (&str, f64)> {
        self.metrics.iter().filter_map(|m| m.as_scalar().map(|v| (m.name.as_str(), v)))
    }
}

/// Where an inline plugin puts what it emits during a call. The host owns it and
/// reuses its buffer, so emitting allocates only the metric names.
#[repr(C)]
#[derive(StableAbi, Debug, Default)]
pub struct Outbox {
    metrics: RVec<Metric>,
}

impl Outbox {
    pub fn new() -> Outbox {
        Outbox { metrics: RVec::with_capacity(32) }
    }

    pub fn emit(&mut self, metric: Metric) {
        self.metrics.push(metric);
    }

    pub fn scalar(&mut self, name: impl Into<RString>, value: f64) {
        self.emit(Metric::scalar(name, value));
    }

    pub fn is_empty(&self) -> bool {
        self.metrics.is_empty()
    }

    pub fn len(&self) -> usize {
        self.metrics.len()
    }

    /// Moves everything emitted so far out, leaving the buffer empty.
    pub fn drain_into(&mut self, into: &mut Vec<Metric>) {
        into.extend(self.metrics.drain(..));
    }

    pub fn truncate(&mut self, len: usize) {
        self.metrics.truncate(len);
    }
}
