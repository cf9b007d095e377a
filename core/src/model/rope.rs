//! Rotary position embeddings as `transformers` computes them for Llama, Qwen2/3 and
//! Mistral: the `rotate_half` convention (element i of a head's first half turns
//! with element i of its second half, not adjacent pairs), inverse frequencies and
//! cos/sin in float32, and Llama 3.1's `llama3` rescaling of long wavelengths.

use tch::{Device, Kind, Tensor};

use crate::config::{LlamaArgs, RopeScaling};

/// cos and sin of every position up to the model's context, `[positions, head_dim]`,
/// float32, on the model's device: computed once, narrowed per forward.
#[derive(Debug)]
pub struct Rope {
    cos: Tensor,
    sin: Tensor,
}

/// `1 / theta^(2i/d)` for `i < d/2`, float32 (`transformers`'
/// `_compute_default_rope_parameters`).
pub fn default_frequencies(theta: f64, head_dim: i64, device: Device) -> Tensor {
    let exponents = Tensor::arange_start_step(0, head_dim, 2, (Kind::Int64, device)).to_kind(Kind::Float) / head_dim as f64;
    Tensor::pow_scalar(theta, &exponents).reciprocal()
}

/// [`default_frequencies`] of `rope_theta`, then `llama3` scaling if asked for
/// (`transformers`' `_compute_llama3_parameters`).
pub fn inverse_frequencies(args: &LlamaArgs, head_dim: i64, device: Device) -> Tensor {
    let inv_freq = default_frequencies(args.rope_theta, head_dim, device);
    match args.rope_scaling {
        RopeScaling::None => inv_freq,
        RopeScaling::Llama3 => {
            let (factor, low, high) = (args.rope_factor, args.rope_low_freq_factor, args.rope_high_freq_factor);
            let old_context = args.rope_original_max_positions as f64;
            let (low_wavelen, high_wavelen) = (old_context / low, old_context / high);
            let wavelen = inv_freq.full_like(2.0 * std::f64::consts::PI) / &inv_freq;
            // Long wavelengths are divided by `factor`, short ones kept, and the band
            // between interpolated smoothly.
            let scaled = inv_freq.where_self(&wavelen.le(low_wavelen), &(&inv_freq / factor));
            let smooth = (wavelen.full_like(old_context) / &wavelen - low) / (high - low);
            let smoothed: Tensor = (-&smooth + 1.0) * &scaled / factor + &smooth * &scaled;
            let medium = wavelen.ge(high_wavelen).logical_and(&wavelen.le(low_wavelen));
            smoothed.where_self(&medium, &scaled)
        }
    }
}

impl Rope {
    pub fn new(args: &LlamaArgs, head_dim: i64, positions: i64, device: Device) -> Rope {
        Rope::of(&inverse_frequencies(args, head_dim, device), positions)
    }

    /// The tables of `positions` positions turning at `inv_freq` (`[head_dim / 2]`).
    pub fn of(inv_freq: &Tensor, positions: i64) -> Rope {
        let t = Tensor::arange(positions, (Kind::Int64, inv_freq.device())).to_kind(Kind::Float);
        let freqs = t.unsqueeze(1) * inv_freq.unsqueeze(0);
        let emb = Tensor::cat(&[&freqs, &freqs], -1);
        Rope { cos: emb.cos(), sin: emb.sin() }
    }

    /// The positions the tables cover.
    pub fn positions(&self) -> i64 {
        self.cos.size()[0]
    }

    /// cos and sin of positions `[start, start + len)` in `kind`, shaped to broadcast
    /// over `[B, heads, len, head_dim]`.
    pub fn window(&self, start: i64, len: i64, kind: Kind) -> Result<(Tensor, Tensor), tch::TchError> {
        let take = |t: &Tensor| t.f_narrow(0, start, len)?.f_to_kind(kind);
        Ok((take(&self.cos)?, take(&self.sin)?))
    }
}

impl Rope {
    /// cos and sin of each of `positions` `[B, T]` (packed rows restart at 0), in
    /// `kind`, shaped `[B, 1, T, head_dim]` to broadcast over the heads.
    pub fn at(&self, positions: &Tensor, kind: Kind) -> Result<(Tensor, Tensor), tch::TchError> {
        let (b, t) = positions.size2()?;
        let flat = positions.f_reshape([-1])?;
        let take = |table: &Tensor| table.f_index_select(0, &flat)?.f_view([b, 1, t, -1])?.f_to_kind(kind);
        Ok((take(&self.cos)?, take(&self.sin)?))
    }
}

/// `x * cos + rotate_half(x) * sin` for `x` of shape `[B, heads, T, head_dim]`.
pub fn apply(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor, tch::TchError> {
    let half = x.size()[3] / 2;
    let (x1, x2) = (x.f_narrow(3, 0, half)?, x.f_narrow(3, half, half)?);
    let rotated = Tensor::f_cat(&[&x2.f_neg()?, &x1], -1)?;
    x.f_mul(cos)?.f_add(&rotated.f_mul(sin)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn args() -> LlamaArgs {
        Config::default().model.llama
    }

    #[test]
    fn default_frequencies_are_theta_to_the_minus_two_i_over_d() {
        let inv = inverse_frequencies(&args(), 8, Device::Cpu);
        let got: Vec<f32> = Vec::try_from(&inv).unwrap();
        for (i, g) in got.iter().enumerate() {
            let want = 1.0 / 10000f64.powf(2.0 * i as f64 / 8.0);
            assert!((*g as f64 - want).abs() < 1e-7 * want.max(1e-3), "{i}: {g} vs {want}");
        }
    }

    #[test]
    fn llama3_scaling_divides_long_wavelengths_and_keeps_short_ones() {
        let mut a = args();
        (a.rope_theta, a.rope_scaling, a.rope_factor, a.rope_low_freq_factor, a.rope_high_freq_factor, a.rope_original_max_positions) =
            (500000.0, RopeScaling::Llama3, 8.0, 1.0, 4.0, 64);
        let plain: Vec<f32> = Vec::try_from(&inverse_frequencies(&args_with_theta(500000.0), 16, Device::Cpu)).unwrap();
        let scaled: Vec<f32> = Vec::try_from(&inverse_frequencies(&a, 16, Device::Cpu)).unwrap();
        for (p, s) in plain.iter().zip(&scaled) {
            let wavelen = 2.0 * std::f64::consts::PI / *p as f64;
            if wavelen < 16.0 {
                assert_eq!(p, s, "short wavelength {wavelen} kept");
            } else if wavelen > 64.0 {
                assert!((*s as f64 - *p as f64 / 8.0).abs() < 1e-12 + 1e-6 * *p as f64, "long wavelength {wavelen} divided");
            } else {
                assert!(*s <= *p && *s as f64 >= *p as f64 / 8.0 - 1e-12, "medium wavelength {wavelen} between");
            }
        }
    }

    fn args_with_theta(theta: f64) -> LlamaArgs {
        LlamaArgs { rope_theta: theta, ..args() }
    }

    #[test]
    fn rotation_pairs_halves_and_keeps_norms() {
        let rope = Rope::new(&args(), 4, 8, Device::Cpu);
        let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0]).view([1, 1, 1, 4]).repeat([1, 1, 8, 1]);
        let (cos, sin) = rope.window(0, 8, Kind::Float).unwrap();
        let y = apply(&x, &cos, &sin).unwrap();
        // Position 0 is the identity; every position keeps each (i, i + d/2) pair's norm.
        assert!(y.get(0).get(0).get(0).allclose(&x.get(0).get(0).get(0), 1e-6, 1e-6, false));
        let pair_norm = |t: &Tensor, i: i64| (t.narrow(3, i, 1).square() + t.narrow(3, i + 2, 1).square()).sqrt();
        assert!(pair_norm(&y, 0).allclose(&pair_norm(&x, 0), 1e-5, 1e-5, false));
        assert!(pair_norm(&y, 1).allclose(&pair_norm(&x, 1), 1e-5, 1e-5, false));
    }
}
