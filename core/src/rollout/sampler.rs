//! Batched sampling on the key/value cache for the rollout stage: all of a micro-batch's
//! rows in one batch, whatever their prompt lengths. The prompts are left-padded to the
//! longest ([`KvCache::pad_left`](crate::model::KvCache::pad_left): no row attends to its
//! pads, each row's positions count from its first token, as transformers' `generate`
//! with its left padding), so one prefill of `[R, P]` ends every row's prompt at the same
//! column and one forward of `[R, 1]` per new token decodes them all. A finished row
//! keeps being decoded with the others (its tokens after EOS are cut on the host at the
//! end): the batch does not shrink, which would copy every layer's cache for the rows left.
//!
//! The host waits on the device only to stop early: every [`CHECK_EVERY`] tokens it
//! reads whether every row has produced an EOS. Tokens, their log-probabilities and
//! the finished flags stay on the device until then.

use tch::{Device, Kind, Tensor};

use super::processors::Processors;
use crate::{
    error::{Error, Result},
    model::{KvCache, Model, ModelInput},
};

/// Tokens between two reads of "every row has ended" (the one host sync of decoding).
pub const CHECK_EVERY: usize = 8;

/// One sampled completion, cut after its first EOS (kept).
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub ids: Vec<u32>,
    /// Each token's log-probability under the processed distribution it was drawn from.
    pub logps: Vec<f32>,
}

/// Samples `generations` completions of each of `prompts` (of any lengths) with
/// `model`, a prompt's completions one after the other. Each prompt is prefilled once
/// and its cache rows repeated for its completions (GRPO's completions of a prompt share
/// it: a prefill of every row would compute each prompt `generations` times).
pub fn sample(
    model: &mut dyn Model,
    prompts: &[&[u32]],
    generations: usize,
    processors: &Processors,
    max_new: usize,
    eos: u32,
    device: Device,
) -> Result<Vec<Sampled>> {
    if prompts.iter().any(|p| p.is_empty()) {
        return Err(Error::Other("the sampler's prompts are not empty".into()));
    }
    let (width, times) = (prompts.iter().map(|p| p.len()).max().unwrap_or(0) as i64, generations as i64);
    let rows = prompts.len() as i64 * times;
    let mut cache = model
        .new_cache(width + max_new as i64)
        .ok_or_else(|| Error::Other(format!("model.kind {:?} has no key/value cache to sample with", model.kind())))?;
    let pads: Vec<i64> = prompts.iter().map(|p| width - p.len() as i64).collect();
    if pads.iter().any(|&p| p > 0) {
        cache.pad_left(&pads, device)?;
    }
    // A row's pads repeat its first token: they are masked out of attention, and the
    // repetition penalty's `seen` (scattered from the padded prompt) holds only its tokens.
    let flat: Vec<i64> =
        prompts.iter().zip(&pads).flat_map(|(p, &n)| std::iter::repeat_n(p[0], n as usize).chain(p.iter().copied()).map(i64::from)).collect();
    let prompt = Tensor::f_from_slice(&flat)?.f_view([prompts.len() as i64, width])?.f_to_device(device)?;
    let mut logits = last_logits(model, &mut cache, &prompt)?.f_repeat_interleave_self_int(times, 0, None)?;
    cache.repeat_rows(times)?;
    let vocab = logits.size()[1];
    let mut seen = Tensor::f_zeros([prompts.len() as i64, vocab], (Kind::Bool, device))?
        .f_scatter_value(1, &prompt, 1)?
        .f_repeat_interleave_self_int(times, 0, None)?;
    let mut done = Tensor::f_zeros([rows], (Kind::Bool, device))?;
    let (mut tokens, mut logps) = (Vec::with_capacity(max_new), Vec::with_capacity(max_new));
    for n in 1..=max_new {
        let scores = processors.apply(&logits, &seen)?;
        let logp = scores.f_log_softmax(-1, Kind::Float)?;
        let next = logp.f_exp()?.f_multinomial(1, false)?;
        logps.push(logp.f_gather(1, &next, false)?);
        let _ = seen.f_scatter_value_(1, &next, 1)?;
        done = done.f_logical_or(&next.f_squeeze_dim(1)?.f_eq(eos as i64)?)?;
        tokens.push(next.shallow_clone());
        if n == max_new || (n % CHECK_EVERY == 0 && done.f_all()?.f_int64_value(&[])? != 0) {
            break;
        }
        logits = last_logits(model, &mut cache, &next)?;
    }
    let ids = Vec::<Vec<i64>>::try_from(Tensor::f_cat(&tokens, 1)?.f_to_device(Device::Cpu)?)?;
    let logps = Vec::<Vec<f32>>::try_from(Tensor::f_cat(&logps, 1)?.f_to_device(Device::Cpu)?)?;
    Ok(ids.into_iter().zip(logps).map(|(ids, logps)| cut_after_eos(&ids, &logps, eos)).collect())
}

/// The float32 logits `[R, V]` of the last of `input`'s positions after those `cache` holds.
fn last_logits(model: &mut dyn Model, cache: &mut KvCache, input: &Tensor) -> Result<Tensor> {
    let logits = tch::no_grad(|| model.forward(ModelInput::new(input, false).cache(cache))?.logits())?;
    Ok(logits.f_select(1, -1)?.f_to_kind(Kind::Float)?)
}

/// A row's tokens up to its first EOS (kept), with their log-probabilities.
fn cut_after_eos(ids: &[i64], logps: &[f32], eos: u32) -> Sampled {
    let end = ids.iter().position(|&t| t == eos as i64).map_or(ids.len(), |i| i + 1);
    Sampled { ids: ids[..end].iter().map(|&t| t as u32).collect(), logps: logps[..end].to_vec() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_completion_is_cut_after_its_first_eos() {
        let cut = cut_after_eos(&[5, 2, 7, 2], &[-1.0, -2.0, -3.0, -4.0], 2);
        assert_eq!(cut, Sampled { ids: vec![5, 2], logps: vec![-1.0, -2.0] });
        assert_eq!(cut_after_eos(&[5, 6], &[-1.0, -2.0], 2).ids, [5, 6], "no EOS: truncated, kept whole");
    }
}
