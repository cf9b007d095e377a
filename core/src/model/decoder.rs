//! The decoder-only transformer every language-model family shares, written once:
//! embed -> blocks (each checkpointed or not, each through the [`BlockWrap`] if one
//! is set) -> cache advance -> final norm -> head. A family (`gpt.rs`, `llama.rs`)
//! is one [`Block`] and one [`Family`] (embedding, positions, final norm, head, its
//! [`Layout`]), described to the rest of ptrain by its descriptor (`model::family`).

use std::sync::Arc;

use tch::{nn, Kind, Tensor};

use super::{
    attention::{Attend, Segments},
    checkpointing::{self, Checkpoints},
    entry::{ModelInput, ModelOutput, Returns, Supports},
    layout::Layout,
    lora, KvCache, Layer, Model, Task,
};
use crate::{
    config::{ModelConfig, TrainConfig},
    error::{Error, Result},
};

/// One repeated block of a family, `[B, T, D]` to `[B, T, D]`.
pub trait Block: Send + Sync + 'static {
    fn forward(&self, x: &Tensor, input: &mut BlockInput) -> Result<Tensor>;

    /// Its linear layers: with LoRA under bf16, their frozen base matrices are stored
    /// in bf16 (see [`lora::store_base_bf16`]).
    fn linears(&self) -> Vec<&lora::Linear>;
}

/// What a block is given besides the hidden state, the same for every block of one
/// forward (but the cache's layer).
pub struct BlockInput<'a> {
    pub train: bool,
    /// RoPE's cos and sin at these positions ([`Family::rotary`]).
    pub rotary: Option<(&'a Tensor, &'a Tensor)>,
    pub attend: Attend<'a>,
}

/// Where a forward's tokens sit.
#[derive(Clone, Copy)]
pub enum Positions<'a> {
    /// `len` positions from `start` (after what a cache holds).
    From { start: i64, len: i64 },
    /// Each token's own (`[B, T]`, packed rows).
    Given(&'a Tensor),
}

/// What a decoder-only family puts around its blocks.
pub trait Family: Send + 'static {
    type Block: Block;

    /// `model.kind`.
    fn kind(&self) -> &'static str;

    /// The most positions it encodes (`model.block_size`).
    fn context(&self) -> i64;

    /// The embeddings `[B, T, D]` of `tokens` at `at` (learned positions added where
    /// the family has them), after the family's embedding dropout.
    fn embed(&self, tokens: &Tensor, at: Positions, train: bool) -> Result<Tensor>;

    /// RoPE's cos and sin at `at` in `kind` (the embeddings' type), for families that
    /// rotate queries and keys.
    fn rotary(&self, _at: Positions, _kind: Kind) -> Result<Option<(Tensor, Tensor)>> {
        Ok(None)
    }

    /// The final norm.
    fn norm(&self, x: &Tensor) -> Result<Tensor>;

    /// The output projection `[V, D]`.
    fn head(&self) -> &Tensor;

    /// Its parameters, attentions and head, as its constructor made them (the FLOP
    /// count reads them).
    fn layout(&self) -> Layout;

    /// Whether training draws random numbers (dropout, LoRA's adapter dropout).
    fn draws(&self) -> bool;
}

/// Runs around every execution of a block's forward: where a per-block policy plugs
/// in (parameter sharding gathers a block's parameters before it runs and frees them
/// after, and may issue the next block's gather early). It is called in the forward
/// pass, and again when backward recomputes a checkpointed block, then possibly on an
/// autograd worker thread. `forward` is to be called once.
pub trait BlockWrap: Send + Sync {
    /// At the start of every forward, before the embeddings (which are outside the
    /// blocks) are used.
    fn enter(&self) -> Result<()> {
        Ok(())
    }

    /// Block `index` over `input` (its hidden state). `checkpointed`: the block runs
    /// inside its activation checkpoint: without a graph in forward, with one when
    /// backward recomputes it.
    fn around(&self, index: usize, input: &Tensor, checkpointed: bool, forward: &mut dyn FnMut() -> Result<Tensor>) -> Result<Tensor>;
}

/// Per-block choices, fixed when the model is built.
#[derive(Clone, Default)]
pub struct BlockPlan {
    /// The blocks that keep only their input in forward and are recomputed in backward.
    pub checkpointed: Vec<bool>,
    pub wrap: Option<Arc<dyn BlockWrap>>,
}

impl BlockPlan {
    /// `train.activation_checkpointing` over `blocks` blocks, no wrap.
    pub fn from_train(train: &TrainConfig, blocks: usize) -> Result<BlockPlan> {
        Ok(BlockPlan { checkpointed: checkpointing::chosen(train, blocks)?, wrap: None })
    }
}

fn run_block(
    wrap: Option<&dyn BlockWrap>,
    index: usize,
    input: &Tensor,
    checkpointed: bool,
    mut forward: impl FnMut() -> Result<Tensor>,
) -> Result<Tensor> {
    match wrap {
        None => forward(),
        Some(w) => w.around(index, input, checkpointed, &mut forward),
    }
}

/// The rows of `weight` `[V, D]` at `ids`. `tied`: `weight` is also the output head,
/// and the lookup's gradient goes to backward as a sparse `[ids, D]` tensor rather than
/// a zero-filled dense `[V, D]` one. It saves no `[V, D]` buffer: autograd sums it with
/// the head's dense gradient out of place (docs/memory.md), and the full fine-tuning peak
/// at Qwen2-0.5B's shape is the same either way (9,763 vs 9,767 MiB). The gradients are
/// the same either way (`objective::tests`). (A 45 MB higher peak RSS once blamed on it in
/// `tests/activation_checkpointing.rs` was glibc's heap layout: with the mmap threshold
/// fixed both lookups peak alike.) Dense on CUDA: there the sparse gradient's sum with a
/// dense one adds repeated ids with atomic adds, so two runs differed in the last bit
/// (the GPU kit's bit-for-bit rows failed on an H100), while CUDA's dense embedding
/// backward sorts the ids and is reproducible.
pub(super) fn lookup(weight: &Tensor, ids: &Tensor, tied: bool) -> Result<Tensor> {
    Ok(Tensor::f_embedding(weight, ids, -1, false, tied && weight.device() == tch::Device::Cpu)?)
}

/// A checkpointed block's training forward over `[x]`, then RoPE's `[cos, sin]` if
/// any (they come in pairs), then the mask if any, as the checkpoint recomputes it.
fn recompute<B: Block>(block: &B, inputs: &[Tensor]) -> Result<Tensor> {
    let (rotary, rest) = match inputs.len() {
        1 | 2 => (None, &inputs[1..]),
        _ => (Some((&inputs[1], &inputs[2])), &inputs[3..]),
    };
    block.forward(&inputs[0], &mut BlockInput { train: true, rotary, attend: rest.first().map_or(Attend::Causal, Attend::Masked) })
}

/// A base weight's initialisation: N(0, `stdev`) for a model trained from scratch;
/// zeros when `model.init_from`'s weights overwrite it right after it is built.
/// Drawing a Qwen2-0.5B's 494M normal numbers (three passes over 2 GB) only to
/// overwrite them was a third of its set-up.
pub(super) fn normal_unless_loaded(m: &ModelConfig, stdev: f64) -> nn::Init {
    if m.init_from.is_empty() {
        nn::Init::Randn { mean: 0.0, stdev }
    } else {
        nn::Init::Const(0.0)
    }
}

/// `model` with its blocks planned by `train` (activation checkpointing), boxed: a
/// family's [`crate::model::family::Build::Decoder`].
pub(super) fn planned<F: Family>(mut model: Decoder<F>, train: &TrainConfig) -> Result<Box<dyn Model>> {
    model.plan(BlockPlan::from_train(train, model.depth())?)?;
    Ok(Box::new(model))
}

/// `block`, once `after_block` was told block `index` was built (a family's builder
/// hands each block through it as it makes them).
pub(super) fn built<B>(block: B, index: i64, after_block: &mut dyn FnMut(usize)) -> B {
    after_block(index as usize);
    block
}

/// A decoder-only language model of family `F`.
pub struct Decoder<F: Family> {
    family: F,
    blocks: Vec<Arc<F::Block>>,
    checkpoints: Checkpoints,
    /// Which blocks are checkpointed (kept to wrap them later).
    checkpointed: Vec<bool>,
    wrap: Option<Arc<dyn BlockWrap>>,
}

impl<F: Family> Decoder<F> {
    pub fn new(family: F, blocks: Vec<F::Block>) -> Decoder<F> {
        Decoder {
            family,
            blocks: blocks.into_iter().map(Arc::new).collect(),
            checkpoints: Checkpoints::default(),
            checkpointed: Vec::new(),
            wrap: None,
        }
    }

    /// Checkpoints and wraps the blocks as `plan` says.
    pub fn plan(&mut self, plan: BlockPlan) -> Result<()> {
        let wrap = plan.wrap;
        self.checkpoints = Checkpoints::new(&plan.checkpointed, |i| {
            let (block, wrap) = (Arc::clone(&self.blocks[i]), wrap.clone());
            move |inputs: &[Tensor]| run_block(wrap.as_deref(), i, &inputs[0], true, || recompute(&*block, inputs))
        })?;
        self.checkpointed = plan.checkpointed;
        self.wrap = wrap;
        Ok(())
    }

    pub fn family(&self) -> &F {
        &self.family
    }

    /// Its blocks.
    pub fn depth(&self) -> usize {
        self.blocks.len()
    }

    /// The final-normed hidden states of `tokens`.
    fn hidden(&self, tokens: &Tensor, segments: Option<&Segments>, mut cache: Option<&mut KvCache>, train: bool) -> Result<Tensor> {
        let t = tokens.size().last().copied().unwrap_or(0);
        let start = cache.as_ref().map_or(0, |c| c.len());
        if segments.is_some() && cache.is_some() {
            return Err(Error::Other("a forward after a key/value cache takes no segments".into()));
        }
        if start + t > self.family.context() {
            let context = self.family.context();
            return Err(Error::Other(format!("{} positions exceed the model's context of {context} (model.block_size)", start + t)));
        }
        if let Some(c) = cache.as_deref() {
            c.reserve(t)?;
        }
        let at = match segments {
            Some(s) => Positions::Given(&s.positions),
            None => Positions::From { start, len: t },
        };
        let wrap = self.wrap.as_deref();
        if let Some(w) = wrap {
            w.enter()?;
        }
        let mut x = self.family.embed(tokens, at, train)?;
        let rotary = self.family.rotary(at, x.kind())?;
        let mask = segments.map(Segments::mask).transpose()?;
        // What a checkpoint saves besides x (an empty Vec allocates nothing).
        let extras: Vec<&Tensor> = rotary.iter().flat_map(|(cos, sin)| [cos, sin]).chain(mask.as_ref()).collect();
        let rotary = rotary.as_ref().map(|(cos, sin)| (cos, sin));
        for (i, block) in self.blocks.iter().enumerate() {
            x = match self.checkpoints.run(i, train && cache.is_none(), &x, &extras) {
                Some(out) => out?,
                None => {
                    let attend = match (cache.as_deref_mut(), &mask) {
                        (Some(c), _) => Attend::Cached(c, i),
                        (None, Some(m)) => Attend::Masked(m),
                        (None, None) => Attend::Causal,
                    };
                    let mut input = BlockInput { train, rotary, attend };
                    run_block(wrap, i, &x, false, || block.forward(&x, &mut input))?
                }
            };
        }
        if let Some(c) = cache {
            c.advance(t);
        }
        self.family.norm(&x)
    }
}

impl<F: Family> Model for Decoder<F> {
    fn forward(&mut self, input: ModelInput) -> Result<ModelOutput> {
        let states = self.hidden(input.tokens, input.segments, input.cache, input.train)?;
        let head = self.family.head();
        Ok(match input.returns {
            Returns::Logits => ModelOutput::Logits(states.f_linear::<Tensor>(head, None)?),
            Returns::Hidden => ModelOutput::Hidden { states, head: head.shallow_clone() },
        })
    }

    fn task(&self) -> Task {
        Task::LanguageModel
    }

    fn kind(&self) -> &str {
        self.family.kind()
    }

    fn layers(&self, seq_len: i64) -> Vec<Layer> {
        self.family.layout().flop_layers(seq_len)
    }

    fn uses_randomness(&self) -> bool {
        self.family.draws()
    }

    fn supports(&self) -> Supports {
        Supports { segments: true, hidden: true }
    }

    fn new_cache(&self, capacity: i64) -> Option<KvCache> {
        Some(KvCache::new(self.blocks.len(), capacity.min(self.family.context())))
    }

    fn wrap_blocks(&mut self, wrap: Arc<dyn BlockWrap>) -> Result<Option<usize>> {
        self.plan(BlockPlan { checkpointed: self.checkpointed.clone(), wrap: Some(wrap) })?;
        Ok(Some(self.blocks.len()))
    }

    fn block_matrices(&self) -> Vec<Tensor> {
        self.blocks.iter().flat_map(|b| b.linears()).map(|l| l.base.ws.shallow_clone()).collect()
    }
}

#[cfg(test)]
mod tests;
