//! Direct Preference Optimization, as TRL's `DPOTrainer` computes it. A batch of
//! `B` pairs holds `2B` rows, the chosen completions then the rejected ones, or
//! (`data.packing`) `B` sequences each holding its prompt once (see
//! [`crate::data::preference`]); each completion's log-probability is the sum over
//! its tokens. With the reference's (see [`Reference`]):
//!
//! - `margin = (chosen - ref_chosen) - (rejected - ref_rejected)`;
//! - `sigmoid`: `-log sigmoid(beta * margin)`; `hinge`: `relu(1 - beta * margin)`;
//!   `ipo`: `(margin per completion token - 1 / (2 beta))^2`, each log-ratio
//!   divided by its completion's tokens, as TRL normalises it.
//!
//! The step's loss is the mean over every pair of the step, however it is cut into
//! micro-batches and ranks: a micro-batch sums its pairs' losses and counts its
//! pairs ([`Count::Units`]). The metrics are TRL's, means over the pairs:
//! `rewards/chosen` (`beta * (chosen - ref_chosen)`), `rewards/rejected`,
//! `rewards/accuracies` (chosen rewarded above rejected), `rewards/margins`,
//! `logps/chosen`, `logps/rejected`; and `logits/chosen`, `logits/rejected`, the
//! logits averaged over the vocabulary and the completion tokens (see
//! [`Dpo::metrics`]).
//!
//! With `train.loss_chunk`, the log-probabilities come from the hidden states a
//! chunk of positions at a time ([`Output::Hidden`]), without gradient; the pair
//! losses are computed on them as a leaf, whose gradient (one scalar per
//! completion, on the device) then weighs each position's cross-entropy in the
//! chunked loss's gradient ([`chunked::summed`] with a scale): the loss's value is
//! the pairs', its gradient the one the whole logits would give, and no
//! `[tokens, vocab]` logits exist. The projection runs twice (values, then
//! gradients) in exchange.

use std::sync::Mutex;

use tch::{nn, Kind, Tensor};

use super::{
    chunked,
    logps::{per_completion, per_position, Output},
    precompute::precompute,
    Count, Forward, Metrics, Objective, Reference, Sum, IGNORE_INDEX,
};
use crate::{
    config::{Config, DpoLoss},
    data::{Batch, Dataset, Payload},
    error::{Error, Result},
    model::Model,
};

pub struct Dpo {
    beta: f64,
    loss: DpoLoss,
    /// `train.loss_chunk` (0: the whole logits).
    chunk: i64,
    reference: ReferenceLogps,
}

/// Where the reference's log-probabilities of a batch come from.
enum ReferenceLogps {
    /// The reference model, run from `sum(&self)`: behind a lock (one step at a time takes it).
    Live(Mutex<Reference>),
    /// `dpo.precompute_reference`: every pair's, `[pairs, 2]` on the device (chosen,
    /// rejected; the training pairs, then the held-out ones), found by the pairs'
    /// indices the batches carry.
    Precomputed(Tensor),
}

/// A pair's chosen and rejected halves of `[2B]` row values.
fn halves(rows: &Tensor, pairs: i64) -> Result<(Tensor, Tensor)> {
    Ok((rows.f_narrow(0, 0, pairs)?, rows.f_narrow(0, pairs, pairs)?))
}

impl Dpo {
    /// DPO as `config.dpo` says, against the reference it names (see
    /// [`Reference::build`]; `policy` is the model about to be trained, its
    /// parameters in `vars`, nothing restored into them yet). With
    /// `dpo.precompute_reference`, the reference's log-probabilities of every pair
    /// are computed here and the reference model freed.
    pub fn build(config: &Config, policy: &mut dyn Model, vars: &nn::VarStore, dataset: &dyn Dataset) -> Result<Dpo> {
        let reference = match config.dpo.precompute_reference {
            true => {
                let data = dataset.preference().ok_or_else(|| Error::Other("dpo.precompute_reference needs preference data".into()))?;
                ReferenceLogps::Precomputed(precompute(config, policy, vars, dataset, data)?)
            }
            false => ReferenceLogps::Live(Mutex::new(Reference::build(config, vars, dataset)?)),
        };
        Ok(Dpo { beta: config.dpo.beta, loss: config.dpo.loss, chunk: config.loss_chunk(), reference })
    }

    /// The batch's reference log-probabilities: precomputed, or the reference's.
    /// `[2B]`: the chosen completions', then the rejected ones'.
    fn reference_logps(&self, policy: &mut dyn Forward, batch: &Batch) -> Result<Tensor> {
        match (&self.reference, &batch.payload) {
            (ReferenceLogps::Precomputed(all), Payload::Pairs(ids)) => Ok(all.f_index_select(0, ids)?.f_transpose(0, 1)?.f_reshape([-1])?),
            (ReferenceLogps::Precomputed(_), _) => {
                Err(Error::Other("DPO's precomputed reference needs batches of preference pairs that name their pairs".into()))
            }
            (ReferenceLogps::Live(reference), _) => {
                let mut reference = reference.lock().map_err(|_| Error::Other("the DPO reference model's lock is poisoned".into()))?;
                reference.logps(policy, batch, self.chunk)
            }
        }
    }

    /// Each pair's loss `[B]` from its log-ratios (policy minus reference) and,
    /// for `ipo`, the rows' completion tokens.
    fn pair_losses(&self, chosen_ratio: &Tensor, rejected_ratio: &Tensor, batch: &Batch) -> Result<Tensor> {
        let beta = self.beta;
        Ok(match self.loss {
            DpoLoss::Sigmoid => chosen_ratio.f_sub(rejected_ratio)?.f_mul_scalar(beta)?.f_log_sigmoid()?.f_neg()?,
            DpoLoss::Hinge => chosen_ratio.f_sub(rejected_ratio)?.f_mul_scalar(-beta)?.f_add_scalar(1.0)?.f_relu()?,
            DpoLoss::Ipo => {
                let tokens = per_completion(&batch.targets.f_ne(IGNORE_INDEX)?.f_to_kind(Kind::Float)?, batch)?.f_clamp_min(1.0)?;
                let (chosen_tokens, rejected_tokens) = halves(&tokens, batch.samples)?;
                let delta = chosen_ratio.f_div(&chosen_tokens)?.f_sub(&rejected_ratio.f_div(&rejected_tokens)?)?;
                delta.f_sub_scalar(1.0 / (2.0 * beta))?.f_square()?
            }
        })
    }
}

impl Objective for Dpo {
    fn name(&self) -> &'static str {
        "dpo"
    }

    /// The batch's pairs.
    fn count(&self, batch: &Batch) -> Result<Count> {
        Ok(Count::Units(batch.samples.max(0) as u64))
    }

    fn sum(&self, model: &mut dyn Forward, batch: &Batch, train: bool) -> Result<Sum> {
        // The reference first: its logits are freed before the policy's graph is built.
        let reference = self.reference_logps(model, batch)?;
        let output = Output::of(model, batch, train, self.chunk)?;
        let (logps, logit_sums) = output.completion_logps_and_logit_sums(batch)?;
        let metrics = self.metrics(&logps, &reference, &logit_sums, batch)?;
        match output {
            Output::Logits(logits) => {
                let loss = self.pair_loss_sum(&logps, &reference, batch)?;
                Ok(Sum { loss, metrics, means: Vec::new(), logits: Some(logits) })
            }
            Output::Hidden { states, head, chunk } if states.requires_grad() => {
                let mut leaf = logps.f_detach()?;
                let leaf = leaf.f_requires_grad_(true)?;
                let loss = self.pair_loss_sum(&leaf, &reference, batch)?;
                let mut grads = Tensor::f_run_backward(&[&loss], &[&leaf], false, false)?;
                let grad = grads.pop().ok_or_else(|| Error::Other("DPO: no gradient for the log-probabilities".into()))?;
                // d loss / d logp(token) is its completion's; the cross-entropy is -logp.
                let scale = per_position(&grad.f_neg()?, batch)?;
                let surrogate = chunked::summed(&states, &head, &batch.targets, Some(&scale), chunk)?;
                let loss = loss.f_detach()?.f_add(&surrogate.f_sub(&surrogate.f_detach()?)?)?;
                Ok(Sum { loss, metrics, means: Vec::new(), logits: None })
            }
            Output::Hidden { .. } => {
                let loss = self.pair_loss_sum(&logps, &reference, batch)?;
                Ok(Sum { loss, metrics, means: Vec::new(), logits: None })
            }
        }
    }
}

impl Dpo {
    /// The summed loss of the batch's pairs, from the policy's and the reference's
    /// completion log-probabilities (`[2B]` each).
    fn pair_loss_sum(&self, logps: &Tensor, reference: &Tensor, batch: &Batch) -> Result<Tensor> {
        let (chosen, rejected) = halves(logps, batch.samples)?;
        let (ref_chosen, ref_rejected) = halves(reference, batch.samples)?;
        Ok(self.pair_losses(&chosen.f_sub(&ref_chosen)?, &rejected.f_sub(&ref_rejected)?, batch)?.f_sum(Kind::Float)?)
    }

    /// TRL's eight metrics, summed over the batch's pairs: the six of the rewards and
    /// log-probabilities, and `logits/chosen`, `logits/rejected`, which TRL averages
    /// over the completion tokens of its batch (the vocabulary-mean logit of each),
    /// here that mean times the batch's pairs, so that a step or an evaluation
    /// reports the pair-weighted mean of its micro-batches' token means (one
    /// micro-batch: TRL's value).
    fn metrics(&self, logps: &Tensor, reference: &Tensor, logit_sums: &Tensor, batch: &Batch) -> Result<Metrics> {
        let pairs = batch.samples;
        tch::no_grad(|| -> Result<Metrics> {
            let (chosen, rejected) = halves(&logps.f_detach()?, pairs)?;
            let (ref_chosen, ref_rejected) = halves(reference, pairs)?;
            let chosen_rewards = chosen.f_sub(&ref_chosen)?.f_mul_scalar(self.beta)?;
            let rejected_rewards = rejected.f_sub(&ref_rejected)?.f_mul_scalar(self.beta)?;
            let sum = |t: &Tensor| t.f_sum(Kind::Float);
            let tokens = per_completion(&batch.targets.f_ne(IGNORE_INDEX)?.f_to_kind(Kind::Float)?, batch)?;
            let (chosen_tokens, rejected_tokens) = halves(&tokens, pairs)?;
            let (chosen_logits, rejected_logits) = halves(logit_sums, pairs)?;
            let token_mean = |logits: &Tensor, tokens: &Tensor| -> Result<Tensor> {
                Ok(sum(logits)?.f_div(&sum(tokens)?.f_clamp_min(1.0)?)?.f_mul_scalar(pairs as f64)?)
            };
            Ok(vec![
                ("rewards/chosen", sum(&chosen_rewards)?),
                ("rewards/rejected", sum(&rejected_rewards)?),
                ("rewards/accuracies", sum(&chosen_rewards.f_gt_tensor(&rejected_rewards)?)?),
                ("rewards/margins", sum(&chosen_rewards.f_sub(&rejected_rewards)?)?),
                ("logps/chosen", sum(&chosen)?),
                ("logps/rejected", sum(&rejected)?),
                ("logits/chosen", token_mean(&chosen_logits, &chosen_tokens)?),
                ("logits/rejected", token_mean(&rejected_logits, &rejected_tokens)?),
            ])
        })
    }
}
