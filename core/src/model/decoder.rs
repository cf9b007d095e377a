//! The decoder-only transformer every language-model family shares, written once:
//! embed -> blocks (each checkpointed or not, each through the [`BlockWrap`] if one
//! is set) -> cache advance -> final norm -> head. A family (`gpt.rs`, `llama.rs`)
//! is one [`Block`] and one [`Family`] (embedding, positions, final norm, head, its
//! [`Layout`]), described to the rest of ptrain by its descriptor (`model::family`).

use std::sync::Arc;

use tch::{nn, Kind, Tensor};

use plan::{recompute, run_block};
pub use plan::{BlockPlan, BlockWrap};

use super::{
    attention::{self, Attend, Segments},
    checkpointing::Checkpoints,
    entry::{AuxLoss, Head, ModelInput, ModelOutput, Returns, Supports},
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

    /// Which of its family's RoPE tables ([`Family::rotary`]) it turns queries and keys
    /// by (Gemma 3's sliding layers have a base of their own).
    fn rotary_table(&self) -> usize {
        0
    }

    /// The sliding window its attention keeps to: a query sees itself and the
    /// `window - 1` positions before it. `None`: every position before it.
    fn window(&self) -> Option<i64> {
        None
    }
}

/// What a block is given besides the hidden state, the same for every block of one
/// forward (but the cache's layer).
pub struct BlockInput<'a> {
    pub train: bool,
    /// RoPE's cos and sin at these positions, of the block's table ([`Family::rotary`]).
    pub rotary: Option<(&'a Tensor, &'a Tensor)>,
    /// Within the block's window, if any.
    pub attend: Attend<'a>,
    /// Where a block puts what its family's auxiliary loss is computed from
    /// ([`Family::aux_loss`]: a mixture's router logits), one entry per block; `None`
    /// where nothing is collected (a forward after a cache). A checkpointed block's come
    /// out with its output (`plan::with_aux`).
    pub aux: Option<&'a mut Vec<Tensor>>,
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
    /// rotate queries and keys: one table per base its blocks turn by
    /// ([`Block::rotary_table`]).
    fn rotary(&self, _at: Positions, _kind: Kind) -> Result<Vec<(Tensor, Tensor)>> {
        Ok(Vec::new())
    }

    /// The final norm.
    fn norm(&self, x: &Tensor) -> Result<Tensor>;

    /// The output projection `[V, D]`.
    fn head(&self) -> &Tensor;

    /// Its final logits soft-capped at this (Gemma 2's `final_logit_softcapping`):
    /// handed out with the head ([`Head`]), so the chunked loss caps them too.
    fn logit_softcap(&self) -> Option<f64> {
        None
    }

    /// Its parameters, attentions and head, as its constructor made them (the FLOP
    /// count reads them).
    fn layout(&self) -> Layout;

    /// Whether training draws random numbers (dropout, LoRA's adapter dropout).
    fn draws(&self) -> bool;

    /// The auxiliary loss of a forward from what its `blocks` blocks put in
    /// [`BlockInput::aux`] (`collected`: fewer entries when some were checkpointed).
    /// Default: none.
    fn aux_loss(&self, _collected: Vec<Tensor>, _blocks: usize) -> Result<Option<AuxLoss>> {
        Ok(None)
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
    /// The family's auxiliary loss of the last forward without a cache, until taken.
    aux: Option<AuxLoss>,
}

impl<F: Family> Decoder<F> {
    pub fn new(family: F, blocks: Vec<F::Block>) -> Decoder<F> {
        Decoder {
            family,
            blocks: blocks.into_iter().map(Arc::new).collect(),
            checkpoints: Checkpoints::default(),
            checkpointed: Vec::new(),
            wrap: None,
            aux: None,
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
    fn hidden(&mut self, tokens: &Tensor, segments: Option<&Segments>, mut cache: Option<&mut KvCache>, train: bool) -> Result<Tensor> {
        let t = tokens.size().last().copied().unwrap_or(0);
        let start = cache.as_ref().map_or(0, |c| c.len());
        if segments.is_some() && cache.is_some() {
            return Err(Error::Other("a forward after a key/value cache takes no segments".into()));
        }
        // Packed rows carry their positions (each row's from its own start, checked by the
        // data against data.max_seq_len): only a plain sequence's length is its positions.
        if segments.is_none() && start + t > self.family.context() {
            let context = self.family.context();
            return Err(Error::Other(format!("{} positions exceed the model's context of {context} (model.block_size)", start + t)));
        }
        if let Some(c) = cache.as_deref() {
            c.reserve(t)?;
        }
        // A left-padded cache's rows each count their positions from their first token.
        let padded = cache.as_deref().map(|c| c.positions(t)).transpose()?.flatten();
        let at = match (segments, &padded) {
            (Some(s), _) => Positions::Given(&s.positions),
            (None, Some(p)) => Positions::Given(p),
            (None, None) => Positions::From { start, len: t },
        };
        let wrap = self.wrap.as_deref();
        if let Some(w) = wrap {
            w.enter()?;
        }
        let mut x = self.family.embed(tokens, at, train)?;
        let tables = self.family.rotary(at, x.kind())?;
        let masks = match cache {
            Some(_) => Vec::new(),
            None => self.masks(segments, t, x.device())?,
        };
        let (collect, mut collected) = (cache.is_none(), Vec::new());
        for (i, block) in self.blocks.iter().enumerate() {
            let rotary = tables.get(block.rotary_table()).map(|(cos, sin)| (cos, sin));
            let mask = masks.iter().find(|(w, _)| *w == block.window()).and_then(|(_, m)| m.as_ref());
            // What a checkpoint saves besides x (an empty Vec allocates nothing).
            let extras: Vec<&Tensor> = rotary.iter().flat_map(|(cos, sin)| [*cos, *sin]).chain(mask).collect();
            x = match self.checkpoints.run(i, train && cache.is_none(), &x, &extras) {
                Some(out) => plan::split_aux(out?, x.size()[2], collect.then_some(&mut collected))?,
                None => {
                    let attend = match (cache.as_deref_mut(), mask) {
                        (Some(c), _) => Attend::Cached(c, i, block.window()),
                        (None, Some(m)) => Attend::Masked(m),
                        (None, None) => Attend::Causal,
                    };
                    let aux = collect.then_some(&mut collected);
                    let mut input = BlockInput { train, rotary, attend, aux };
                    run_block(wrap, i, &x, false, || block.forward(&x, &mut input))?
                }
            };
        }
        if let Some(c) = cache {
            c.advance(t);
        }
        self.aux = if collect { self.family.aux_loss(collected, self.blocks.len())? } else { None };
        self.family.norm(&x)
    }

    /// The mask of each window the blocks attend within (`None`: every position before
    /// a query) over `t` positions: packed rows' ([`Segments::mask_within`]) or one
    /// plain sequence's (none where that is causal attention), made once per forward.
    fn masks(&self, segments: Option<&Segments>, t: i64, device: tch::Device) -> Result<Vec<(Option<i64>, Option<Tensor>)>> {
        let mut windows: Vec<Option<i64>> = self.blocks.iter().map(|b| b.window()).collect();
        windows.sort();
        windows.dedup();
        windows
            .into_iter()
            .map(|w| {
                let mask = match segments {
                    Some(s) => Some(s.mask_within(w.filter(|&w| w < t))?),
                    None => attention::causal_within(t, w, device)?,
                };
                Ok((w, mask))
            })
            .collect()
    }
}

impl<F: Family> Model for Decoder<F> {
    fn forward(&mut self, input: ModelInput) -> Result<ModelOutput> {
        let states = self.hidden(input.tokens, input.segments, input.cache, input.train)?;
        let head = Head { weight: self.family.head().shallow_clone(), softcap: self.family.logit_softcap() };
        Ok(match input.returns {
            Returns::Logits => ModelOutput::Logits(head.logits(&states)?),
            Returns::Hidden => ModelOutput::Hidden { states, head },
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

    fn take_aux_loss(&mut self) -> Option<AuxLoss> {
        self.aux.take()
    }

    fn block_matrices(&self) -> Vec<Tensor> {
        self.blocks.iter().flat_map(|b| b.linears()).map(|l| l.base.ws.shallow_clone()).collect()
    }
}

mod plan;
#[cfg(test)]
mod tests;
