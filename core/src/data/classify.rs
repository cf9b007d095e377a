//! Classification data: feature rows with labels, from one or several named
//! datasets mixed by weight (JSONL files, or generated clusters).

use std::{collections::BTreeMap, path::Path};

use serde::Deserialize;
use tch::Tensor;

use super::{spread, Batch, BatchKey, Dataset, Split};
use crate::{
    config::Config,
    error::{Error, Result},
    rng::Rng,
};

/// One JSONL row. `dataset` may be omitted when the file belongs to one
/// `[[data.datasets]]` entry.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClassRow {
    #[serde(default)]
    pub dataset: Option<String>,
    pub features: Vec<f32>,
    pub label: i64,
}

#[derive(Default)]
struct Rows {
    features: Vec<f32>,
    labels: Vec<i64>,
}

impl Rows {
    fn len(&self) -> usize {
        self.labels.len()
    }
}

struct Named {
    name: String,
    train: Rows,
    val: Rows,
}

pub struct Classification {
    seed: u64,
    features: usize,
    classes: i64,
    datasets: Vec<Named>,
    /// Cumulative mixing weights over `datasets`.
    cumulative: Vec<f64>,
}

impl Classification {
    /// Gaussian clusters, one generator per named dataset, each noisier than the
    /// last so that per-dataset metrics differ.
    pub fn synthetic(config: &Config) -> Classification {
        let data = &config.data;
        let (f, c) = (data.synthetic_features.max(1) as usize, data.synthetic_classes.max(2));
        let specs: Vec<(String, f64)> = if data.datasets.is_empty() {
            vec![("synthetic".to_string(), 1.0)]
        } else {
            data.datasets.iter().map(|d| (d.name.clone(), d.weight)).collect()
        };
        let rows = (data.synthetic_len / 16).clamp(256, 16_384);
        let datasets = specs
            .iter()
            .enumerate()
            .map(|(d, (name, _))| {
                let mut rng = Rng::keyed(config.run.seed, &[0xC1A55, d as u64]);
                let centers: Vec<f32> = (0..c as usize * f).map(|_| rng.normal() as f32).collect();
                // Noise grows with the dataset index, so their accuracies differ.
                let noise = (0.25 + 0.25 * d as f32) * (f as f32).sqrt();
                let mut all = Rows::default();
                for _ in 0..rows {
                    let label = rng.below(c as u64) as i64;
                    let center = &centers[label as usize * f..][..f];
                    all.features.extend(center.iter().map(|&m| m + noise * rng.normal() as f32));
                    all.labels.push(label);
                }
                let (train, val) = hold_out(all, f, data.val_fraction);
                Named { name: name.clone(), train, val }
            })
            .collect();
        Self::mix(config.run.seed, f, c, datasets, specs.iter().map(|s| s.1).collect())
    }

    pub fn jsonl(config: &Config) -> Result<Classification> {
        let data = &config.data;
        let mut by_name: BTreeMap<String, Rows> = BTreeMap::new();
        let mut width = None;
        let mut read = |path: &str, default_name: Option<&str>, into: &mut BTreeMap<String, Rows>| -> Result<()> {
            read_jsonl(Path::new(path), default_name, &mut width, into)
        };
        if !data.path.is_empty() {
            read(&data.path, None, &mut by_name)?;
        }
        for spec in data.datasets.iter().filter(|d| !d.path.is_empty()) {
            read(&spec.path, Some(&spec.name), &mut by_name)?;
        }
        let mut val_by_name: BTreeMap<String, Rows> = BTreeMap::new();
        if !data.val_path.is_empty() {
            read(&data.val_path, None, &mut val_by_name)?;
        }
        let f = width.ok_or_else(|| Error::Data { path: data.path.clone().into(), message: "no rows".into() })?;
        let classes = by_name.values().chain(val_by_name.values()).flat_map(|r| r.labels.iter()).max().map_or(0, |m| m + 1);
        let mut weights = Vec::new();
        let mut datasets = Vec::new();
        for (name, rows) in by_name {
            let weight = data.datasets.iter().find(|d| d.name == name).map_or(rows.len() as f64, |d| d.weight);
            let (train, val) = match val_by_name.remove(&name) {
                Some(val) => (rows, val),
                None => hold_out(rows, f, data.val_fraction),
            };
            if train.len() == 0 || (val.len() == 0 && data.val_fraction > 0.0) {
                return Err(Error::Data { path: data.path.clone().into(), message: format!("dataset `{name}` has too few rows to hold some out") });
            }
            weights.push(weight);
            datasets.push(Named { name, train, val });
        }
        Ok(Self::mix(config.run.seed, f, classes.max(config.model.mlp.num_classes), datasets, weights))
    }

    fn mix(seed: u64, features: usize, classes: i64, datasets: Vec<Named>, weights: Vec<f64>) -> Classification {
        let cumulative = weights
            .iter()
            .scan(0.0, |acc, w| {
                *acc += w.max(0.0);
                Some(*acc)
            })
            .collect();
        Classification { seed, features, classes, datasets, cumulative }
    }
}

impl Classification {
    /// Held-out rows of every dataset.
    fn held_out_rows(&self) -> u64 {
        self.datasets.iter().map(|d| d.val.len() as u64).sum()
    }
}

fn hold_out(all: Rows, f: usize, fraction: f64) -> (Rows, Rows) {
    if fraction <= 0.0 {
        return (all, Rows::default());
    }
    let n = all.len();
    let cut = n - ((n as f64 * fraction).ceil() as usize).clamp(1, n.saturating_sub(1).max(1));
    let val = Rows { features: all.features[cut * f..].to_vec(), labels: all.labels[cut..].to_vec() };
    let train = Rows { features: all.features[..cut * f].to_vec(), labels: all.labels[..cut].to_vec() };
    (train, val)
}

fn read_jsonl(path: &Path, default_name: Option<&str>, width: &mut Option<usize>, into: &mut BTreeMap<String, Rows>) -> Result<()> {
    if !path.exists() {
        return Err(Error::MissingFile { what: "data file", path: path.to_owned() });
    }
    let bad = |line: u64, message: String| Error::Data { path: path.to_owned(), message: format!("line {line}: {message}") };
    for line in super::reader::lines(path)? {
        let (n, line) = line?;
        if line.trim().is_empty() {
            continue;
        }
        let row: ClassRow = serde_json::from_str(&line).map_err(|e| bad(n, e.to_string()))?;
        let name = row.dataset.as_deref().or(default_name).ok_or_else(|| bad(n, "no `dataset` field".into()))?;
        if row.label < 0 {
            return Err(bad(n, "negative label".into()));
        }
        match *width {
            None => *width = Some(row.features.len()),
            Some(w) if w != row.features.len() => return Err(bad(n, format!("{} features, earlier rows have {w}", row.features.len()))),
            _ => {}
        }
        let rows = into.entry(name.to_string()).or_default();
        rows.features.extend_from_slice(&row.features);
        rows.labels.push(row.label);
    }
    Ok(())
}

impl Dataset for Classification {
    fn batch(&self, split: Split, key: BatchKey) -> Result<Batch> {
        let (b, f) = (key.count as usize, self.features);
        let mut features = Vec::with_capacity(b * f);
        let mut labels = Vec::with_capacity(b);
        let mut ids = Vec::with_capacity(b);
        let held_out = self.held_out_rows();
        if split == Split::Val && held_out == 0 {
            return Err(Error::Other("nothing is held out (data.val_fraction = 0): no held-out batch".into()));
        }
        for i in 0..b as u64 {
            let (d, rows, r) = match split {
                Split::Train => {
                    let mut rng = Rng::keyed(self.seed, &[split as u64, key.step, key.micro, key.first_sample + i]);
                    let d = rng.weighted(&self.cumulative);
                    let rows = &self.datasets[d].train;
                    (d, rows, rng.below(rows.len() as u64) as usize)
                }
                // Every dataset's held-out rows, one after the other, each once a pass.
                Split::Val => {
                    let (mut d, mut r) = (0, spread(key.stream + i, held_out) as usize);
                    while r >= self.datasets[d].val.len() {
                        r -= self.datasets[d].val.len();
                        d += 1;
                    }
                    (d, &self.datasets[d].val, r)
                }
            };
            features.extend_from_slice(&rows.features[r * f..(r + 1) * f]);
            labels.push(rows.labels[r]);
            ids.push(d as i64);
        }
        Ok(Batch {
            inputs: Tensor::f_from_slice(&features)?.f_view([b as i64, f as i64])?,
            targets: Tensor::f_from_slice(&labels)?,
            dataset_ids: Some(Tensor::f_from_slice(&ids)?),
            segments: None,
            payload: super::Payload::None,
            samples: b as i64,
            tokens: b as i64,
        })
    }

    fn dataset_names(&self) -> Vec<String> {
        self.datasets.iter().map(|d| d.name.clone()).collect()
    }

    fn train_len(&self) -> u64 {
        self.datasets.iter().map(|d| d.train.len() as u64).sum()
    }

    fn val_len(&self) -> Option<u64> {
        Some(self.held_out_rows())
    }

    fn seq_len(&self) -> i64 {
        1
    }

    fn input_dim(&self) -> i64 {
        self.features as i64
    }

    fn num_classes(&self) -> i64 {
        self.classes
    }
}
