//! Group Relative Policy Optimization on scored rollouts (`data.kind = "rollouts"`),
//! as TRL 1.16's `GRPOTrainer` computes it ([`loss`]): the batch's completions carry
//! their advantages (computed from the rewards by the data, on the host:
//! [`crate::data::rollouts`]); the policy's log-probabilities of the completion tokens
//! under `logits / grpo.temperature` ([`tokens`]) are compared with the old ones (the
//! policy's when the rollouts were first trained on, kept here across a generation's
//! `grpo.num_iterations` steps) and, with `grpo.beta > 0`, the [`Reference`]'s.
//!
//! With `train.loss_chunk`, the log-probabilities come from the hidden states a chunk
//! at a time, without gradient; the loss is computed on them as a leaf, and its
//! gradient (one value per token) weighs each position's cross-entropy in the chunked
//! loss's gradient ([`chunked::summed`]), as DPO does: no `[tokens, vocab]` logits
//! exist. The temperature divides the hidden states there (`(h / t) W^T`), which a
//! soft-capped head cannot take: that combination is refused.
//!
//! With `data.packing`, each group is one sequence (its prompt run once,
//! [`crate::data::rollouts`]); the per-token values are read back as one row per
//! completion ([`rows`]) before the loss, which is the same either way.

mod loss;
mod rows;
mod tokens;

use std::{collections::HashMap, sync::Mutex};

use tch::{nn, Tensor};

use self::{
    loss::{Inputs, Settings},
    rows::Rows,
};
use super::{chunked, logps::Output, Count, Forward, Metrics, Objective, Reference, Sum};
use crate::{
    config::{Config, GrpoLoss},
    data::{
        rollouts::{Rollouts, STATS},
        Batch, Dataset, Payload,
    },
    error::{Error, Result},
};

pub struct Grpo {
    settings: Settings,
    temperature: f64,
    max_completion_length: u32,
    iterations: u64,
    /// `train.loss_chunk` (0: the whole logits).
    chunk: i64,
    reference: Option<Mutex<Reference>>,
    /// The log-probabilities `[B, T]` of each micro-batch of the generation being
    /// trained on (by its slot), taken on its first iteration.
    old: Mutex<HashMap<u64, Tensor>>,
    /// The names of the batch's statistics: [`STATS`], then `rewards/<name>/mean` and `/std`.
    stat_names: Vec<&'static str>,
}

impl Grpo {
    /// GRPO as `config.grpo` says; the reference (`grpo.beta > 0`) as DPO's is built
    /// (see [`Reference::named`]; `vars` holds the policy's parameters, nothing restored yet).
    pub fn build(config: &Config, vars: &nn::VarStore, dataset: &dyn Dataset) -> Result<Grpo> {
        let g = &config.grpo;
        let reference = match g.beta > 0.0 {
            true => Some(Mutex::new(Reference::named(config, "grpo", &g.reference, vars, dataset)?)),
            false => None,
        };
        let names: Vec<String> = match g.rewards.is_empty() {
            true => vec!["reward".into()],
            false => g.rewards.iter().map(|r| r.name.clone()).collect(),
        };
        // Metric names are static; these are made once per run, at set-up.
        let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
        let mut stat_names: Vec<&'static str> = STATS.to_vec();
        for name in names {
            stat_names.extend([leak(format!("rewards/{name}/mean")), leak(format!("rewards/{name}/std"))]);
        }
        if config.data.kind == crate::config::DataKind::Prompts {
            stat_names.extend([crate::rollout::SAMPLING_S, crate::rollout::REWARDS_S]);
        }
        Ok(Grpo {
            settings: Settings {
                loss: g.loss_type,
                epsilon_low: g.epsilon,
                epsilon_high: g.epsilon_high(),
                beta: g.beta,
                bias_correction_kl: g.use_bias_correction_kl,
            },
            temperature: g.temperature,
            max_completion_length: g.max_completion_length,
            iterations: g.num_iterations.max(1) as u64,
            chunk: config.loss_chunk(),
            reference,
            old: Mutex::new(HashMap::new()),
            stat_names,
        })
    }

    fn rollouts(batch: &Batch) -> Result<&Rollouts> {
        match &batch.payload {
            Payload::Rollouts(r) => Ok(r),
            _ => Err(Error::Other("GRPO trains on scored rollouts (data.kind = \"rollouts\")".into())),
        }
    }

    /// What the micro-batch counts for, as the loss type normalises: its tokens, its
    /// completions (times `max_completion_length`), or one mean.
    fn weight(&self, batch: &Batch, r: &Rollouts) -> f64 {
        match self.count_of(batch, r) {
            Count::Units(n) => n as f64,
            Count::MicroBatch => 1.0,
        }
    }

    fn count_of(&self, batch: &Batch, r: &Rollouts) -> Count {
        let completions = batch.samples.max(0) as u64;
        match self.settings.loss {
            GrpoLoss::Dapo => Count::Units(r.trained.max(0) as u64),
            GrpoLoss::Grpo => Count::Units(completions),
            GrpoLoss::DrGrpo => Count::Units(completions * self.max_completion_length as u64),
            GrpoLoss::Bnpo => Count::MicroBatch,
        }
    }

    /// The old log-probabilities: this step's own (detached) on a generation's first
    /// iteration (kept for the next ones when there are more), else those kept. A
    /// resumed run that starts inside a generation has none kept: it starts on-policy.
    fn old_logps(&self, logps: &Tensor, r: &Rollouts, train: bool) -> Result<Tensor> {
        let current = logps.f_detach()?;
        if !train || self.iterations == 1 {
            return Ok(current);
        }
        let mut old = self.old.lock().map_err(|_| Error::Other("GRPO's old log-probabilities' lock is poisoned".into()))?;
        if r.iteration == 0 {
            old.insert(r.slot, current.copy());
            return Ok(current);
        }
        let kept = match r.iteration + 1 == self.iterations {
            true => old.remove(&r.slot),
            false => old.get(&r.slot).map(Tensor::shallow_clone),
        };
        Ok(kept.unwrap_or(current))
    }

    fn reference_logps(&self, model: &mut dyn Forward, batch: &Batch, rows: &Rows) -> Result<Option<Tensor>> {
        let Some(reference) = &self.reference else { return Ok(None) };
        let mut reference = reference.lock().map_err(|_| Error::Other("the GRPO reference model's lock is poisoned".into()))?;
        let (chunk, temperature) = (self.chunk, self.temperature);
        reference.run(model, |m| Ok(Some(rows.gather(&tokens::values(&Output::of(m, batch, false, chunk)?, batch, temperature)?.logps)?)))
    }

    /// The loss and metrics from the policy's token log-probabilities `logps`, a row per
    /// completion (`rows`).
    fn loss_of(&self, logps: &Tensor, values: &TokensRest, rows: &Rows, batch: &Batch, train: bool) -> Result<(Tensor, Metrics)> {
        let r = Self::rollouts(batch)?;
        let old = self.old_logps(logps, r, train)?;
        let inputs =
            Inputs { logps, old: &old, reference: values.reference.as_ref(), entropy: &values.entropy, advantages: &r.advantages, mask: &rows.mask };
        loss::loss_and_metrics(&self.settings, &inputs, self.weight(batch, r))
    }

    /// The batch's reward and length statistics ([`STATS`], each reward function's,
    /// the rollout stage's times), means over its completions: averaged over the step's
    /// micro-batches and ranks as such ([`super::Sum::means`]), not weighted by tokens.
    fn stats(&self, r: &Rollouts) -> Result<Metrics> {
        self.stat_names.iter().enumerate().map(|(i, name)| Ok((*name, r.stats.f_select(0, i as i64)?))).collect()
    }
}

/// What the loss needs besides the policy's log-probabilities.
struct TokensRest {
    entropy: Tensor,
    reference: Option<Tensor>,
}

impl Objective for Grpo {
    fn name(&self) -> &'static str {
        "grpo"
    }

    fn count(&self, batch: &Batch) -> Result<Count> {
        Ok(self.count_of(batch, Self::rollouts(batch)?))
    }

    fn sum(&self, model: &mut dyn Forward, batch: &Batch, train: bool) -> Result<Sum> {
        let r = Self::rollouts(batch)?;
        let (rows, means) = (Rows::of(batch, r.packed.as_ref())?, self.stats(r)?);
        // The reference first: its logits are freed before the policy's graph is built.
        let reference = self.reference_logps(model, batch, &rows)?;
        let output = Output::of(model, batch, train, self.chunk)?;
        let values = tokens::values(&output, batch, self.temperature)?;
        let (logps, entropy) = (rows.gather(&values.logps)?, rows.gather(&values.entropy)?);
        let rest = TokensRest { entropy, reference };
        match output {
            Output::Logits(logits) => {
                let (loss, metrics) = self.loss_of(&logps, &rest, &rows, batch, train)?;
                Ok(Sum { loss, metrics, means, logits: Some(logits) })
            }
            Output::Hidden { states, head, chunk } if states.requires_grad() => {
                if head.softcap.is_some() && self.temperature != 1.0 {
                    return Err(Error::Other(
                        "grpo.temperature with train.loss_chunk on a model that soft-caps its logits: set train.loss_chunk = 0".into(),
                    ));
                }
                let leaf = logps.f_detach()?.f_set_requires_grad(true)?;
                let (loss, metrics) = self.loss_of(&leaf, &rest, &rows, batch, train)?;
                let mut grads = Tensor::f_run_backward(&[&loss], &[&leaf], false, false)?;
                let grad = grads.pop().ok_or_else(|| Error::Other("GRPO: no gradient for the log-probabilities".into()))?;
                // d loss / d logp(token) = grad; the cross-entropy is -logp of (h / t) W^T.
                let grad = rows.scatter(&grad, &batch.targets)?;
                let scaled = states.f_div_scalar(self.temperature)?;
                let surrogate = chunked::summed(&scaled, &head, &batch.targets, Some(&grad.f_neg()?), chunk)?;
                let loss = loss.f_detach()?.f_add(&surrogate.f_sub(&surrogate.f_detach()?)?)?;
                Ok(Sum { loss, metrics, means, logits: None })
            }
            Output::Hidden { .. } => {
                let (loss, metrics) = self.loss_of(&logps, &rest, &rows, batch, train)?;
                Ok(Sum { loss, metrics, means, logits: None })
            }
        }
    }
}
