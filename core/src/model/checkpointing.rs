//! `train.activation_checkpointing`: the blocks of `gpt` and `llama` that keep only
//! their input in forward and are recomputed in backward, through torch-ext's
//! checkpoint Function (the reentrant `torch.utils.checkpoint`).

use std::sync::Arc;

use ptrain_torch_ext::{Checkpoint, TorchError};
use tch::Tensor;

use crate::{
    config::{ActivationCheckpointing, TrainConfig},
    error::{ConfigError, Error, Result},
};

/// One [`Checkpoint`] per checkpointed block, made once with the model: a step
/// allocates no callback context.
#[derive(Default)]
pub(super) struct Checkpoints(Vec<Option<Checkpoint>>);

fn torch(e: TorchError) -> Error {
    Error::Torch(tch::TchError::Torch(e.to_string()))
}

impl Checkpoints {
    /// A checkpoint for each block `train` picks. `forward` is the block's training
    /// forward over the inputs [`Checkpoints::run`] is given: the hidden state, then
    /// the extras (RoPE tables, a packed mask).
    pub(super) fn new<B: Send + Sync + 'static>(
        train: &TrainConfig,
        blocks: &[Arc<B>],
        forward: fn(&B, &[Tensor]) -> Result<Tensor>,
    ) -> Result<Checkpoints> {
        let mut out = Vec::with_capacity(blocks.len());
        for (i, block) in blocks.iter().enumerate() {
            let made = if train.checkpoints_layer(i) {
                let block = Arc::clone(block);
                Some(Checkpoint::new(move |inputs: &[Tensor]| forward(&block, inputs).map_err(|e| e.to_string())).map_err(torch)?)
            } else {
                None
            };
            out.push(made);
        }
        // every_n with N above the depth would checkpoint nothing and look as if it did.
        if train.activation_checkpointing == ActivationCheckpointing::EveryN && out.iter().all(Option::is_none) {
            return Err(Error::Config(ConfigError {
                origin: "configuration".into(),
                key: "train.activation_checkpointing_every".into(),
                message: format!(
                    "{} is more than the model's {} blocks: no block would be checkpointed (at most {}, or activation_checkpointing = \"full\")",
                    train.activation_checkpointing_every,
                    blocks.len(),
                    blocks.len()
                ),
            }));
        }
        Ok(Checkpoints(out))
    }

    /// Block `layer`'s output through its checkpoint, or `None` when it has none or
    /// `train` is off (evaluation and decoding keep no graph: nothing to save).
    pub(super) fn run(&self, layer: usize, train: bool, x: &Tensor, extras: &[&Tensor]) -> Option<Result<Tensor>> {
        let checkpoint = self.0.get(layer)?.as_ref().filter(|_| train)?;
        Some(checkpoint.apply(x, extras).map_err(torch))
    }
}
