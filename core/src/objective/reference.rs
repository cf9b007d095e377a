//! DPO's reference model: what the policy's log-probabilities are compared with.
//! Frozen (no gradient, no optimizer state), run without autograd, and under
//! `train.precision = "bf16"` stored in bf16. It is `dpo.reference` (a Hugging Face
//! directory or a ptrain checkpoint or run directory), or else the starting model:
//! with `[lora]`, the policy itself with its adapters switched off (no second copy
//! of the weights); otherwise `model.init_from` loaded again (a resumed run's policy
//! is no longer the starting model), or a copy of the policy's initial weights when
//! they are random.

use std::path::Path;

use tch::{nn, Tensor};

use super::{logps::Output, Forward, Runner};
use crate::{
    config::{Config, Precision},
    data::{Batch, Dataset},
    error::{Error, Result},
    model::{self, lora, pretrained::Pretrained, Model},
};

pub enum Reference {
    /// A model of its own.
    Model {
        model: Box<dyn Model>,
        /// Holds the model's (frozen) parameters.
        _vars: nn::VarStore,
        /// bf16 autocast on CUDA (`Some(true)`) or the CPU (`Some(false)`), as the policy runs.
        autocast: Option<bool>,
    },
    /// The LoRA policy with its adapters off: its base model.
    Adapters,
}

impl Reference {
    /// The reference `config` names, on the device of the policy's `policy` store
    /// (built from `config` before any checkpoint is restored into it).
    pub fn build(config: &Config, policy: &nn::VarStore, dataset: &dyn Dataset) -> Result<Reference> {
        Reference::named(config, "dpo", &config.dpo.reference, policy, dataset)
    }

    /// The reference `reference` names (`what`'s: `dpo`, `grpo`), as [`Reference::build`].
    pub fn named(config: &Config, what: &str, reference: &str, policy: &nn::VarStore, dataset: &dyn Dataset) -> Result<Reference> {
        if config.lora().is_some() && reference.is_empty() {
            tracing::info!("{what}: reference = the base model (the policy with its LoRA adapters off)");
            return Ok(Reference::Adapters);
        }
        let device = policy.device();
        let (model, mut vars) = match reference {
            "" => {
                let mut base = config.clone();
                base.lora = None;
                let vars = nn::VarStore::new(device);
                let model = model::build(&base, &vars, dataset)?;
                if config.model.init_from.is_empty() {
                    let mut copy = vars;
                    copy.copy(policy).map_err(|e| Error::Other(format!("{what}.reference: copying the starting model: {e}")))?;
                    (model, copy)
                } else {
                    (model, vars)
                }
            }
            path => {
                let pretrained = Pretrained::open(Path::new(path), device)?;
                let (theirs, ours) = (pretrained.config.model.vocab_size, config.model.vocab_size);
                if theirs != ours {
                    return Err(Error::Data {
                        path: path.into(),
                        message: format!(
                            "{what}.reference has a vocabulary of {theirs} tokens, the policy {ours}: it must be the same model family and tokenizer"
                        ),
                    });
                }
                (pretrained.model, pretrained.vars)
            }
        };
        vars.freeze();
        let bf16 = config.train.precision == Precision::Bf16;
        if bf16 {
            vars.bfloat16();
        }
        tracing::info!(
            "{what}: reference {} ({} parameters{}, frozen)",
            if reference.is_empty() { "= the starting model" } else { reference },
            vars.variables().values().map(|t| t.numel()).sum::<usize>(),
            if bf16 { ", bf16" } else { "" }
        );
        Ok(Reference::Model { model, _vars: vars, autocast: bf16.then_some(device.is_cuda()) })
    }

    /// Each completion's summed log-probability of `batch`'s targets, without
    /// autograd (`policy` is the model trained, whose adapters may be switched off),
    /// `chunk` positions at a time from hidden states when `chunk > 0`.
    pub fn logps(&mut self, policy: &mut dyn Forward, batch: &Batch, chunk: i64) -> Result<Tensor> {
        self.run(policy, |model| Output::of(model, batch, false, chunk)?.completion_logps(batch))
    }

    /// `f` of the reference model, without autograd (`policy` is the model trained,
    /// whose adapters may be switched off).
    pub fn run<R>(&mut self, policy: &mut dyn Forward, f: impl FnOnce(&mut dyn Forward) -> Result<R>) -> Result<R> {
        tch::no_grad(|| match self {
            Reference::Adapters => lora::without_adapters(|| f(policy)),
            Reference::Model { model, autocast, .. } => f(&mut Runner { model: model.as_mut(), autocast: *autocast }),
        })
    }
}
