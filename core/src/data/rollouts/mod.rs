//! Scored rollouts (`data.kind = "rollouts"`) for GRPO: one group a line
//! ([`rows`]), read whole at set-up; a micro-batch of `B` completions is `B / G`
//! groups of `G = grpo.num_generations`, each completion a row `prompt + completion`
//! from position 0, right-padded, its completion tokens the targets (none when
//! `grpo.mask_truncated_completions` and it did not end with EOS); with `data.packing`,
//! each group is one sequence, its prompt once ([`pack`]). What GRPO needs
//! beyond them is computed here, on the data workers, and travels in the batch's
//! payload ([`Rollouts`]): each completion's advantage ([`advantages`]) and the
//! batch's reward and length statistics, TRL's metrics.
//!
//! With `grpo.num_iterations = k`, the k steps of a generation train on the same
//! rollouts: step `s` reads generation `(s - 1) / k`'s samples, as TRL repeats each
//! batch `k` times, and the epochs count generations.

pub mod advantages;
pub mod collate;
mod pack;
pub mod rows;

use std::path::Path;

use tch::Tensor;

pub use self::collate::Scoring;
use self::rows::Group;
use super::{
    reader::Rows,
    text::{self, order::EpochOrder},
    Batch, BatchKey, Dataset, Split,
};
use crate::{
    config::Config,
    error::{Error, Result},
};

/// A micro-batch's share of a generation, as GRPO needs it on the device.
#[derive(Debug)]
pub struct Rollouts {
    /// `[B]` float32: each completion's advantage.
    pub advantages: Tensor,
    /// `[STATS + 2F]` float32: the batch's statistics ([`STATS`]), then each reward
    /// function's mean and standard deviation.
    pub stats: Tensor,
    /// Which micro-batch of which generation this is (the same on each of its
    /// iterations): where GRPO keeps its old log-probabilities.
    pub slot: u64,
    /// 0 on a generation's first step, up to `grpo.num_iterations - 1`.
    pub iteration: u64,
    /// Completion tokens in the loss.
    pub trained: i64,
    /// `data.packing`: where each completion's tokens are in its group's sequence.
    pub packed: Option<PackedRows>,
}

/// One row per completion over a packed batch ([`pack`]): `[B, L]` (`L` the longest
/// completion), completion `r`'s `j`-th token at `[r, j]`.
#[derive(Debug)]
pub struct PackedRows {
    /// int64: the token's cell in the batch's flattened `[groups x T]` grid, whose
    /// output predicts it (0 past the completion's end).
    pub index: Tensor,
    /// int64: the token where it is trained, else [`crate::objective::IGNORE_INDEX`].
    pub targets: Tensor,
}

/// The statistics' names (TRL's), in the order of [`Rollouts::stats`].
pub const STATS: [&str; 7] = [
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "completions/mean_length",
    "completions/min_length",
    "completions/max_length",
    "completions/clipped_ratio",
];

pub struct RolloutData {
    groups: Vec<Group>,
    order: EpochOrder,
    seq_len: usize,
    scoring: Scoring,
    iterations: u64,
    accum: u64,
}

impl RolloutData {
    pub fn from_config(config: &Config, seq_len: i64) -> Result<RolloutData> {
        let (encoder, _) = text::encoder(config)?;
        let path = Path::new(&config.data.path);
        let eos = collate::eos_id(&encoder, path)?;
        let grpo = &config.grpo;
        let expect = rows::Expect {
            generations: grpo.num_generations as usize,
            functions: grpo.rewards.len(),
            encoder: &encoder,
            columns: &config.data.columns,
        };
        let mut groups = Vec::new();
        let mut reader = Rows::open(&config.data.path, config.data.format, &[])?;
        let limit = seq_len as usize + 1;
        loop {
            let records = reader.next_batch(1024)?;
            if records.is_empty() {
                break;
            }
            for record in records {
                let group = rows::group(&record, &expect).map_err(|m| record.place.error(m))?;
                let longest = group.completions.iter().map(Vec::len).max().unwrap_or(0) + group.prompt.len();
                if longest > limit {
                    return Err(record.place.error(format!(
                        "prompt + completion is {longest} tokens, more than data.max_seq_len + 1 = {limit}: rollouts are not cut (raise data.max_seq_len)"
                    )));
                }
                let max_id = group.completions.iter().flatten().chain(&group.prompt).copied().max().unwrap_or(0);
                text::check_vocab(max_id, config, path)?;
                groups.push(group);
            }
        }
        if groups.is_empty() {
            return Err(Error::Data { path: path.to_owned(), message: "holds no rollouts".into() });
        }
        tracing::info!("rollouts: {} groups of {} completions from {}", groups.len(), grpo.num_generations, path.display());
        Ok(RolloutData {
            order: EpochOrder::new(config.run.seed, groups.len()),
            groups,
            seq_len: seq_len as usize,
            scoring: Scoring::from_config(config, eos),
            iterations: grpo.num_iterations.max(1) as u64,
            accum: config.optim.accum_steps.max(1),
        })
    }
}

impl Dataset for RolloutData {
    fn batch(&self, split: Split, key: BatchKey) -> Result<Batch> {
        if split == Split::Val {
            return Err(Error::Other("rollouts have no held-out part".into()));
        }
        let g = self.scoring.generations as u64;
        let (stream, iteration) = generation_stream(&key, self.iterations, self.accum);
        let picks: Vec<&Group> = (0..key.count / g).map(|j| &self.groups[self.order.sample(stream / g + j)]).collect();
        collate::collate(&picks, &self.scoring, stream, iteration)
    }

    fn dataset_names(&self) -> Vec<String> {
        Vec::new()
    }

    /// Completions, each counted once per iteration: the epochs count generations.
    fn train_len(&self) -> u64 {
        (self.groups.len() * self.scoring.generations) as u64 * self.iterations
    }

    fn val_len(&self) -> Option<u64> {
        Some(0)
    }

    fn seq_len(&self) -> i64 {
        self.seq_len as i64
    }
}

/// Where `key`'s samples are in the stream of generations, and its iteration: with
/// `k` iterations, steps `g k + 1 ..= (g + 1) k` read generation `g`, the samples
/// step `g + 1` reads without iterations (so that the epochs count generations).
pub(crate) fn generation_stream(key: &BatchKey, k: u64, accum: u64) -> (u64, u64) {
    let step = key.step.max(1) - 1;
    let (generation, iteration) = (step / k, step % k);
    if step == 0 {
        return (key.stream, 0);
    }
    // The loader's stream is ((step - 1) * accum + micro) * ranks * B + first_sample:
    // a step's samples, all ranks together, are accum * ranks * B.
    let draws = step * accum + key.micro;
    let per_step = (key.stream - key.first_sample) / draws * accum;
    (key.stream - step * per_step + generation * per_step, iteration)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loader's key (`data::loader::DrawPlan`'s arithmetic).
    fn key(step: u64, micro: u64, accum: u64, world: u64, batch: u64, rank: u64) -> BatchKey {
        let first_sample = rank * batch;
        let stream = ((step - 1) * accum + micro) * world * batch + first_sample;
        BatchKey { step, micro, first_sample, count: batch, stream }
    }

    #[test]
    fn each_generation_is_read_k_times_in_turn_on_any_split_into_ranks_and_micro_batches() {
        for (accum, world, batch, k) in [(1, 1, 4, 1), (1, 1, 4, 2), (2, 3, 4, 3), (3, 2, 8, 2)] {
            for rank in 0..world {
                for step in 1..=7u64 {
                    for micro in 0..accum {
                        let this = key(step, micro, accum, world, batch, rank);
                        // Generation g reads what step g + 1 would have without iterations.
                        let first = key((step - 1) / k + 1, micro, accum, world, batch, rank);
                        assert_eq!(generation_stream(&this, k, accum), (first.stream, (step - 1) % k), "{accum} {world} {batch} {k} step {step}");
                    }
                }
            }
        }
    }
}
