//! Batches: where they come from ([`Dataset`]) and how they are produced ahead of
//! the loop ([`Loader`]).
//!
//! A batch is identified by a [`BatchKey`]; each sample's randomness is keyed by
//! (seed, split, step, micro-batch, global sample index). So the data of a step does
//! not depend on the number of workers, and a rank's shard of a global batch is the
//! same samples a single process would draw: rank r of W takes samples
//! `[r*B, (r+1)*B)` of the `W*B` global batch.

pub mod chat_template;
mod classify;
pub mod instruct;
pub mod loader;
pub mod preference;
pub mod prompts;
pub mod reader;
pub mod rollouts;
pub mod text;
pub mod token_cache;
pub mod tokenize;
mod tokenizer_check;
mod tokens;

use std::sync::Arc;

use tch::{Device, Tensor};

pub use crate::model::Segments;
pub use classify::{ClassRow, Classification};
pub use loader::Loader;
pub use tokens::{synthetic_text, TokenWindows};

use crate::{
    config::{Config, DataKind},
    error::Result,
};

/// A target no loss is computed on: the objectives' ([`crate::objective::IGNORE_INDEX`]).
pub use crate::objective::IGNORE_INDEX;

/// Inputs and targets of one micro-batch.
#[derive(Debug)]
pub struct Batch {
    /// `[B, T]` int64 tokens or `[B, F]` float features.
    pub inputs: Tensor,
    /// `[B, T]` next tokens ([`IGNORE_INDEX`]: not trained) or `[B]` class ids.
    pub targets: Tensor,
    /// `[B]` int64 dataset index, for classification mixes; `[B, T]` per token for
    /// instruction data (a packed sequence holds rows of several sources).
    pub dataset_ids: Option<Tensor>,
    /// Packed sequences: where each row lies (`None`: one sequence per sample).
    pub segments: Option<Segments>,
    /// What the batch carries for its objective; the trainer moves it with the batch.
    pub payload: Payload,
    pub samples: i64,
    pub tokens: i64,
}

/// What a batch carries for its objective beyond inputs and targets: the data says
/// it, the objective reads it, and the trainer never looks inside (it moves it to
/// the device with the batch).
#[derive(Debug, Default)]
pub enum Payload {
    #[default]
    None,
    /// Instruction data: the targets that are not [`IGNORE_INDEX`], counted on the
    /// host, which [`crate::objective::CausalLmPerToken`] divides the step's loss by
    /// (all micro-batches, all ranks) before any forward.
    TrainedTokens(i64),
    /// Preference pairs: each pair's index `[B]` int64 among the dataset's pairs (the
    /// training ones, then the held-out ones), by which DPO finds the reference's
    /// log-probabilities it precomputed ([`crate::objective::Dpo`]).
    Pairs(Tensor),
    /// Scored rollouts: each completion's advantage and the batch's reward
    /// statistics, for [`crate::objective::Grpo`].
    Rollouts(rollouts::Rollouts),
    /// Prompts to sample (`data.kind = "prompts"`): the rollout stage
    /// ([`crate::rollout`]) turns the batch into scored rollouts before the step.
    Prompts(prompts::Prompts),
}

impl Payload {
    /// The trained targets of instruction data, if the batch counts them.
    pub fn trained_tokens(&self) -> Option<i64> {
        match self {
            Payload::TrainedTokens(n) => Some(*n),
            _ => None,
        }
    }

    fn map(self, f: impl Fn(Tensor) -> Tensor) -> Payload {
        match self {
            Payload::Pairs(ids) => Payload::Pairs(f(ids)),
            Payload::Rollouts(r) => Payload::Rollouts(rollouts::Rollouts {
                advantages: f(r.advantages),
                stats: f(r.stats),
                packed: r.packed.map(|p| rollouts::PackedRows { index: f(p.index), targets: f(p.targets) }),
                ..r
            }),
            other => other,
        }
    }
}

impl Batch {
    /// Page-locks the host tensors so the copy to the GPU can be asynchronous,
    /// through the shim: tch's `pin_memory(device)` passes a device, which libtorch
    /// deprecates with a warning per call. A tensor that cannot be pinned stays as
    /// it is (the copy is then synchronous).
    pub fn pinned(self) -> Batch {
        let pin = |t: Tensor| match ptrain_torch_ext::pin_memory(&t) {
            Ok(pinned) => pinned,
            Err(e) => {
                static WARNED: std::sync::Once = std::sync::Once::new();
                WARNED.call_once(|| tracing::warn!("could not page-lock a batch ({e}): host-to-GPU copies are synchronous"));
                t
            }
        };
        Batch {
            inputs: pin(self.inputs),
            targets: pin(self.targets),
            dataset_ids: self.dataset_ids.map(pin),
            segments: self.segments.map(|s| s.map(pin)),
            payload: self.payload.map(pin),
            ..self
        }
    }

    /// Moves the batch to `device` (a no-op on the CPU).
    pub fn to_device(self, device: Device, non_blocking: bool) -> Batch {
        if device == Device::Cpu {
            return self;
        }
        let move_ = |t: Tensor| t.to_device_(device, t.kind(), non_blocking, false);
        Batch {
            inputs: move_(self.inputs),
            targets: move_(self.targets),
            dataset_ids: self.dataset_ids.map(move_),
            segments: self.segments.map(|s| s.map(move_)),
            payload: self.payload.map(move_),
            ..self
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    Train = 0,
    Val = 1,
}

/// Which samples to draw: samples `[first_sample, first_sample + count)` of draw
/// (`step`, `micro`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchKey {
    pub step: u64,
    pub micro: u64,
    pub first_sample: u64,
    pub count: u64,
    /// The place of this batch's first sample in the run's stream of samples, all
    /// ranks together: `((step - 1) * accum_steps + micro) * ranks * batch_size +
    /// first_sample`. Data read in epochs (instruction data) draws by it, so a
    /// step holds the same samples however it is split into micro-batches and ranks.
    pub stream: u64,
}

/// What the model trains on.
pub trait Dataset: Send + Sync {
    /// The batch `key` names. An error (a file that became unreadable, a row that
    /// does not parse) ends the run as failed, with its summary written.
    fn batch(&self, split: Split, key: BatchKey) -> Result<Batch>;
    /// Names of the datasets in a mix; `dataset_ids` index into it.
    fn dataset_names(&self) -> Vec<String>;
    /// Distinct training samples, to count epochs.
    fn train_len(&self) -> u64;
    /// Held-out samples, read in a fixed order: `Split::Val` sample `key.stream + i`
    /// is held-out sample number `key.stream + i` (below this count), so an
    /// evaluation can cover the whole set once (`train.eval_batches = 0`) and never
    /// wraps. `Some(0)`: nothing is held out (`data.val_fraction = 0` and no
    /// `data.val_path`): no evaluation. `None` (the default, for datasets of your
    /// own): held-out batches are drawn as the key says, `train.eval_batches` of them.
    fn val_len(&self) -> Option<u64> {
        None
    }
    /// Sequence length of LM samples (1 for classification).
    fn seq_len(&self) -> i64;
    /// Feature width and class count of classification data (0 for LM data).
    fn input_dim(&self) -> i64 {
        0
    }
    fn num_classes(&self) -> i64 {
        0
    }
    /// Instruction data: the rows read, cut and left out.
    fn row_counts(&self) -> Option<instruct::RowCounts> {
        None
    }
    /// Preference pairs, for DPO's precomputed reference.
    fn preference(&self) -> Option<&preference::PreferenceData> {
        None
    }
}

/// Held-out sample `k` of `n` in a fixed order that spreads over the set (a
/// stride coprime with `n`, near its golden section): the first few samples of
/// an evaluation are not all from one end of the held-out text, and `k` in
/// `0..n` visits each sample once.
pub fn spread(k: u64, n: u64) -> u64 {
    if n <= 1 {
        return 0;
    }
    let gcd = |mut a: u64, mut b: u64| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    let mut stride = ((n as f64 * 0.618) as u64).max(1);
    while gcd(stride, n) != 1 {
        stride += 1;
    }
    ((k % n) as u128 * stride as u128 % n as u128) as u64
}

/// Positions of a language model's sequences: `data.max_seq_len`, or the model's.
pub fn seq_len(config: &Config) -> i64 {
    match config.data.max_seq_len {
        n if n > 0 => n.min(config.model.block_size),
        _ => config.model.block_size,
    }
}

/// Builds the dataset the configuration describes.
pub fn from_config(config: &Config) -> Result<Arc<dyn Dataset>> {
    let data = &config.data;
    let seq_len = seq_len(config);
    let classify = config.model.kind == crate::config::ModelKind::Mlp
        || (config.model.kind == crate::config::ModelKind::Torchscript && config.model.torchscript.task == crate::config::TaskKind::Classification);
    let tokenized = config.tokenizes();
    Ok(match (data.kind, classify) {
        (DataKind::Preference, _) => Arc::new(preference::PreferenceData::from_config(config, seq_len)?),
        (DataKind::Rollouts, _) => Arc::new(rollouts::RolloutData::from_config(config, seq_len)?),
        (DataKind::Prompts, _) => Arc::new(prompts::PromptData::from_config(config, seq_len)?),
        (DataKind::Chat | DataKind::PromptCompletion, _) => Arc::new(instruct::InstructData::from_config(config, seq_len)?),
        _ if tokenized => Arc::new(token_cache::windows(config, seq_len)?),
        (DataKind::Synthetic, false) => Arc::new(TokenWindows::synthetic(config, seq_len)),
        (DataKind::Synthetic, true) => Arc::new(Classification::synthetic(config)),
        (DataKind::Text, _) => Arc::new(TokenWindows::bytes_file(config, seq_len)?),
        (DataKind::Tokens, _) => Arc::new(TokenWindows::u16_file(config, seq_len)?),
        (DataKind::Jsonl, _) => Arc::new(Classification::jsonl(config)?),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn spread_visits_every_held_out_sample_once() {
        for n in [1u64, 2, 3, 10, 12, 97, 1000] {
            let mut seen: Vec<u64> = (0..n).map(|k| super::spread(k, n)).collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..n).collect::<Vec<_>>(), "n = {n}");
        }
        assert!(super::spread(1, 1000) > 100, "the second sample is far from the first");
    }
}
