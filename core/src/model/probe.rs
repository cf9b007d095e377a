//! One forward pass outside training (`ptrain logits`): a debugging and testing
//! aid that shows what ptrain's model computes on one batch, so it can be compared
//! with another implementation (the Hugging Face tests compare it with
//! `transformers`).

use std::path::Path;

use tch::{nn, Device, Kind, Reduction, Tensor};

use crate::{
    config::Config,
    data::{BatchKey, Split},
    error::{Error, Result},
    objective::cross_entropy,
};

/// Which batch to run.
pub enum ProbeBatch {
    /// The batch the trainer draws: `Split::Train` at step `step` (1 = the first
    /// micro-batch of the first step), or `Split::Val` (`step` 0.. = the evaluation
    /// batches), for rank 0.
    Drawn { split: Split, step: u64 },
    /// Given token ids `[B, T]` (and, optionally, targets for a loss).
    Given { inputs: Tensor, targets: Option<Tensor> },
}

impl ProbeBatch {
    /// `Given`, from a safetensors file with int64 `inputs` and optional `targets`.
    pub fn from_file(path: &Path) -> Result<ProbeBatch> {
        if !path.is_file() {
            return Err(Error::MissingFile { what: "inputs file", path: path.to_owned() });
        }
        let bad = |message: String| Error::Data { path: path.to_owned(), message };
        let mut named: std::collections::HashMap<String, Tensor> =
            Tensor::read_safetensors(path).map_err(|e| bad(format!("not a safetensors file: {e}")))?.into_iter().collect();
        let inputs = named.remove("inputs").ok_or_else(|| bad("no `inputs` tensor".into()))?;
        if inputs.dim() != 2 || inputs.kind() != Kind::Int64 {
            return Err(bad(format!("`inputs` must be int64 [B, T], not {:?} {:?}", inputs.kind(), inputs.size())));
        }
        Ok(ProbeBatch::Given { inputs, targets: named.remove("targets").map(|t| t.to_kind(Kind::Int64)) })
    }
}

pub struct Probe {
    pub inputs: Tensor,
    pub targets: Option<Tensor>,
    pub logits: Tensor,
    /// Mean cross-entropy over the targets, when there are any.
    pub loss: Option<Tensor>,
    /// The model's auxiliary loss terms (a mixture's `aux_loss`, unweighted), if it has any.
    pub aux: Vec<(&'static str, Tensor)>,
}

impl Probe {
    /// `inputs`, `targets`, `logits` and `loss` (fp32 scalar) in a safetensors file.
    pub fn write(&self, path: &Path) -> Result<()> {
        let mut named: Vec<(&str, Tensor)> = vec![("inputs", self.inputs.shallow_clone()), ("logits", self.logits.to_kind(Kind::Float))];
        if let Some(t) = &self.targets {
            named.push(("targets", t.shallow_clone()));
        }
        if let Some(l) = &self.loss {
            named.push(("loss", l.to_kind(Kind::Float)));
        }
        // `aux_loss` and `z_loss` beside the loss (the experts' loads are training metrics).
        named.extend(self.aux.iter().filter(|(n, _)| !n.contains('/')).map(|(n, t)| (*n, t.to_kind(Kind::Float))));
        Tensor::write_safetensors(&named, path)?;
        Ok(())
    }
}

/// Builds the configured model on the CPU as the trainer does (same seed, same
/// initialisation, `model.init_from` included), optionally with the weights of a
/// ptrain checkpoint, and runs it in evaluation mode on one batch.
pub fn probe(config: &Config, checkpoint: Option<&Path>, batch: ProbeBatch) -> Result<Probe> {
    tch::manual_seed(config.run.seed as i64);
    let dataset = crate::data::from_config(config)?;
    let vs = nn::VarStore::new(Device::Cpu);
    let mut model = super::build(config, &vs, dataset.as_ref())?;
    if let Some(dir) = checkpoint {
        load_checkpoint_weights(&vs, dir)?;
        // A LoRA checkpoint's adapters over a base (`--set model.init_from=` after a move):
        // only the one they were trained on.
        if config.lora().is_some() {
            super::adapters::check_base(&vs, &super::hf::resolve_checkpoint(dir)?, Path::new(&config.model.init_from))?;
        }
    }
    let (inputs, targets) = match batch {
        ProbeBatch::Drawn { split, step } => {
            let count = config.data.batch_size as u64;
            // Held-out data is read in order: evaluation batch `step` starts at sample step x batch_size.
            let stream = if split == Split::Val { step * count } else { 0 };
            let b = dataset.batch(split, BatchKey { step, micro: 0, first_sample: 0, count, stream })?;
            (b.inputs, Some(b.targets))
        }
        ProbeBatch::Given { inputs, targets } => (inputs, targets),
    };
    let logits = tch::no_grad(|| model.forward(super::ModelInput::new(&inputs, false))?.logits())?;
    let loss = targets.as_ref().map(|t| tch::no_grad(|| cross_entropy(&logits, t, Reduction::Mean))).transpose()?;
    let aux = model.take_aux_loss().map(|a| a.metrics).unwrap_or_default();
    Ok(Probe { inputs, targets, logits, loss, aux })
}

/// Copies a ptrain checkpoint's `model.safetensors` into every trainable variable of
/// `vs` (with LoRA, the adapters: the frozen base is not in checkpoints).
pub(crate) fn load_checkpoint_weights(vs: &nn::VarStore, dir: &Path) -> Result<()> {
    let dir = super::hf::resolve_checkpoint(dir)?;
    let (_, saved) = ptrain_checkpoint::read_model(&dir).map_err(|e| Error::Checkpoint { path: dir.clone(), message: e.to_string() })?;
    let path = dir.join(ptrain_checkpoint::MODEL_FILE);
    tch::no_grad(|| -> Result<()> {
        for (name, mut var) in vs.variables().into_iter().filter(|(_, v)| v.requires_grad()) {
            let t = saved.get(&name).ok_or_else(|| Error::Checkpoint { path: path.clone(), message: format!("no weights for `{name}`") })?;
            if t.shape != var.size() {
                let message = format!("`{name}` has shape {:?}, the model {:?}", t.shape, var.size());
                return Err(Error::Checkpoint { path: path.clone(), message });
            }
            let t = Tensor::f_from_data_size(&t.data, &t.shape, t.dtype.kind())?;
            var.f_copy_(&t.to_kind(var.kind()))?;
        }
        Ok(())
    })
}
