//! A batch of groups' advantages and reward statistics, on the host, as TRL 1.16's
//! `GRPOTrainer._generate_and_score_completions` computes them (its default
//! `multi_objective_aggregation = "sum_then_normalize"`): each completion's reward is
//! the weighted sum of its functions' rewards, NaN (TRL's `None`) left out of the sum,
//! NaN when every function gave none; the advantage is the reward minus its group's
//! mean, divided by the group's (`scale_rewards = "group"`) or the batch's (`"batch"`)
//! standard deviation plus 1e-4, or not divided (`"none"`); a NaN advantage is 0.
//! Means and standard deviations leave NaN out; the standard deviation is Bessel's
//! (NaN below two values).

use crate::config::ScaleRewards;

/// The mean of the values that are not NaN (NaN when none is).
pub fn nanmean(values: impl IntoIterator<Item = f64>) -> f64 {
    let (sum, n) = values.into_iter().filter(|v| !v.is_nan()).fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    if n == 0 {
        f64::NAN
    } else {
        sum / n as f64
    }
}

/// The standard deviation (n - 1) of the values that are not NaN, as TRL's `nanstd`.
pub fn nanstd(values: &[f64]) -> f64 {
    let mean = nanmean(values.iter().copied());
    let kept: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    if kept.len() < 2 {
        return f64::NAN;
    }
    let variance = kept.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / kept.len() as f64;
    (variance * kept.len() as f64 / (kept.len() - 1) as f64).sqrt()
}

/// A batch's completions scored: `rewards[f][i]`, completion `i` of the batch (whole
/// groups of `generations`, in order) by reward function `f`.
pub struct Scored {
    /// Each completion's weighted reward (NaN: no function scored it).
    pub rewards: Vec<f64>,
    pub advantages: Vec<f64>,
    /// The fraction of completions whose standard deviation (group's or batch's) is 0.
    pub frac_zero_std: f64,
}

/// The advantages of a batch whose completions the functions scored `rewards[f][i]`.
pub fn score(rewards: &[Vec<f64>], weights: &[f64], generations: usize, scale: ScaleRewards) -> Scored {
    let n = rewards.first().map_or(0, Vec::len);
    let weighted: Vec<f64> = (0..n)
        .map(|i| {
            let given: Vec<f64> = rewards.iter().zip(weights).map(|(r, w)| r[i] * w).filter(|v| !v.is_nan()).collect();
            if given.is_empty() {
                f64::NAN
            } else {
                given.iter().sum()
            }
        })
        .collect();
    let groups: Vec<&[f64]> = weighted.chunks(generations.max(1)).collect();
    let batch_std = nanstd(&weighted);
    let mut advantages = Vec::with_capacity(n);
    let mut zero_std = 0usize;
    for group in &groups {
        let mean = nanmean(group.iter().copied());
        let std = match scale {
            ScaleRewards::Batch => batch_std,
            _ => nanstd(group),
        };
        // torch.isclose(std, 0): |std| <= 1e-8 (NaN is not close).
        let is_zero = std.abs() <= 1e-8;
        for &r in group.iter() {
            let centred = r - mean;
            let a = if scale == ScaleRewards::None { centred } else { centred / (std + 1e-4) };
            advantages.push(if a.is_nan() { 0.0 } else { a });
            zero_std += is_zero as usize;
        }
    }
    Scored { rewards: weighted, advantages, frac_zero_std: zero_std as f64 / n.max(1) as f64 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advantages_are_centred_per_group_and_scaled_as_trl_scales_them() {
        let rewards = vec![vec![1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 4.0]];
        let s = score(&rewards, &[1.0], 4, ScaleRewards::Group);
        let group_std = nanstd(&[1.0, 0.0, 0.0, 0.0]);
        assert!((s.advantages[0] - 0.75 / (group_std + 1e-4)).abs() < 1e-12);
        assert!((s.advantages[..4].iter().sum::<f64>()).abs() < 1e-12, "centred on the first group's mean");
        assert!((s.advantages[4..].iter().sum::<f64>()).abs() < 1e-12, "centred on the second group's mean");
        let none = score(&rewards, &[1.0], 4, ScaleRewards::None);
        assert_eq!(none.advantages[4..], [-0.5, -0.5, -0.5, 1.5]);
        let batch = score(&rewards, &[1.0], 4, ScaleRewards::Batch);
        assert!((batch.advantages[7] - 1.5 / (nanstd(&rewards[0]) + 1e-4)).abs() < 1e-12);
    }

    #[test]
    fn a_missing_reward_is_left_out_and_an_unscored_completion_gets_no_advantage() {
        let nan = f64::NAN;
        let rewards = vec![vec![1.0, nan, 3.0, 5.0], vec![nan, nan, 1.0, 1.0]];
        let s = score(&rewards, &[1.0, 2.0], 2, ScaleRewards::None);
        assert_eq!(s.rewards[0], 1.0);
        assert!(s.rewards[1].is_nan());
        assert_eq!(s.rewards[2..], [5.0, 7.0]);
        assert_eq!(s.advantages, [0.0, 0.0, -1.0, 1.0], "the unscored one is out of its group's mean, with advantage 0");
        let same = score(&[vec![2.0, 2.0, 1.0, 3.0]], &[1.0], 2, ScaleRewards::Group);
        assert_eq!(same.frac_zero_std, 0.5);
    }
}
