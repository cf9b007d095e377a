//! LoRA on a mixture's stacked experts (`mlp.experts.gate_up_proj` `[experts, out, in]`,
//! `mlp.experts.down_proj`), as `peft` 0.21 adapts them (`LoraConfig(target_parameters=
//! [...])`, its `ParamWrapper`): one adapter per stacked weight holding every expert's,
//! `A` `[rank x experts, in]` (read as `[experts, rank, in]`: expert-major) and `B`
//! `[out, rank x experts]` (read as `[out, rank, experts]`: expert-minor), expert `e`'s
//! weight adapted by `scaling x B_e A_e`; initialised as peft does (A uniform with bound
//! `1/sqrt(in)`, B zero). Stored in peft's layout, so an export is a rename
//! ([`to_peft`]); the experts apply it as two more grouped products over their rows
//! (`super::super::moe`), never materialising the adapted `[experts, out, in]` weight.

use tch::{nn, Tensor};

use super::Targets;
use crate::error::Result;

/// The adapter of one stacked expert weight.
#[derive(Debug)]
pub struct ExpertAdapter {
    a: Tensor,
    b: Tensor,
    rank: i64,
    experts: i64,
    scaling: f64,
}

impl ExpertAdapter {
    /// The adapter of the stacked weight `[experts, out, in]` at `vs` (named `module` in
    /// `[lora]`'s targets: `experts.gate_up_proj`), when `targets` names it.
    pub fn new(vs: &nn::Path, module: &str, experts: i64, inp: i64, out: i64, targets: Targets) -> Option<ExpertAdapter> {
        let lora = targets.lora.filter(|l| l.adapts(targets.modules, module))?;
        let (rank, bound) = (lora.rank, 1.0 / (inp as f64).sqrt());
        Some(ExpertAdapter {
            a: (vs / "lora_A").var("weight", &[rank * experts, inp], nn::Init::Uniform { lo: -bound, up: bound }),
            b: (vs / "lora_B").var("weight", &[out, rank * experts], nn::Init::Const(0.0)),
            rank,
            experts,
            scaling: lora.scaling(),
        })
    }

    /// Per expert, `A_e` `[experts, rank, in]` and `B_e` `[experts, out, rank]` (each a
    /// stacked weight as the grouped product takes it), and the scaling; `None` while
    /// [`super::without_adapters`] switched adapters off.
    pub fn factors(&self) -> Result<Option<(Tensor, Tensor, f64)>> {
        if super::ADAPTERS_OFF.get() {
            return Ok(None);
        }
        let a = self.a.f_reshape([self.experts, self.rank, -1])?;
        let b = self.b.f_reshape([-1, self.rank, self.experts])?.f_permute([2, 0, 1])?.f_contiguous()?;
        Ok(Some((a, b, self.scaling)))
    }
}

/// The delta `scaling x B_e A_e` `[experts, out, in]` of a stacked weight's adapter
/// `a` `[rank x experts, in]`, `b` `[out, rank x experts]` (a merge).
pub fn delta(a: &Tensor, b: &Tensor, experts: i64, scaling: f64) -> Result<Tensor> {
    let rank = a.size()[0] / experts;
    let a = a.f_reshape([experts, rank, -1])?;
    let b = b.f_reshape([-1, rank, experts])?.f_permute([2, 0, 1])?;
    Ok(b.f_bmm(&a)?.f_mul_scalar(scaling)?)
}

/// The stacked expert weights LoRA adapts, by ptrain's target name and `peft`'s
/// `target_parameters` entry (the router, `mlp.gate`, is ptrain's `lora::Linear` whose
/// weight peft reaches as the parameter `mlp.gate.weight`).
pub const PARAMETERS: &[(&str, &str)] =
    &[("gate", "mlp.gate.weight"), ("experts.gate_up_proj", "mlp.experts.gate_up_proj"), ("experts.down_proj", "mlp.experts.down_proj")];

/// `peft`'s name of the adapter tensor `name` (ptrain's): the stacked experts' adapters
/// live on peft's `ParamWrapper`s around `mlp.experts`, nested when both weights are
/// adapted, the one wrapped first (`gate_up_proj`, the module's first parameter; peft
/// wraps in that order) inside (`mlp.experts.base_layer.lora_A.weight`), `down_proj`
/// outside (`mlp.experts.lora_A.weight`); one alone is `mlp.experts.lora_A.weight`.
/// Other adapters keep their names. `both`: both stacked weights are adapted.
pub fn to_peft(name: &str, both: bool) -> String {
    for (ours, inner) in [(".experts.gate_up_proj.lora_", both), (".experts.down_proj.lora_", false)] {
        if let Some((before, after)) = name.split_once(ours) {
            let wrapper = if inner { ".experts.base_layer.lora_" } else { ".experts.lora_" };
            return format!("{before}{wrapper}{after}");
        }
    }
    name.to_string()
}

/// Whether the adapter tensors `names` adapt both stacked expert weights ([`to_peft`]).
pub fn adapts_both<'a>(names: impl IntoIterator<Item = &'a str> + Clone) -> bool {
    let has = |w: &str| names.clone().into_iter().any(|n| n.contains(w));
    has(".experts.gate_up_proj.lora_") && has(".experts.down_proj.lora_")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_peft_nesting() {
        let up = "model.layers.0.mlp.experts.gate_up_proj.lora_A.weight";
        let down = "model.layers.0.mlp.experts.down_proj.lora_B.weight";
        assert_eq!(to_peft(up, true), "model.layers.0.mlp.experts.base_layer.lora_A.weight");
        assert_eq!(to_peft(up, false), "model.layers.0.mlp.experts.lora_A.weight");
        assert_eq!(to_peft(down, true), "model.layers.0.mlp.experts.lora_B.weight");
        assert_eq!(to_peft("model.layers.0.mlp.gate.lora_A.weight", true), "model.layers.0.mlp.gate.lora_A.weight");
        assert!(adapts_both([up, down]));
        assert!(!adapts_both([up]));
    }

    #[test]
    fn the_delta_is_each_experts_b_times_a() {
        let (experts, rank, inp, out) = (3, 2, 5, 4);
        let a = Tensor::randn([rank * experts, inp], (tch::Kind::Float, tch::Device::Cpu));
        let b = Tensor::randn([out, rank * experts], (tch::Kind::Float, tch::Device::Cpu));
        let d = delta(&a, &b, experts, 0.5).unwrap();
        for e in 0..experts {
            // peft: A rows e*rank.., B columns e, e+experts, ... (expert-minor).
            let a_e = a.narrow(0, e * rank, rank);
            let b_e = b.index_select(1, &Tensor::from_slice(&[e, e + experts]));
            let want = b_e.matmul(&a_e) * 0.5;
            assert!(d.get(e).allclose(&want, 1e-6, 1e-6, false), "expert {e}");
        }
    }
}
