//! A family's parameters, declared once as a [`Layout`]: the family's constructor
//! makes its variables from it ([`Made`]), the Hugging Face parameter table lists
//! them (`hf::names::from_layout`), and the FLOP count reads its linear layers and
//! attentions ([`Layout::flop_layers`]). So a block's parameters are written in one
//! place, and the loader, the exporter, parameter sharding and the flops plugin
//! cannot disagree with the model that is built.

use std::collections::BTreeMap;

use tch::{nn, Tensor};

use super::{
    decoder::normal_unless_loaded,
    lora::{self, Targets},
    Layer, LayerKind,
};
use crate::config::ModelConfig;

/// One piece of a model, in the order the constructor makes it (which is the order
/// random initialisation draws in: changing it changes a model trained from scratch).
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    /// A linear layer at module `path` (`self_attn.q_proj`): `weight` `[out, inp]`
    /// drawn from N(0, `std`), and a zero `bias` `[out]` if `bias`. In a block, LoRA
    /// adapts it when `[lora]` targets its module name (the last part of `path`).
    Linear { path: &'static str, inp: i64, out: i64, bias: bool, std: f64 },
    /// The variable `path` (`ln_1.weight`) of `width`, every element `init` (a norm's
    /// weight or bias).
    Vector { path: &'static str, width: i64, init: f64 },
    /// The variable `path` (`model.embed_tokens.weight`) `[rows, cols]` drawn from
    /// N(0, `std`): a table rows are looked up in (no FLOPs).
    Table { path: &'static str, rows: i64, cols: i64, std: f64 },
    /// Attention of `heads` queries of `head_dim` over the sequence: no parameters,
    /// FLOPs named `path` (`self_attn.sdpa`).
    Attention { path: &'static str, heads: i64, head_dim: i64 },
    /// The output head when it is the token embedding: no parameters of its own,
    /// FLOPs named `lm_head`.
    TiedHead { inp: i64, out: i64 },
    /// The variable `path` (`mlp.experts.down_proj`) `[experts, out, inp]` drawn from
    /// N(0, `std`): `experts` linear weights stacked, as transformers 5 holds a mixture's
    /// experts; each token goes through `active` of them (FLOPs: `active` products per
    /// position).
    Experts { path: &'static str, experts: i64, inp: i64, out: i64, active: i64, std: f64 },
}

/// Every parameter of a model: some before its blocks, `blocks` blocks alike, some after.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// Made before the blocks (embeddings; an untied head where it is drawn first).
    pub before: Vec<Part>,
    /// Block `i`'s parts are under `{blocks_at}.{i}.` (`model.layers.3.self_attn.q_proj`).
    pub blocks_at: &'static str,
    pub blocks: i64,
    /// One block's parts.
    pub block: Vec<Part>,
    /// The blocks whose parts are not `block`'s, with theirs (a mixture's dense blocks).
    pub exceptions: Vec<(i64, Vec<Part>)>,
    /// Made after the blocks (the final norm).
    pub after: Vec<Part>,
}

impl Layout {
    /// Block `index`'s name of `path`.
    pub fn in_block(&self, index: i64, path: &str) -> String {
        format!("{}.{index}.{path}", self.blocks_at)
    }

    /// Block `index`'s parts.
    pub fn parts(&self, index: i64) -> &[Part] {
        self.exceptions.iter().find(|(i, _)| *i == index).map_or(&self.block, |(_, parts)| parts)
    }

    /// The layers at sequence length `seq_len`, for exact FLOP counts: each block's
    /// linear layers and attention, then the output head.
    pub fn flop_layers(&self, seq_len: i64) -> Vec<Layer> {
        let t = seq_len;
        let layer = |name: String, part: &Part| match *part {
            Part::Linear { inp, out, .. } => Some(Layer::linear(name, inp, out, t, true)),
            Part::TiedHead { inp, out } => Some(Layer::linear("lm_head", inp, out, t, true)),
            // Every query head attends: grouped keys and values save memory, not matmul work.
            Part::Attention { heads, head_dim, .. } => Some(Layer {
                kind: LayerKind::Attention,
                heads: heads as u64,
                head_dim: head_dim as u64,
                seq_len: t as u64,
                ..Layer::linear(name, heads * head_dim, heads * head_dim, t, true)
            }),
            Part::Experts { inp, out, active, .. } => Some(Layer::linear(name, inp, out, t * active, true)),
            Part::Vector { .. } | Part::Table { .. } => None,
        };
        let blocks = (0..self.blocks).flat_map(|i| self.parts(i).iter().filter_map(move |p| layer(self.in_block(i, p.path()), p)));
        let outer = self.before.iter().chain(&self.after).filter_map(|p| layer(p.path().to_string(), p));
        blocks.collect::<Vec<_>>().into_iter().chain(outer).collect()
    }
}

impl Part {
    /// Its module or variable path (`lm_head` for a tied head).
    pub fn path(&self) -> &'static str {
        match self {
            Part::Linear { path, .. }
            | Part::Vector { path, .. }
            | Part::Table { path, .. }
            | Part::Attention { path, .. }
            | Part::Experts { path, .. } => path,
            Part::TiedHead { .. } => "lm_head",
        }
    }
}

/// `vs` / each dot-separated component of `path` (none for "").
fn sub<'a>(vs: &nn::Path<'a>, path: &str) -> nn::Path<'a> {
    path.split('.').filter(|c| !c.is_empty()).fold(vs.clone(), |p, component| p.sub(component))
}

/// The variables of some parts, made in order, for their family to take by path.
pub struct Made {
    linears: BTreeMap<&'static str, lora::Linear>,
    tensors: BTreeMap<&'static str, Tensor>,
    expert_adapters: BTreeMap<&'static str, lora::experts::ExpertAdapter>,
}

impl Made {
    /// Makes `parts` under `vs` in order (drawn unless `model.init_from` overwrites
    /// them: [`normal_unless_loaded`]), linear layers with the adapters `targets` names.
    pub fn new(vs: &nn::Path, parts: &[Part], m: &ModelConfig, targets: Targets) -> Made {
        let mut made = Made { linears: BTreeMap::new(), tensors: BTreeMap::new(), expert_adapters: BTreeMap::new() };
        for part in parts {
            match *part {
                Part::Linear { path, inp, out, bias, std } => {
                    let module = path.rsplit('.').next().unwrap_or(path);
                    let linear = lora::Linear::new(sub(vs, path), module, inp, out, bias, normal_unless_loaded(m, std), targets);
                    made.linears.insert(path, linear);
                }
                Part::Vector { path, width, init } => {
                    let (module, leaf) = path.rsplit_once('.').unwrap_or(("", path));
                    made.tensors.insert(path, sub(vs, module).var(leaf, &[width], nn::Init::Const(init)));
                }
                Part::Table { path, rows, cols, std } => {
                    let (module, leaf) = path.rsplit_once('.').unwrap_or(("", path));
                    made.tensors.insert(path, sub(vs, module).var(leaf, &[rows, cols], normal_unless_loaded(m, std)));
                }
                Part::Experts { path, experts, inp, out, std, .. } => {
                    let (module, leaf) = path.rsplit_once('.').unwrap_or(("", path));
                    made.tensors.insert(path, sub(vs, module).var(leaf, &[experts, out, inp], normal_unless_loaded(m, std)));
                    // Named in `lora.targets` by its last two parts: `experts.gate_up_proj`.
                    let target = path.rmatch_indices('.').nth(1).map_or(path, |(i, _)| &path[i + 1..]);
                    if let Some(adapter) = lora::experts::ExpertAdapter::new(&sub(vs, path), target, experts, inp, out, targets) {
                        made.expert_adapters.insert(path, adapter);
                    }
                }
                Part::Attention { .. } | Part::TiedHead { .. } => {}
            }
        }
        made
    }

    /// The linear layer at `path`, if its layout has one.
    pub fn take_linear(&mut self, path: &str) -> Option<lora::Linear> {
        self.linears.remove(path)
    }

    /// The linear layer at `path`: a family asks only for what its layout declares.
    pub fn linear(&mut self, path: &str) -> lora::Linear {
        self.take_linear(path).unwrap_or_else(|| panic!("the layout declares no linear layer `{path}`"))
    }

    /// The LoRA adapter of the stacked experts at `path`, if `[lora]` targets them.
    pub fn take_expert_adapter(&mut self, path: &str) -> Option<lora::experts::ExpertAdapter> {
        self.expert_adapters.remove(path)
    }

    /// The variable `path`, if its layout has one.
    pub fn take_tensor(&mut self, path: &str) -> Option<Tensor> {
        self.tensors.remove(path)
    }

    /// The variable `path`: a family asks only for what its layout declares.
    pub fn tensor(&mut self, path: &str) -> Tensor {
        self.take_tensor(path).unwrap_or_else(|| panic!("the layout declares no variable `{path}`"))
    }
}
