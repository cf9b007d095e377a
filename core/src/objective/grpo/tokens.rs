//! Each completion token's log-probability and entropy under `logits / temperature`,
//! as TRL's GRPOTrainer takes them (its temperature is the sampling one): from a
//! forward's whole logits, with the graph of the log-probabilities; or
//! (`train.loss_chunk`) from the hidden states and the head a chunk of positions at a
//! time, without gradient (the objective then reaches the model through
//! [`super::super::chunked::summed`], see [`super`]).

use tch::{Kind, Tensor};

use super::super::{logps::Output, IGNORE_INDEX};
use crate::{
    data::Batch,
    error::{Error, Result},
    model::Head,
};

/// `[rows, T]` float32 values of a batch's positions (0 where the target is not trained).
pub struct TokenValues {
    pub logps: Tensor,
    /// Without gradient.
    pub entropy: Tensor,
}

/// The log-probabilities and entropies of `output`'s positions under `logits / temperature`.
pub fn values(output: &Output, batch: &Batch, temperature: f64) -> Result<TokenValues> {
    match output {
        Output::Logits(logits) => {
            let scaled = logits.f_to_kind(Kind::Float)?.f_div_scalar(temperature)?;
            let all = scaled.f_log_softmax(-1, Kind::Float)?;
            let (targets, mask) = targets_and_mask(&batch.targets)?;
            let logps = all.f_gather(2, &targets.f_unsqueeze(2)?, false)?.f_squeeze_dim(2)?.f_mul(&mask)?;
            let entropy = tch::no_grad(|| entropy_of(&all))?;
            Ok(TokenValues { logps, entropy })
        }
        Output::Hidden { states, head, chunk } => tch::no_grad(|| chunked(states, head, &batch.targets, *chunk, temperature)),
    }
}

/// Targets with ignored positions at id 0 (to gather), and the mask of trained ones (float).
fn targets_and_mask(targets: &Tensor) -> Result<(Tensor, Tensor)> {
    let mask = targets.f_ne(IGNORE_INDEX)?;
    Ok((targets.f_clamp_min(0)?, mask.f_to_kind(Kind::Float)?))
}

/// `-sum p log p` over the last dimension of log-probabilities.
fn entropy_of(logps: &Tensor) -> Result<Tensor> {
    Ok(logps.f_exp()?.f_mul(logps)?.f_sum_dim_intlist(Some(&[-1i64][..]), false, Kind::Float)?.f_neg()?)
}

/// [`values`] from hidden states `[rows, T, D]`, `chunk` positions at a time: the logits
/// soft-capped as the head says, then divided by the temperature.
fn chunked(states: &Tensor, head: &Head, targets: &Tensor, chunk: i64, temperature: f64) -> Result<TokenValues> {
    let width = states.size().last().copied().ok_or_else(|| Error::Other("GRPO: hidden states without a width".into()))?;
    let h = states.f_reshape([-1, width])?;
    let (y, mask) = targets_and_mask(&targets.f_reshape([-1])?)?;
    let w = head.weight.f_to_kind(h.kind())?;
    let n = h.size()[0];
    let (mut logps, mut entropy) = (Vec::new(), Vec::new());
    let mut start = 0;
    while start < n {
        let len = chunk.max(1).min(n - start);
        let logits = head.cap(h.f_narrow(0, start, len)?.f_matmul(&w.f_tr()?)?.f_to_kind(Kind::Float)?)?.f_div_scalar(temperature)?;
        let all = logits.f_log_softmax(-1, Kind::Float)?;
        let yc = y.f_narrow(0, start, len)?.f_unsqueeze(1)?;
        logps.push(all.f_gather(1, &yc, false)?.f_squeeze_dim(1)?);
        entropy.push(entropy_of(&all)?);
        start += len;
    }
    let shape = targets.size();
    let logps = Tensor::f_cat(&logps, 0)?.f_mul(&mask)?.f_view(shape.as_slice())?;
    let entropy = Tensor::f_cat(&entropy, 0)?.f_view(shape.as_slice())?;
    Ok(TokenValues { logps, entropy })
}

#[cfg(test)]
mod tests {
    use tch::Device;

    use super::*;

    #[test]
    fn chunked_values_equal_the_whole_logits_ones_at_a_temperature() {
        tch::manual_seed(11);
        let (rows, t, d, v) = (3, 7, 16, 40);
        let weight = Tensor::randn([v, d], (Kind::Float, Device::Cpu));
        let hidden = Tensor::randn([rows, t, d], (Kind::Float, Device::Cpu));
        let targets = Tensor::randint(v, [rows, t], (Kind::Int64, Device::Cpu));
        let _ = targets.narrow(1, 0, 3).fill_(IGNORE_INDEX);
        let batch = Batch {
            inputs: targets.copy(),
            targets,
            dataset_ids: None,
            segments: None,
            payload: Default::default(),
            samples: rows,
            tokens: rows * t,
        };
        let whole = values(&Output::Logits(hidden.matmul(&weight.tr())), &batch, 0.7).unwrap();
        let head = Head::plain(weight);
        let parts = values(&Output::Hidden { states: hidden, head, chunk: 4 }, &batch, 0.7).unwrap();
        assert!(whole.logps.allclose(&parts.logps, 1e-5, 1e-5, false));
        assert!(whole.entropy.allclose(&parts.entropy, 1e-5, 1e-5, false));
        assert_eq!(whole.logps.narrow(1, 0, 3).abs().sum(Kind::Float).double_value(&[]), 0.0, "untrained positions are 0");
        let cold = values(&Output::Logits(Tensor::zeros([1, 1, v], (Kind::Float, Device::Cpu))), &batch_of_one(), 0.5).unwrap();
        assert!((cold.entropy.double_value(&[0, 0]) - (v as f64).ln()).abs() < 1e-5, "uniform logits: entropy ln V");
    }

    fn batch_of_one() -> Batch {
        let t = Tensor::from_slice(&[1i64]).view([1, 1]);
        Batch { inputs: t.copy(), targets: t, dataset_ids: None, segments: None, payload: Default::default(), samples: 1, tokens: 1 }
    }
}
