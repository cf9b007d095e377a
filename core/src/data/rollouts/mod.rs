//! Scored rollouts (`data.kind = "rollouts"`) for GRPO: one group a line
//! ([`rows`]), read whole at set-up; a micro-batch of `B` completions is `B / G`
//! groups of `G = grpo.num_generations`, each completion a row `prompt + completion`
//! from position 0, right-padded, its completion tokens the targets (none when
//! `grpo.mask_truncated_completions` and it did not end with EOS). What GRPO needs
//! beyond them is computed here, on the data workers, and travels in the batch's
//! payload ([`Rollouts`]): each completion's advantage ([`advantages`]) and the
//! batch's reward and length statistics, TRL's metrics.
//!
//! With `grpo.num_iterations = k`, the k steps of a generation train on the same
//! rollouts: step `s` reads generation `(s - 1) / k`'s samples, as TRL repeats each
//! batch `k` times, and the epochs count generations.

pub mod advantages;
pub mod rows;

use std::path::Path;

use tch::Tensor;

use self::{advantages::nanmean, rows::Group};
use super::{
    reader::Rows,
    text::{
        self,
        grid::{Grid, Place},
        order::EpochOrder,
    },
    Batch, BatchKey, Dataset, Payload, Split,
};
use crate::{
    config::{Config, ScaleRewards},
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
    generations: usize,
    weights: Vec<f64>,
    scale: ScaleRewards,
    mask_truncated: bool,
    eos: u32,
    iterations: u64,
    accum: u64,
}

impl RolloutData {
    pub fn from_config(config: &Config, seq_len: i64) -> Result<RolloutData> {
        let (encoder, _) = text::encoder(config)?;
        let path = Path::new(&config.data.path);
        let eos = encoder.tokenizer.token_to_id(&encoder.eos).ok_or_else(|| Error::Data {
            path: path.to_owned(),
            message: format!("the tokenizer has no EOS token {:?} (tokenizer_config.json eos_token, or data.eos_token)", encoder.eos),
        })?;
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
        let weights = match grpo.rewards.is_empty() {
            true => vec![1.0],
            false => grpo.rewards.iter().map(|r| r.weight).collect(),
        };
        tracing::info!("rollouts: {} groups of {} completions from {}", groups.len(), grpo.num_generations, path.display());
        Ok(RolloutData {
            order: EpochOrder::new(config.run.seed, groups.len()),
            groups,
            seq_len: seq_len as usize,
            generations: grpo.num_generations as usize,
            weights,
            scale: grpo.scale_rewards,
            mask_truncated: grpo.mask_truncated_completions,
            eos,
            iterations: grpo.num_iterations.max(1) as u64,
            accum: config.optim.accum_steps.max(1),
        })
    }

    fn collate(&self, picks: &[usize], slot: u64, iteration: u64) -> Result<Batch> {
        let rows: Vec<(&[u32], &[u32])> =
            picks.iter().flat_map(|&g| self.groups[g].completions.iter().map(move |c| (&self.groups[g].prompt[..], &c[..]))).collect();
        let t = rows.iter().map(|(p, c)| p.len() + c.len() - 1).max().unwrap_or(1).max(1);
        let mut grid = Grid::new(rows.len(), t);
        let mut trained = 0;
        for (r, (prompt, completion)) in rows.iter().enumerate() {
            let train = !(self.mask_truncated && completion.last() != Some(&self.eos));
            let id = |p: usize| if p < prompt.len() { prompt[p] } else { completion[p - prompt.len()] };
            let (_, n) = grid.write_row(r * t, prompt.len() + completion.len(), id, |p| train && p >= prompt.len(), Place { position: 0, row: 0 });
            trained += n;
        }
        let rewards: Vec<Vec<f64>> =
            (0..self.weights.len()).map(|f| picks.iter().flat_map(|&g| self.groups[g].rewards[f].iter().copied()).collect()).collect();
        let scored = advantages::score(&rewards, &self.weights, self.generations, self.scale);
        let lengths: Vec<f64> = rows.iter().map(|(_, c)| c.len() as f64).collect();
        let clipped = rows.iter().filter(|(_, c)| c.last() != Some(&self.eos)).count() as f64 / rows.len() as f64;
        let mut stats = vec![
            nanmean(scored.rewards.iter().copied()),
            advantages::nanstd(&scored.rewards),
            scored.frac_zero_std,
            nanmean(lengths.iter().copied()),
            lengths.iter().copied().fold(f64::INFINITY, f64::min),
            lengths.iter().copied().fold(0.0, f64::max),
            clipped,
        ];
        for function in &rewards {
            stats.extend([nanmean(function.iter().copied()), advantages::nanstd(function)]);
        }
        let to_f32 = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
        let payload = Payload::Rollouts(Rollouts {
            advantages: Tensor::f_from_slice(&to_f32(&scored.advantages))?,
            stats: Tensor::f_from_slice(&to_f32(&stats))?,
            slot,
            iteration,
            trained,
        });
        grid.batch(rows.len(), None, None, payload)
    }
}

impl Dataset for RolloutData {
    fn batch(&self, split: Split, key: BatchKey) -> Result<Batch> {
        if split == Split::Val {
            return Err(Error::Other("rollouts have no held-out part".into()));
        }
        let g = self.generations as u64;
        let (stream, iteration) = generation_stream(&key, self.iterations, self.accum);
        let picks: Vec<usize> = (0..key.count / g).map(|j| self.order.sample(stream / g + j)).collect();
        self.collate(&picks, stream, iteration)
    }

    fn dataset_names(&self) -> Vec<String> {
        Vec::new()
    }

    /// Completions, each counted once per iteration: the epochs count generations.
    fn train_len(&self) -> u64 {
        (self.groups.len() * self.generations) as u64 * self.iterations
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
fn generation_stream(key: &BatchKey, k: u64, accum: u64) -> (u64, u64) {
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
