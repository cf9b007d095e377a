//! Per-block choices of a [`super::Decoder`], fixed when it is built: which blocks are
//! checkpointed, and the [`BlockWrap`] every block's forward runs through.

use std::sync::Arc;

use tch::Tensor;

use super::{Block, BlockInput};
use crate::{
    config::TrainConfig,
    error::Result,
    model::{attention::Attend, checkpointing},
};

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

    /// `true`: every block whole from now on, with no collective in `enter` and
    /// `around`, until `false` releases them (parameter sharding, while GRPO's rollout
    /// stage samples: each rank's sampler runs as many forwards as its own completions
    /// need). Called by every rank together. Default: nothing to do.
    fn hold_whole(&self, _hold: bool) -> Result<()> {
        Ok(())
    }
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

pub(super) fn run_block(
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

/// A checkpointed block's training forward over `[x]`, then RoPE's `[cos, sin]` if
/// any (they come in pairs), then the mask if any, as the checkpoint recomputes it;
/// what the block puts in [`BlockInput::aux`] comes out with its output ([`with_aux`]).
pub(super) fn recompute<B: Block>(block: &B, inputs: &[Tensor]) -> Result<Tensor> {
    let (rotary, rest) = match inputs.len() {
        1 | 2 => (None, &inputs[1..]),
        _ => (Some((&inputs[1], &inputs[2])), &inputs[3..]),
    };
    let mut aux = Vec::new();
    let attend = rest.first().map_or(Attend::Causal, Attend::Masked);
    let out = block.forward(&inputs[0], &mut BlockInput { train: true, rotary, attend, aux: Some(&mut aux) })?;
    with_aux(out, aux)
}

/// A block's output `[B, T, D]` with what it gave for its family's auxiliary loss (a
/// mixture's router logits, `[B x T, E]`) appended as more features: `[B, T, D + E]`.
/// The checkpoint returns one tensor, and the auxiliary loss needs the logits with their
/// graph, which backward recomputes with the block's; [`split_aux`] takes them apart.
fn with_aux(out: Tensor, aux: Vec<Tensor>) -> Result<Tensor> {
    if aux.is_empty() {
        return Ok(out);
    }
    let (b, t, _) = out.size3()?;
    let mut parts = Vec::with_capacity(1 + aux.len());
    for a in aux {
        parts.push(a.f_reshape([b, t, -1])?.f_to_kind(out.kind())?);
    }
    parts.insert(0, out);
    Ok(Tensor::f_cat(&parts, -1)?)
}

/// A checkpointed block's output ([`with_aux`]) back as its hidden state `[B, T, width]`,
/// the features past `width` put in `collected` as one `[B x T, E]` tensor (a block
/// gives one).
pub(super) fn split_aux(out: Tensor, width: i64, collected: Option<&mut Vec<Tensor>>) -> Result<Tensor> {
    let (b, t, total) = out.size3()?;
    if total == width {
        return Ok(out);
    }
    if let Some(collected) = collected {
        collected.push(out.f_narrow(-1, width, total - width)?.f_reshape([b * t, total - width])?);
    }
    Ok(out.f_narrow(-1, 0, width)?)
}
