//! Each completion's summed log-probability of its tokens, DPO's quantity: from a
//! forward's whole logits, or (`train.loss_chunk`) from its hidden states and
//! output projection a chunk of positions at a time, the `[tokens, vocab]` logits
//! never whole ([`chunked::token_logps`]).

use tch::{Kind, Reduction, Tensor};

use super::{chunked, cross_entropy, Forward, IGNORE_INDEX};
use crate::{
    data::{
        preference::{CHOSEN, REJECTED},
        Batch,
    },
    error::Result,
};

/// Per-token values `[rows, T]` summed per completion: `[2B]`, the chosen ones then
/// the rejected ones, whether the pairs are separate rows or one sequence each
/// (their rows told apart by [`crate::data::Segments::ids`]).
pub fn per_completion(values: &Tensor, batch: &Batch) -> Result<Tensor> {
    let sum = |t: &Tensor| t.f_sum_dim_intlist(Some(&[1i64][..]), false, Kind::Float);
    match batch.segments.as_ref().filter(|s| s.prefix.is_some()) {
        None => Ok(sum(values)?),
        Some(s) => {
            let chosen = sum(&values.f_mul(&s.ids.f_eq(CHOSEN)?)?)?;
            let rejected = sum(&values.f_mul(&s.ids.f_eq(REJECTED)?)?)?;
            Ok(Tensor::f_cat(&[chosen, rejected], 0)?)
        }
    }
}

/// The inverse of [`per_completion`]: each completion's value `[2B]` on every
/// position of its row, `[rows, T]` (0 on the prompt's row and the padding of a
/// pair's sequence; on separate rows the padding and prompt get it too, and their
/// targets are ignored).
pub fn per_position(values: &Tensor, batch: &Batch) -> Result<Tensor> {
    let t = batch.targets.size()[1];
    match batch.segments.as_ref().filter(|s| s.prefix.is_some()) {
        None => Ok(values.f_unsqueeze(1)?.f_expand([-1, t], false)?.f_contiguous()?),
        Some(s) => {
            let pairs = batch.samples;
            let chosen = values.f_narrow(0, 0, pairs)?.f_unsqueeze(1)?.f_mul(&s.ids.f_eq(CHOSEN)?)?;
            let rejected = values.f_narrow(0, pairs, pairs)?.f_unsqueeze(1)?.f_mul(&s.ids.f_eq(REJECTED)?)?;
            Ok(chosen.f_add(&rejected)?)
        }
    }
}

/// A language model's forward, as the log-probabilities need it.
pub enum Output {
    Logits(Tensor),
    /// `train.loss_chunk`: hidden states `[rows, T, D]` and the projection `[V, D]`.
    Hidden {
        states: Tensor,
        head: crate::model::Head,
        chunk: i64,
    },
}

impl Output {
    /// `model`'s forward of `batch`: its hidden states when `chunk > 0` and the
    /// model hands them out, else its logits.
    pub fn of(model: &mut dyn Forward, batch: &Batch, train: bool, chunk: i64) -> Result<Output> {
        if chunk > 0 {
            if let Some((states, head)) = model.forward_hidden(batch, train)? {
                return Ok(Output::Hidden { states, head, chunk });
            }
        }
        Ok(Output::Logits(model.forward(batch, train)?))
    }

    /// Each completion's summed log-probability, float32 `[2B]`: with the logits'
    /// graph, or without gradient from hidden states (see [`super::dpo`] for how
    /// their gradient reaches the model).
    pub fn completion_logps(&self, batch: &Batch) -> Result<Tensor> {
        match self {
            Output::Logits(logits) => per_completion(&cross_entropy(logits, &batch.targets, Reduction::None)?.f_neg()?, batch),
            Output::Hidden { states, head, chunk } => {
                tch::no_grad(|| per_completion(&chunked::token_logps(states, head, &batch.targets, *chunk)?, batch))
            }
        }
    }

    /// [`Output::completion_logps`], and each completion's logits averaged over the
    /// vocabulary, summed over its tokens (`[2B]`, without gradient): TRL's
    /// `mean_logits` under the completion mask.
    pub fn completion_logps_and_logit_sums(&self, batch: &Batch) -> Result<(Tensor, Tensor)> {
        match self {
            Output::Logits(logits) => {
                let means = tch::no_grad(|| -> Result<Tensor> {
                    let trained = batch.targets.f_ne(IGNORE_INDEX)?;
                    per_completion(&logits.f_mean_dim(Some(&[-1i64][..]), false, Kind::Float)?.f_mul(&trained)?, batch)
                })?;
                Ok((self.completion_logps(batch)?, means))
            }
            Output::Hidden { states, head, chunk } => tch::no_grad(|| {
                let (logps, means) = chunked::token_logps_and_logit_means(states, head, &batch.targets, *chunk)?;
                Ok((per_completion(&logps, batch)?, per_completion(&means, batch)?))
            }),
        }
    }
}
