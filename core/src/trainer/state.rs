//! The training state a checkpoint keeps besides tensors (`state.json`), and
//! resuming from a checkpoint: finding it, restoring weights, optimizer state and
//! counters.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::Tensor;

use super::{payload, Resume};
use crate::{
    checkpoint::{self as ckpt, Checkpoint},
    config::ShardMode,
    error::{ConfigError, Error, Result},
    optim::{CheckpointState, Optimizer},
};

/// `state.json`: written and read by name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// The last optimizer step the checkpoint includes.
    pub step: u64,
    /// Over every rank, since the start of training.
    pub samples_seen: u64,
    pub tokens_seen: u64,
    pub seed: u64,
    pub world_size: u32,
    pub data: DataPosition,
    pub rng: RngScheme,
    /// Non-finite losses in all, and in a row at the end.
    pub nonfinite_total: u64,
    pub nonfinite_run: u64,
    /// The last evaluation, if any.
    pub eval: Option<EvalRecord>,
    pub ptrain_version: String,
    /// How a sharded run cut its optimizer state (absent when unsharded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<ckpt::ShardLayout>,
    /// LoRA: the digest of the frozen base weights the adapters were trained on
    /// (`model::lora::BaseDigest`). Earlier checkpoints recorded `lora_base_sha256`,
    /// one hash over the whole base, which is read (`model::adapters::same_base`), not written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora_base_digest: Option<String>,
}

/// Where the data stream resumes: batches are keyed by (seed, step, micro-batch,
/// sample), so the next step is the whole position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DataPosition {
    pub next_step: u64,
    pub scheme: String,
}

/// How random numbers are drawn: torch's generator is reseeded from (seed, step)
/// each step when the model uses randomness, so there is no generator state to keep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RngScheme {
    pub scheme: String,
    pub seed: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalRecord {
    pub step: u64,
    pub loss: f64,
}

impl TrainState {
    pub fn new(step: u64, seed: u64, world_size: u32) -> TrainState {
        TrainState {
            step,
            samples_seen: 0,
            tokens_seen: 0,
            seed,
            world_size,
            data: DataPosition { next_step: step + 1, scheme: "keyed by (seed, step, micro-batch, sample)".into() },
            rng: RngScheme { scheme: "torch generator reseeded from (seed, step) each step when the model uses randomness".into(), seed },
            nonfinite_total: 0,
            nonfinite_run: 0,
            eval: None,
            ptrain_version: env!("CARGO_PKG_VERSION").into(),
            shard: None,
            lora_base_digest: None,
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("the training state serializes")
    }
}

/// The checkpoint to resume from, if any: `Resume::Path` names a checkpoint, or a
/// run or checkpoints directory (its newest valid checkpoint); `Resume::Auto`
/// takes the newest valid checkpoint where the run writes them (`checkpoints`:
/// `<run-dir>/checkpoints`, or `plugins.checkpoint.dir`) and starts fresh without one.
pub fn locate(resume: Option<&Resume>, checkpoints: &Path, run_dir_given: bool) -> Result<Option<PathBuf>> {
    let path = match resume {
        None => return Ok(None),
        Some(Resume::Auto) if !run_dir_given => {
            return Err(ConfigError {
                origin: "--auto-resume".into(),
                key: "run.run_dir".into(),
                message: "auto-resume looks in the run directory: pass --run-dir".into(),
            }
            .into())
        }
        Some(Resume::Auto) => checkpoints,
        Some(Resume::Path(p)) if !p.exists() => return Err(Error::MissingFile { what: "checkpoint", path: p.clone() }),
        Some(Resume::Path(p)) => p,
    };
    let (found, warnings) = ckpt::resolve(path);
    for w in warnings {
        tracing::warn!("{w}");
    }
    match (found, resume) {
        (Some(found), _) => Ok(Some(found)),
        (None, Some(Resume::Auto)) => {
            tracing::info!("auto-resume: no checkpoint in {}, starting fresh", checkpoints.display());
            Ok(None)
        }
        (None, _) => Err(Error::Checkpoint { path: path.to_owned(), message: "no valid checkpoint here".into() }),
    }
}

/// Reads and validates a checkpoint; for a run that shards its parameters, without
/// its weights and optimizer state (each rank reads its slices of them when restoring).
pub fn read(path: &Path, shards_params: bool) -> Result<Checkpoint> {
    let read = if shards_params { ckpt::read_without_tensors } else { ckpt::read };
    read(path).map_err(|e| Error::Checkpoint { path: path.to_owned(), message: e.to_string() })
}

/// Copies the checkpoint's weights and optimizer state into the live ones and
/// returns its training state. Optimizer state is re-cut when the checkpoint was
/// sharded differently (another world size, or sharded vs not).
///
/// Every way a checkpoint does not fit the run (a missing tensor, a wrong shape or
/// dtype, optimizer state of another optimizer) is [`Error::Checkpoint`]: one kind
/// of mistake, one exit code (2, refused before training).
pub fn restore(checkpoint: &Checkpoint, params: &mut [(String, Tensor)], optimizer: &mut dyn Optimizer) -> Result<TrainState> {
    let bad = |message: String| Error::Checkpoint { path: checkpoint.path.clone(), message };
    let unusable = |e: Error| match e {
        Error::Checkpoint { .. } => e,
        other => bad(other.to_string()),
    };
    if optimizer.shard_mode() == ShardMode::Parameters {
        // No rank holds whole weights: each reads its chunks from the parts.
        optimizer.restore_chunks(checkpoint).map_err(unusable)?;
    } else {
        // A parameter-sharded checkpoint's parts hold the weights: a run that holds
        // them whole re-assembles them.
        let whole = checkpoint.consolidated().map_err(|e| bad(e.to_string()))?;
        for (name, live) in params.iter_mut() {
            let saved = whole.model.get(name).ok_or_else(|| bad(format!("no weights for `{name}`")))?;
            payload::restore(name, live, saved).map_err(unusable)?;
        }
        let sizes = optimizer.param_sizes().to_vec();
        optimizer.load_state(&CheckpointState::new(&whole, &sizes)).map_err(unusable)?;
    }
    serde_json::from_value(checkpoint.state.clone()).map_err(|e| bad(format!("{}: {e}", ckpt::STATE_FILE)))
}

/// A resumed run trains on with the checkpoint's global batch (`data.batch_size x
/// optim.accum_steps x ranks`): another one changes what a step is (its samples,
/// its gradient's noise, where the data stream stands), so it is refused naming
/// both unless `allow` (`--allow-batch-change`).
pub fn check_global_batch(checkpoint: &Checkpoint, config: &crate::config::Config, world: u32, allow: bool) -> Result<()> {
    let saved: toml::Table = checkpoint.config_toml.parse().unwrap_or_default();
    let key = |table: &str, key: &str| saved.get(table).and_then(|t| t.get(key)).and_then(toml::Value::as_integer).map(|v| v as u64);
    let ranks = checkpoint.state.get("world_size").and_then(serde_json::Value::as_u64);
    let (Some(b), Some(ranks)) = (key("data", "batch_size"), ranks) else { return Ok(()) };
    let accum = key("optim", "accum_steps").unwrap_or(1);
    let (now_b, now_accum) = (config.data.batch_size as u64, config.optim.accum_steps);
    let (was, now) = (b * accum * ranks, now_b * now_accum * world as u64);
    if was == now {
        return Ok(());
    }
    let shape = |b: u64, a: u64, r: u64| format!("data.batch_size {b} x optim.accum_steps {a} x {r} rank(s)");
    let message = format!("its global batch is {was} ({}), this run's {now} ({})", shape(b, accum, ranks), shape(now_b, now_accum, world as u64));
    if allow {
        tracing::warn!("resuming {} with another global batch (--allow-batch-change): {message}", checkpoint.path.display());
        return Ok(());
    }
    Err(Error::Checkpoint {
        path: checkpoint.path.clone(),
        message: format!(
            "{message}. Resume with the same ranks and batch (`ptrain launch --nproc {ranks} run ... --auto-resume` for {ranks} ranks), \
             or pass --allow-batch-change to train on with the new one"
        ),
    })
}

/// `[model]` keys that may change on resume: where the weights first came from
/// (the checkpoint has them all now), dropout, a TorchScript file's path.
const MAY_CHANGE: &[&str] = &["model.init_from", "model.init_adapters", "model.dropout", "model.torchscript.path"];

/// Compares the `[model]` the checkpoint was trained with against this run's,
/// before any weight is touched: a resumed run with another model size is refused
/// naming the first key that differs (`model.n_layer: checkpoint 4, configuration 2`).
pub fn check_model(checkpoint: &Checkpoint, config: &crate::config::Config) -> Result<()> {
    let bad = |message: String| Error::Checkpoint { path: checkpoint.path.clone(), message };
    let saved: toml::Table = checkpoint.config_toml.parse().map_err(|e| bad(format!("{}: {e}", ckpt::CONFIG_FILE)))?;
    let Some(mut saved) = saved.get("model").and_then(toml::Value::as_table).cloned() else { return Ok(()) };
    // A checkpoint from before the kinds' tables has their keys flat in [model].
    crate::config::move_flat_keys(&mut saved).map_err(|(key, message)| bad(format!("{key} {message}")))?;
    let live = toml::Table::try_from(&config.model).expect("[model] serializes");
    // Another kind first: its sizes differ too, and `block_size` alone would not say why.
    let kind = |t: &toml::Table| t.get("kind").cloned();
    let first = match (kind(&saved), kind(&live)) {
        (Some(was), Some(now)) if was != now => Some(("model.kind".to_string(), was, now)),
        _ => first_difference(&saved, &live, "model"),
    };
    match first {
        None => Ok(()),
        Some((key, was, now)) => Err(bad(format!(
            "{key}: checkpoint {was}, configuration {now}. The checkpoint is of another model: resume with the configuration it was \
             trained with (its {}), or start a new --run-dir",
            ckpt::CONFIG_FILE
        ))),
    }
}

/// The first key (dotted, under `prefix`) whose value differs; keys only one side
/// has (another version's) are skipped.
fn first_difference(saved: &toml::Table, live: &toml::Table, prefix: &str) -> Option<(String, toml::Value, toml::Value)> {
    for (key, was) in saved {
        let Some(now) = live.get(key) else { continue };
        let path = format!("{prefix}.{key}");
        if MAY_CHANGE.contains(&path.as_str()) {
            continue;
        }
        match (was, now) {
            (toml::Value::Table(a), toml::Value::Table(b)) => {
                if let Some(found) = first_difference(a, b, &path) {
                    return Some(found);
                }
            }
            (a, b) if a != b => return Some((path, a.clone(), b.clone())),
            _ => {}
        }
    }
    None
}
