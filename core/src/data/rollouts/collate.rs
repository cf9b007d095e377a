//! A micro-batch of groups as GRPO trains it: each completion a row `prompt +
//! completion` from position 0, right-padded, its completion tokens the targets (none
//! when `grpo.mask_truncated_completions` and it did not end with EOS), and in the
//! payload ([`Rollouts`]) each completion's advantage and the batch's statistics.
//! Rollouts read from a file and completions sampled in the run are collated alike;
//! with `data.packing`, each group is one sequence instead ([`super::pack`]).

use std::path::Path;

use tch::Tensor;

use super::{
    advantages::{self, nanmean},
    rows::Group,
    Rollouts,
};
use crate::{
    config::{Config, ScaleRewards},
    data::{
        text::{
            encode::Encoder,
            grid::{Grid, Place},
        },
        Batch, Payload,
    },
    error::{Error, Result},
};

/// How completions' rewards become advantages, and which completions train.
#[derive(Debug, Clone)]
pub struct Scoring {
    pub generations: usize,
    /// Each reward function's weight (one function of weight 1 without `[[grpo.rewards]]`).
    pub weights: Vec<f64>,
    pub scale: ScaleRewards,
    pub mask_truncated: bool,
    pub eos: u32,
    /// `data.packing`: each group one sequence, its prompt once ([`super::pack`]).
    pub packed: bool,
}

impl Scoring {
    /// `[grpo]`'s scoring, completions ending with token `eos`.
    pub fn from_config(config: &Config, eos: u32) -> Scoring {
        let grpo = &config.grpo;
        let weights = match grpo.rewards.is_empty() {
            true => vec![1.0],
            false => grpo.rewards.iter().map(|r| r.weight).collect(),
        };
        Scoring {
            generations: grpo.num_generations as usize,
            weights,
            scale: grpo.scale_rewards,
            mask_truncated: grpo.mask_truncated_completions,
            eos,
            packed: config.data.packing,
        }
    }

    /// Whether `completion`'s tokens are trained: not when it did not end with EOS
    /// and `grpo.mask_truncated_completions` says so.
    pub fn trains(&self, completion: &[u32]) -> bool {
        !(self.mask_truncated && completion.last() != Some(&self.eos))
    }
}

/// The id of the encoder's EOS token, which ends a completion (`path`: the data, named
/// in the error).
pub fn eos_id(encoder: &Encoder, path: &Path) -> Result<u32> {
    encoder.tokenizer.token_to_id(&encoder.eos).ok_or_else(|| Error::Data {
        path: path.to_owned(),
        message: format!("the tokenizer has no EOS token {:?} (tokenizer_config.json eos_token, or data.eos_token)", encoder.eos),
    })
}

/// The micro-batch of `groups` (whole groups, in order), the `slot`-th of its
/// generation, on its `iteration`.
pub fn collate(groups: &[&Group], scoring: &Scoring, slot: u64, iteration: u64) -> Result<Batch> {
    let rows: Vec<(&[u32], &[u32])> = groups.iter().flat_map(|g| g.completions.iter().map(move |c| (&g.prompt[..], &c[..]))).collect();
    let (grid, segments, packed, trained) = match scoring.packed {
        true => {
            let p = super::pack::pack(groups, scoring)?;
            (p.grid, Some(p.segments), Some(p.rows), p.trained)
        }
        false => {
            let (grid, trained) = separate(&rows, scoring);
            (grid, None, None, trained)
        }
    };
    let rewards: Vec<Vec<f64>> = (0..scoring.weights.len()).map(|f| groups.iter().flat_map(|g| g.rewards[f].iter().copied()).collect()).collect();
    let scored = advantages::score(&rewards, &scoring.weights, scoring.generations, scoring.scale);
    let lengths: Vec<f64> = rows.iter().map(|(_, c)| c.len() as f64).collect();
    let clipped = rows.iter().filter(|(_, c)| c.last() != Some(&scoring.eos)).count() as f64 / rows.len() as f64;
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
        packed,
    });
    grid.batch(rows.len(), segments, None, payload)
}

/// Each completion a row `prompt + completion` from position 0, right-padded; the
/// targets trained.
fn separate(rows: &[(&[u32], &[u32])], scoring: &Scoring) -> (Grid, i64) {
    let t = rows.iter().map(|(p, c)| p.len() + c.len() - 1).max().unwrap_or(1).max(1);
    let mut grid = Grid::new(rows.len(), t);
    let mut trained = 0;
    for (r, (prompt, completion)) in rows.iter().enumerate() {
        let train = scoring.trains(completion);
        let id = |p: usize| if p < prompt.len() { prompt[p] } else { completion[p - prompt.len()] };
        let (_, n) = grid.write_row(r * t, prompt.len() + completion.len(), id, |p| train && p >= prompt.len(), Place { position: 0, row: 0 });
        trained += n;
    }
    (grid, trained)
}
