//! The objective: what training minimises, chosen once at set-up from the
//! configuration ([`from_config`]), and how a step's micro-batches and ranks add up
//! to its loss.
//!
//! An [`Objective`] turns a micro-batch into a *sum* (its loss, and its metrics, as
//! device scalars) and a *count* (what the sum is over: [`Count`]). Training divides
//! the sums of a step's micro-batches by the count of the whole step, every
//! micro-batch on every rank, in one place ([`StepScale`]); evaluation adds up
//! `(sum, count)` over its batches and ranks and divides once. The objectives:
//!
//! - [`CausalLmMean`] (`causal_lm`): text windows, where every target weighs alike:
//!   each micro-batch's mean, averaged over the step's micro-batches;
//! - [`CausalLmPerToken`] (`causal_lm`): instruction data, whose rows differ in how
//!   many tokens are trained: the sum over the step's trained tokens divided by
//!   their number in the whole step, so the loss does not depend on how the step is
//!   split (transformers #34191);
//! - [`Classification`] (`classification`): each micro-batch's mean, and the
//!   accuracy in evaluation;
//! - [`Dpo`] (`dpo`): preference pairs (`data.kind = "preference"`), each pair's
//!   loss against a frozen [`Reference`] model (`reference`), the mean over the
//!   step's pairs, with TRL's reward and log-probability metrics;
//! - [`Grpo`] (`grpo`): scored rollouts (`data.kind = "rollouts"`), TRL's GRPO
//!   with its loss types, clipping, KL and metrics.
//!
//! They share one cross-entropy ([`cross_entropy`], on tch's `f_` functions) and,
//! with `train.loss_chunk`, compute a language model's loss a chunk of positions at
//! a time ([`chunked::summed`]): chunking is a property of the objective, which asks
//! the model for hidden states instead of logits ([`Forward`]).
//!
//! A new objective (DPO, ...) is a file of its own here implementing [`Objective`],
//! chosen in [`from_config`]. Its count need not be tokens (pairs are fine: a
//! [`Count::Units`] read from the batch on the host), and its metrics are summed
//! and divided exactly like its loss, reaching the sinks as `train/<name>` (the mean
//! over the steps since the last emission) and `eval/<name>`. The trainer needs no
//! change for it.

mod causal_lm;
mod chunked;
mod classification;
mod cross_entropy;
mod dpo;
mod forward;
mod grpo;
mod logps;
mod precompute;
mod reference;
mod scale;
mod stored;

use ptrain_plugin_api::Task;
use tch::{nn, Tensor};

pub use causal_lm::{CausalLmMean, CausalLmPerToken};
pub use classification::Classification;
pub use cross_entropy::{cross_entropy, IGNORE_INDEX};
pub use dpo::Dpo;
pub use forward::{Forward, Runner};
pub use grpo::Grpo;
pub use reference::Reference;
pub use scale::StepScale;

use crate::{
    config::{Config, DataKind},
    data::{Batch, Dataset},
    error::Result,
    model::Model,
};

/// What a micro-batch's sum is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// The sum is already a mean over the micro-batch: the step averages its
    /// micro-batches, as many on every rank (`optim.accum_steps`), so nothing is
    /// fetched ahead or counted across ranks.
    MicroBatch,
    /// Units of the batch (trained tokens, pairs), known on the host before its
    /// forward: the step divides by the units of all its micro-batches on all ranks.
    Units(u64),
}

impl Count {
    /// What evaluation adds up: one per micro-batch mean, or the units.
    pub fn value(self) -> f64 {
        match self {
            Count::MicroBatch => 1.0,
            Count::Units(n) => n as f64,
        }
    }
}

/// Named device scalars (without their `train/` or `eval/` prefix), summed and
/// divided like the loss. Empty costs nothing: no allocation.
pub type Metrics = Vec<(&'static str, Tensor)>;

/// Adds `more` to `total`, name by name (a name not there yet is appended).
pub fn add_metrics(total: &mut Metrics, more: Metrics) -> Result<()> {
    for (name, value) in more {
        match total.iter_mut().find(|(n, _)| *n == name) {
            Some((_, sum)) => *sum = sum.f_add(&value)?,
            None => total.push((name, value)),
        }
    }
    Ok(())
}

/// A micro-batch's share of the objective, before it is divided by the count.
pub struct Sum {
    /// A float scalar: the loss, with its graph when training.
    pub loss: Tensor,
    pub metrics: Metrics,
    /// Named device scalars that are already means over the micro-batch's samples
    /// (every micro-batch holds as many): the step averages them over its micro-batches
    /// and ranks, whatever the objective counts (GRPO's reward and length statistics are
    /// means over completions, as TRL reports them, under a loss counted in tokens).
    pub means: Metrics,
    /// The logits, when the objective computed them (for `AfterForward` hooks and
    /// `[debug]` dumps; `None` with a chunked loss, where they never exist whole).
    pub logits: Option<Tensor>,
}

/// What a run minimises.
pub trait Objective: Send {
    /// A short name for logs.
    fn name(&self) -> &'static str;

    /// What `batch` counts for, read from the batch alone: a step knows its divisor
    /// before its first backward.
    fn count(&self, batch: &Batch) -> Result<Count>;

    /// The micro-batch's summed loss and metrics, on the device.
    fn sum(&self, model: &mut dyn Forward, batch: &Batch, train: bool) -> Result<Sum>;

    /// Both, as evaluation adds them up.
    fn sum_and_count(&self, model: &mut dyn Forward, batch: &Batch, train: bool) -> Result<(Sum, Count)> {
        Ok((self.sum(model, batch, train)?, self.count(batch)?))
    }
}

/// The objective of a model doing `task` on the configured data: classification,
/// or a causal language model's per trained token on instruction data
/// (`data.kind = "chat"` or `"prompt_completion"`) and per micro-batch mean on
/// anything else.
pub fn from_config(config: &Config, task: Task) -> Box<dyn Objective> {
    let chunk = config.loss_chunk();
    match task {
        Task::Classification => Box::new(Classification),
        Task::LanguageModel if config.data.kind.is_instruction() => Box::new(CausalLmPerToken { chunk }),
        Task::LanguageModel => Box::new(CausalLmMean { chunk }),
    }
}

/// The run's objective: [`from_config`]'s, or DPO on preference data, whose
/// reference starts as the policy `model` does (its parameters in `vars`, built,
/// nothing restored yet).
pub fn build(config: &Config, model: &mut dyn Model, vars: &nn::VarStore, dataset: &dyn Dataset) -> Result<Box<dyn Objective>> {
    match config.data.kind {
        DataKind::Preference => Ok(Box::new(Dpo::build(config, model, vars, dataset)?)),
        DataKind::Rollouts | DataKind::Prompts => Ok(Box::new(Grpo::build(config, vars, dataset)?)),
        _ => Ok(from_config(config, model.task())),
    }
}

#[cfg(test)]
mod tests;
