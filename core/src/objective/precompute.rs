//! `dpo.precompute_reference = true`: the reference's log-probabilities of every
//! training and held-out pair, computed once before training (in the order the
//! pairs are stored, `data.batch_size` at a time) and handed to the data, whose
//! batches then carry them ([`crate::data::Batch::reference`]); the reference model
//! is freed after. The losses equal the live reference's. Stored beside the token
//! cache ([`stored`]): a later run of the same pairs, model and reference reads
//! them back and never loads the reference.

use std::time::Instant;

use tch::{nn, Device, Kind, Tensor};

use super::{stored, Forward, Reference};
use crate::{
    config::{Config, Precision},
    data::{preference::PreferenceData, Batch, Dataset, Split},
    error::{Error, Result},
    model::{Model, ModelInput, ModelOutput, Returns},
};

/// A model outside the learner run as the learner runs it (bf16 autocast when
/// `autocast` is set: `Some(true)` on CUDA), for the reference's forwards.
pub struct Bare<'a> {
    pub model: &'a mut dyn Model,
    pub autocast: Option<bool>,
}

impl Forward for Bare<'_> {
    fn forward(&mut self, batch: &Batch, train: bool) -> Result<Tensor> {
        self.output(batch, train, Returns::Logits)?.logits()
    }

    /// As the learner's: the states in bf16 under bf16 autocast.
    fn forward_hidden(&mut self, batch: &Batch, train: bool) -> Result<Option<(Tensor, crate::model::Head)>> {
        if !self.model.supports().hidden {
            return Ok(None);
        }
        match self.output(batch, train, Returns::Hidden)? {
            ModelOutput::Hidden { states, head } if self.autocast.is_some() => Ok(Some((states.f_to_kind(Kind::BFloat16)?, head))),
            ModelOutput::Hidden { states, head } => Ok(Some((states, head))),
            ModelOutput::Logits(_) => Err(Error::Other("the DPO reference returned logits when asked for hidden states".into())),
        }
    }
}

impl Bare<'_> {
    fn output(&mut self, batch: &Batch, train: bool, returns: Returns) -> Result<ModelOutput> {
        let model = &mut *self.model;
        let mut run = || model.forward(ModelInput::new(&batch.inputs, train).segments(batch.segments.as_ref()).returns(returns));
        match self.autocast {
            None => run(),
            Some(cuda) => ptrain_torch_ext::autocast_bf16(cuda, run).map_err(|e| Error::Other(format!("autocast: {e}")))?,
        }
    }
}

/// Sets the reference log-probabilities of every pair of `data` (training and
/// held-out): the stored ones of an earlier run of the same pairs, model and
/// reference ([`stored`]), without loading the reference; else computed with the
/// reference `config` names (`policy` is the model about to be trained, its
/// parameters in `vars`, for a reference that is the policy with its adapters off),
/// stored, and the reference model freed.
pub fn precompute(config: &Config, policy: &mut dyn Model, vars: &nn::VarStore, dataset: &dyn Dataset, data: &PreferenceData) -> Result<()> {
    let device = vars.device();
    let file = stored::file(config, data, device);
    let pairs = data.len(Split::Train) + data.len(Split::Val);
    let logps = match stored::read(&file, data) {
        Some(logps) => {
            tracing::info!("dpo: the reference's log-probabilities of {pairs} pairs reused from {}; the reference is not loaded", file.display());
            logps
        }
        None => {
            let started = Instant::now();
            let mut reference = Reference::build(config, vars, dataset)?;
            let logps = compute(&mut reference, policy, data, config, device)?;
            tracing::info!(
                "dpo: the reference's log-probabilities of {pairs} pairs computed in {:.2}s into {}; the reference model is freed",
                started.elapsed().as_secs_f64(),
                file.display()
            );
            if let Err(e) = stored::write(&file, &logps) {
                tracing::warn!("dpo: the reference's log-probabilities could not be stored ({e}); a later run computes them again");
            }
            logps
        }
    };
    let [train, val] = logps;
    data.set_reference(Split::Train, train)?;
    data.set_reference(Split::Val, val)
}

/// The reference log-probabilities of every pair of `data`, training then
/// held-out, `data.batch_size` pairs at a time.
fn compute(reference: &mut Reference, policy: &mut dyn Model, data: &PreferenceData, config: &Config, device: Device) -> Result<[Vec<[f32; 2]>; 2]> {
    let autocast = (config.train.precision == Precision::Bf16).then_some(device.is_cuda());
    let size = config.data.batch_size.max(1) as usize;
    let mut out: [Vec<[f32; 2]>; 2] = Default::default();
    for (split, logps) in [Split::Train, Split::Val].into_iter().zip(out.iter_mut()) {
        let n = data.len(split);
        for start in (0..n).step_by(size) {
            let picks: Vec<usize> = (start..(start + size).min(n)).collect();
            let batch = data.batch_of(split, &picks)?.to_device(device, false);
            let values = reference.logps(&mut Bare { model: &mut *policy, autocast }, &batch, config.loss_chunk())?.f_to_device(Device::Cpu)?;
            let values = Vec::<f32>::try_from(&values).map_err(|e| Error::Other(format!("reading the reference log-probabilities: {e}")))?;
            let k = picks.len();
            logps.extend((0..k).map(|i| [values[i], values[k + i]]));
        }
    }
    Ok(out)
}
