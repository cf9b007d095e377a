//! GRPO's per-token loss and its normalisations, TRL 1.16's `GRPOTrainer._compute_loss`
//! (`importance_sampling_level = "token"`): with `r = exp(logp - old_logp)`,
//!
//! - `loss_t = -min(r A, clamp(r, 1 - epsilon, 1 + epsilon_high) A)`;
//! - with `beta > 0`, `+ beta * kl_t`, `kl_t = exp(ref - logp) - (ref - logp) - 1` (k3),
//!   times `r` with `use_bias_correction_kl`;
//! - summed over a micro-batch's completion tokens (`dapo`, `dr_grpo`; the step divides by
//!   its tokens, or by completions times `max_completion_length`), or each completion's
//!   token mean summed (`grpo`, divided by the step's completions), or the micro-batch's
//!   token mean (`bnpo`, averaged over micro-batches).
//!
//! The metrics are TRL's, as masked means over the completion tokens times what the
//! micro-batch counts for, so that dividing by the step's count gives the step's mean.

use tch::{Kind, Tensor};

use super::super::Metrics;
use crate::{config::GrpoLoss, error::Result};

/// What a micro-batch's loss is computed from: `[B, T]` tensors (the mask float).
pub struct Inputs<'a> {
    pub logps: &'a Tensor,
    pub old: &'a Tensor,
    pub reference: Option<&'a Tensor>,
    pub entropy: &'a Tensor,
    /// `[B]`.
    pub advantages: &'a Tensor,
    pub mask: &'a Tensor,
}

pub struct Settings {
    pub loss: GrpoLoss,
    pub epsilon_low: f64,
    pub epsilon_high: f64,
    pub beta: f64,
    pub bias_correction_kl: bool,
}

/// The micro-batch's summed loss and TRL's metrics, `weight` being what it counts for.
pub fn loss_and_metrics(s: &Settings, x: &Inputs, weight: f64) -> Result<(Tensor, Metrics)> {
    let advantages = x.advantages.f_unsqueeze(1)?;
    let ratio = x.logps.f_sub(x.old)?.f_exp()?;
    let clipped = ratio.f_clamp(1.0 - s.epsilon_low, 1.0 + s.epsilon_high)?;
    let mut per_token = ratio.f_mul(&advantages)?.f_minimum(&clipped.f_mul(&advantages)?)?.f_neg()?;
    let mut kl = None;
    if let (Some(reference), true) = (x.reference, s.beta != 0.0) {
        let delta = reference.f_sub(x.logps)?;
        let mut k3 = delta.f_exp()?.f_sub(&delta)?.f_sub_scalar(1.0)?;
        if s.bias_correction_kl {
            k3 = k3.f_mul(&ratio)?;
        }
        per_token = per_token.f_add(&k3.f_mul_scalar(s.beta)?)?;
        kl = Some(k3);
    }
    let masked = per_token.f_mul(x.mask)?;
    let sum = |t: &Tensor| t.f_sum(Kind::Float);
    let loss = match s.loss {
        GrpoLoss::Dapo | GrpoLoss::DrGrpo => sum(&masked)?,
        GrpoLoss::Grpo => {
            let per_row = x.mask.f_sum_dim_intlist(Some(&[1i64][..]), false, Kind::Float)?.f_clamp_min(1.0)?;
            sum(&masked.f_sum_dim_intlist(Some(&[1i64][..]), false, Kind::Float)?.f_div(&per_row)?)?
        }
        GrpoLoss::Bnpo => sum(&masked)?.f_div(&sum(x.mask)?.f_clamp_min(1.0)?)?,
    };
    let metrics = tch::no_grad(|| -> Result<Metrics> {
        let tokens = sum(x.mask)?.f_clamp_min(1.0)?;
        let mean = |t: &Tensor| -> Result<Tensor> { Ok(sum(&t.f_mul(x.mask)?)?.f_div(&tokens)?.f_mul_scalar(weight)?) };
        let float = |t: Tensor| t.f_to_kind(Kind::Float);
        let low = ratio.f_lt(1.0 - s.epsilon_low)?.f_logical_and(&advantages.f_lt(0.0)?)?;
        let high = ratio.f_gt(1.0 + s.epsilon_high)?.f_logical_and(&advantages.f_gt(0.0)?)?;
        let region = low.f_logical_or(&high)?;
        let mut metrics = vec![
            ("entropy", mean(x.entropy)?),
            ("clip_ratio/low_mean", mean(&float(low)?)?),
            ("clip_ratio/high_mean", mean(&float(high)?)?),
            ("clip_ratio/region_mean", mean(&float(region)?)?),
        ];
        if let Some(kl) = kl {
            metrics.push(("kl", mean(&kl)?));
        }
        Ok(metrics)
    })?;
    Ok((loss, metrics))
}

#[cfg(test)]
mod tests {
    use tch::Device;

    use super::*;

    fn settings(loss: GrpoLoss) -> Settings {
        Settings { loss, epsilon_low: 0.2, epsilon_high: 0.2, beta: 0.0, bias_correction_kl: true }
    }

    /// On-policy (old = logp), dapo: loss = -sum_i A_i |o_i| (the step divides by sum |o_i|).
    #[test]
    fn on_policy_dapo_is_minus_the_advantages_times_the_completion_lengths() {
        let logps = Tensor::randn([3, 5], (Kind::Float, Device::Cpu));
        let mask = Tensor::from_slice(&[1f32, 1., 1., 0., 0., 1., 0., 0., 0., 0., 1., 1., 1., 1., 1.]).view([3, 5]);
        let advantages = Tensor::from_slice(&[0.5f32, -1.0, 2.0]);
        let entropy = logps.zeros_like();
        let x = Inputs { logps: &logps, old: &logps, reference: None, entropy: &entropy, advantages: &advantages, mask: &mask };
        let (loss, metrics) = loss_and_metrics(&settings(GrpoLoss::Dapo), &x, 9.0).unwrap();
        let expected = -(0.5 * 3.0 - 1.0 * 1.0 + 2.0 * 5.0);
        assert!((loss.double_value(&[]) - expected).abs() < 1e-6, "{loss} vs {expected}");
        assert!(metrics.iter().all(|(n, v)| n.starts_with("entropy") || v.double_value(&[]) == 0.0), "nothing clipped on-policy");
        // grpo: each completion's mean: -(0.5 - 1 + 2).
        let (loss, _) = loss_and_metrics(&settings(GrpoLoss::Grpo), &x, 3.0).unwrap();
        assert!((loss.double_value(&[]) + 1.5).abs() < 1e-6);
        let (loss, _) = loss_and_metrics(&settings(GrpoLoss::Bnpo), &x, 1.0).unwrap();
        assert!((loss.double_value(&[]) - expected / 9.0).abs() < 1e-6);
    }

    #[test]
    fn the_ratio_is_clipped_where_it_would_gain_and_the_kl_is_k3() {
        let old = Tensor::zeros([1, 2], (Kind::Float, Device::Cpu));
        let logps = Tensor::from_slice(&[0.5f32, -0.5]).view([1, 2]);
        let mask = Tensor::ones([1, 2], (Kind::Float, Device::Cpu));
        let advantages = Tensor::from_slice(&[1f32]);
        let reference = Tensor::zeros([1, 2], (Kind::Float, Device::Cpu));
        let x = Inputs { logps: &logps, old: &old, reference: Some(&reference), entropy: &old, advantages: &advantages, mask: &mask };
        let s = Settings { beta: 0.1, bias_correction_kl: false, ..settings(GrpoLoss::Dapo) };
        let (loss, metrics) = loss_and_metrics(&s, &x, 2.0).unwrap();
        let (r1, r2) = (0.5f64.exp(), (-0.5f64).exp());
        let k3 = |d: f64| d.exp() - d - 1.0;
        let expected = -(1.2f64.min(r1)) - r2 + 0.1 * (k3(-0.5) + k3(0.5));
        assert!((loss.double_value(&[]) - expected).abs() < 1e-5, "{loss} vs {expected}");
        let get = |name: &str| metrics.iter().find(|(n, _)| *n == name).unwrap().1.double_value(&[]);
        assert_eq!(get("clip_ratio/high_mean"), 1.0, "one of two tokens, times the weight 2");
        assert_eq!(get("clip_ratio/low_mean"), 0.0, "a low ratio with a positive advantage is not clipped");
        assert!((get("kl") - (k3(-0.5) + k3(0.5))).abs() < 1e-5);
    }
}
