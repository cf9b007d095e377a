//! LoRA (low-rank adapters): a linear layer `y = x W^T + b + (alpha / r) B A x`
//! whose base `W`, `b` are frozen and whose `A` `[r, in]` and `B` `[out, r]` are
//! trained. Named as `peft` names them (`<module>.lora_A.weight`,
//! `<module>.lora_B.weight`), initialised as `peft` initialises them (A uniform with
//! bound `1/sqrt(in)`, i.e. Kaiming-uniform with `a = sqrt(5)`; B zero: training
//! starts from the base model exactly), so an export is a rename.

pub mod experts;

use tch::{nn, Device, Kind, Tensor};

use super::Model;
use crate::{
    config::{LoraConfig, ModelKind},
    error::{Error, Result},
};

/// The marker of an adapter tensor in a parameter's name.
pub const ADAPTER: &str = ".lora_";

/// A linear layer, with an adapter when LoRA targets it.
#[derive(Debug)]
pub struct Linear {
    pub base: nn::Linear,
    adapter: Option<Adapter>,
}

#[derive(Debug)]
struct Adapter {
    a: Tensor,
    b: Tensor,
    scaling: f64,
    dropout: f64,
}

/// The adapters a model gets: the `[lora]` settings and the linear layers of the
/// model's family they may adapt (its descriptor's, `model::family`).
#[derive(Debug, Clone, Copy)]
pub struct Targets<'a> {
    pub lora: Option<&'a LoraConfig>,
    pub modules: &'static [&'static str],
}

impl<'a> Targets<'a> {
    pub const NONE: Targets<'static> = Targets { lora: None, modules: &[] };

    /// `lora`'s adapters on a model of `kind`.
    pub fn new(lora: Option<&'a LoraConfig>, kind: ModelKind) -> Targets<'a> {
        Targets { lora, modules: super::family::of(kind).lora_modules }
    }

    /// Whether anything draws random numbers: adapter dropout.
    pub fn draws(&self) -> bool {
        self.lora.is_some_and(|l| l.dropout > 0.0)
    }
}

impl Linear {
    /// `base` at `vs` (`weight` `[out, in]` initialised by `ws_init`, `bias`), with an
    /// adapter beside it when `targets` names `module`.
    pub fn new(vs: nn::Path, module: &str, inp: i64, out: i64, bias: bool, ws_init: nn::Init, targets: Targets) -> Linear {
        let config = nn::LinearConfig { ws_init, bs_init: bias.then_some(nn::Init::Const(0.0)), bias };
        let base = nn::linear(&vs, inp, out, config);
        let adapter = targets.lora.filter(|l| l.adapts(targets.modules, module)).map(|l| {
            let bound = 1.0 / (inp as f64).sqrt();
            Adapter {
                a: (&vs / "lora_A").var("weight", &[l.rank, inp], nn::Init::Uniform { lo: -bound, up: bound }),
                b: (&vs / "lora_B").var("weight", &[out, l.rank], nn::Init::Const(0.0)),
                scaling: l.scaling(),
                dropout: l.dropout,
            }
        });
        Linear { base, adapter }
    }

    pub fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        self.forward_with(x, None, train)
    }

    /// [`Linear::forward`] over `x = silu(gate) * up` (a down projection's input), which
    /// backward then recomputes from `recompute = (gate, up)` for the base weight's
    /// gradient instead of keeping it, where the base runs through oneDNN's products
    /// (`ptrain_torch_ext::linear`; else [`super::llama`]'s recompute hook drops it).
    pub fn forward_with(&self, x: &Tensor, recompute: Option<(&Tensor, &Tensor)>, train: bool) -> Result<Tensor> {
        let y = self.base_forward(x, recompute)?;
        let Some(ad) = self.active() else { return Ok(y) };
        let h = match ad.dropout > 0.0 && train {
            true => x.f_dropout(ad.dropout, true)?,
            false => x.shallow_clone(),
        };
        ad.add_to(y, &h.f_linear::<Tensor>(&ad.a, None)?)
    }

    /// `x W^T + b` of the base: through oneDNN's float32 CPU products where `run.cpu_matmul`
    /// chose them, else `at::linear`.
    fn base_forward(&self, x: &Tensor, recompute: Option<(&Tensor, &Tensor)>) -> Result<Tensor> {
        ptrain_torch_ext::linear::linear(x, &self.base.ws, self.base.bs.as_ref(), recompute).map_err(|e| Error::Other(format!("linear: {e}")))
    }

    /// Its adapter, unless [`without_adapters`] switched adapters off.
    fn active(&self) -> Option<&Adapter> {
        self.adapter.as_ref().filter(|_| !ADAPTERS_OFF.get())
    }
}

impl Adapter {
    /// `y + scaling * down B^T`, `down` being the input through A (`[.., r]`).
    fn add_to(&self, y: Tensor, down: &Tensor) -> Result<Tensor> {
        let low = down.f_linear::<Tensor>(&self.b, None)?;
        Ok(y.f_add(&low.f_mul_scalar(self.scaling)?)?)
    }
}

/// The outputs of `layers` over one input `x` (a block's q, k and v; its gate and up),
/// as [`Linear::forward`] gives them, with their adapters' A matrices concatenated at
/// compute time (`[sum r, in]`) and run as one matmul whose output is split per
/// adapter, each piece through its own B: one pass over `x` and one small GEMM
/// instead of one each. The parameters stay separate tensors, so peft's names and
/// files, the optimizer's state and parameter sharding see nothing new (the
/// concatenation is a `[3 r, in]` copy per step, 172 KB at Qwen2-0.5B's q/k/v).
/// With adapter dropout in training, each adapter draws its own mask over `x`, so
/// their inputs differ: then each layer runs alone.
pub fn forward_shared<const N: usize>(layers: [&Linear; N], x: &Tensor, train: bool) -> Result<[Tensor; N]> {
    let adapters: Vec<&Adapter> = layers.iter().filter_map(|l| l.active()).collect();
    let draws = train && adapters.iter().any(|a| a.dropout > 0.0);
    let outputs: Vec<Tensor> = match adapters.len() < 2 || draws || separate_a() {
        true => layers.iter().map(|l| l.forward(x, train)).collect::<Result<_>>()?,
        false => {
            let a = Tensor::f_cat(&adapters.iter().map(|a| &a.a).collect::<Vec<_>>(), 0)?;
            let ranks: Vec<i64> = adapters.iter().map(|a| a.a.size()[0]).collect();
            let mut downs = x.f_linear::<Tensor>(&a, None)?.f_split_with_sizes(&ranks, -1)?.into_iter();
            let mut out = Vec::with_capacity(N);
            for layer in layers {
                let y = layer.base_forward(x, None)?;
                out.push(match layer.active() {
                    Some(ad) => ad.add_to(y, &downs.next().ok_or_else(|| Error::Other("LoRA: an A output per adapter".into()))?)?,
                    None => y,
                });
            }
            out
        }
    };
    outputs.try_into().map_err(|_| Error::Other("LoRA: one output per layer".into()))
}

#[cfg(test)]
thread_local! {
    /// Set: [`forward_shared`] runs each layer alone (the reference of its tests).
    pub(crate) static SEPARATE_A: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn separate_a() -> bool {
    #[cfg(test)]
    if SEPARATE_A.get() {
        return true;
    }
    false
}

thread_local! {
    /// Set while [`without_adapters`] runs on this thread.
    static ADAPTERS_OFF: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with every adapter switched off on this thread: the model is its base
/// (`peft`'s `disable_adapter()`), with no second copy of the weights. DPO's
/// reference with LoRA and no `dpo.reference` is this.
pub fn without_adapters<T>(f: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            ADAPTERS_OFF.set(self.0);
        }
    }
    let _restore = Restore(ADAPTERS_OFF.replace(true));
    f()
}

/// The frozen base weights of `vs` (every parameter but the adapters), by name.
fn base_of(vs: &nn::VarStore) -> Vec<(String, Tensor)> {
    let mut base: Vec<(String, Tensor)> = vs.variables().into_iter().filter(|(n, _)| !n.contains(ADAPTER)).collect();
    base.sort_by(|a, b| a.0.cmp(&b.0));
    base
}

/// Freezes every parameter of `vs` but the adapters: no gradient, so no optimizer
/// state and nothing all-reduced.
pub fn freeze_base(vs: &nn::VarStore) {
    for (_, t) in base_of(vs) {
        let _ = t.set_requires_grad(false);
    }
}

/// Under `train.precision = "bf16"` the frozen matrices of the blocks
/// ([`Model::block_matrices`]: the base of each block's [`Linear`]) are stored in
/// bf16: autocast casts them to bf16 for every matmul anyway (the same values), so
/// only their memory changes. Embeddings and the head keep their type, as the
/// activations and the loss depend on it; a trained matrix keeps float32.
pub fn store_base_bf16(model: &dyn Model) -> Result<()> {
    tch::no_grad(|| {
        for mut t in model.block_matrices().into_iter().filter(|t| !t.requires_grad()) {
            let half = t.f_to_kind(Kind::BFloat16)?;
            t.f_set_data(&half)?;
        }
        Ok(())
    })
}

/// The frozen base of a built LoRA model: its digest (`cut`: taken already by
/// parameter sharding, which cut the base while built, from the weight files or as
/// drawn, its block matrices already in bf16), then under bf16 ([`store_base_bf16`])
/// its block matrices in bf16.
pub fn settle_base(vs: &nn::VarStore, model: &dyn Model, bf16: bool, cut: Option<String>) -> Result<String> {
    if let Some(digest) = cut {
        return Ok(digest);
    }
    let digest = base_digest(vs)?;
    if bf16 {
        store_base_bf16(model)?;
    }
    Ok(digest)
}

/// The digest ([`BaseDigest`](super::base_digest::BaseDigest)) of the frozen weights
/// of `vs` as they are: a resumed LoRA run checks it is on the base it was trained on.
pub fn base_digest(vs: &nn::VarStore) -> Result<String> {
    let mut digest = super::base_digest::BaseDigest::default();
    for (name, t) in base_of(vs) {
        digest.add_tensor(&name, &t)?;
    }
    Ok(digest.finish())
}

/// The full model of a LoRA checkpoint, as the tensors of a `model.safetensors` in ptrain's
/// names: `model.init_from`'s base with the checkpoint's adapters merged in
/// (`W + alpha / r * B A`), the adapters left out. `base`: `model.init_from` was moved
/// there (`--base`); its weights must hash to what the run recorded.
pub fn merged(
    config: &crate::config::Config,
    checkpoint: &std::path::Path,
    base: Option<&std::path::Path>,
) -> Result<std::collections::BTreeMap<String, ptrain_checkpoint::Tensor>> {
    let lora = config.lora().ok_or_else(|| Error::Other("not a LoRA run".into()))?;
    let vs = nn::VarStore::new(Device::Cpu);
    let _model = super::build(config, &vs, &super::pretrained::NoData)?;
    super::probe::load_checkpoint_weights(&vs, checkpoint)?;
    if let Some(base) = base {
        super::adapters::check_base(&vs, checkpoint, base)?;
    }
    merged_weights(&vs, lora)
}

/// The full model of `vs` (a base with LoRA adapters `lora`), as the tensors of a
/// `model.safetensors` in ptrain's names: each adapted weight `W + alpha / r * B A`,
/// the adapters left out.
pub fn merged_weights(vs: &nn::VarStore, lora: &crate::config::LoraConfig) -> Result<std::collections::BTreeMap<String, ptrain_checkpoint::Tensor>> {
    let vars = vs.variables();
    let mut out: Vec<(String, Tensor)> = Vec::new();
    tch::no_grad(|| -> Result<()> {
        for (name, w) in &vars {
            if name.contains(ADAPTER) {
                continue;
            }
            let module = name.strip_suffix(".weight").unwrap_or(name);
            let w = match (vars.get(&format!("{module}.lora_A.weight")), vars.get(&format!("{module}.lora_B.weight"))) {
                // Stacked experts `[experts, out, in]`: each expert's `B_e A_e`.
                (Some(a), Some(b)) if w.dim() == 3 => w.f_add(&experts::delta(a, b, w.size()[0], lora.scaling())?)?,
                (Some(a), Some(b)) => w.f_add(&b.f_matmul(a)?.f_mul_scalar(lora.scaling())?)?,
                _ => w.shallow_clone(),
            };
            out.push((name.clone(), w.f_to_kind(Kind::Float)?.f_contiguous()?));
        }
        Ok(())
    })?;
    out.into_iter()
        .map(|(name, t)| {
            let mut data = vec![0u8; t.numel() * 4];
            t.f_copy_data_u8(&mut data, t.numel())?;
            Ok((name, ptrain_checkpoint::Tensor { dtype: ptrain_plugin_api::DType::F32, shape: t.size(), data }))
        })
        .collect()
}
