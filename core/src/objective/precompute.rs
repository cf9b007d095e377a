//! `dpo.precompute_reference = true`: the reference's log-probabilities of every
//! training and held-out pair, computed once before training (in the order the
//! pairs are stored, `data.batch_size` at a time) and kept by the objective, which
//! finds a batch's by the pairs' indices its batches carry
//! ([`crate::data::Payload::Pairs`]); the reference model is freed after. The losses
//! equal the live reference's. Stored beside the token cache ([`stored`]): a later
//! run of the same pairs, model and reference reads them back and never loads the
//! reference.

use std::time::Instant;

use tch::{nn, Device, Tensor};

use super::{stored, Reference, Runner};
use crate::{
    config::{Config, Precision},
    data::{preference::PreferenceData, Dataset, Split},
    error::{Error, Result},
    model::Model,
};

/// The reference log-probabilities of every pair of `data`, `[pairs, 2]` float32
/// (chosen, rejected) on the device, the training pairs then the held-out ones: the
/// stored ones of an earlier run of the same pairs, model and reference
/// ([`stored`]), without loading the reference; else computed with the reference
/// `config` names (`policy` is the model about to be trained, its parameters in
/// `vars`, for a reference that is the policy with its adapters off), stored, and
/// the reference model freed.
pub fn precompute(config: &Config, policy: &mut dyn Model, vars: &nn::VarStore, dataset: &dyn Dataset, data: &PreferenceData) -> Result<Tensor> {
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
    let values: Vec<f32> = train.iter().chain(&val).flatten().copied().collect();
    Ok(Tensor::f_from_slice(&values)?.f_view([-1, 2])?.f_to_device(device)?)
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
            let values = reference.logps(&mut Runner { model: &mut *policy, autocast }, &batch, config.loss_chunk())?.f_to_device(Device::Cpu)?;
            let values = Vec::<f32>::try_from(&values).map_err(|e| Error::Other(format!("reading the reference log-probabilities: {e}")))?;
            let k = picks.len();
            logps.extend((0..k).map(|i| [values[i], values[k + i]]));
        }
    }
    Ok(out)
}
