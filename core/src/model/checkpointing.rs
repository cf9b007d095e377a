//! `train.activation_checkpointing`: the decoder blocks that keep only their input in
//! forward and are recomputed in backward, through torch-ext's checkpoint Function
//! (the reentrant `torch.utils.checkpoint`).

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

/// Which of `blocks` blocks `train` checkpoints.
pub(super) fn chosen(train: &TrainConfig, blocks: usize) -> Result<Vec<bool>> {
    let chosen: Vec<bool> = (0..blocks).map(|i| train.checkpoints_layer(i)).collect();
    // every_n with N above the depth would checkpoint nothing and look as if it did.
    if train.activation_checkpointing == ActivationCheckpointing::EveryN && !chosen.contains(&true) {
        return Err(Error::Config(ConfigError {
            origin: "configuration".into(),
            key: "train.activation_checkpointing_every".into(),
            message: format!(
                "{} is more than the model's {blocks} blocks: no block would be checkpointed (at most {blocks}, or activation_checkpointing = \"full\")",
                train.activation_checkpointing_every,
            ),
        }));
    }
    Ok(chosen)
}

impl Checkpoints {
    /// A checkpoint for each block `chosen` marks. `forward(i)` is block i's training
    /// forward over the inputs [`Checkpoints::run`] is given: the hidden state, then
    /// the extras (RoPE tables, an attention mask).
    pub(super) fn new<F>(chosen: &[bool], forward: impl Fn(usize) -> F) -> Result<Checkpoints>
    where
        F: Fn(&[Tensor]) -> Result<Tensor> + Send + Sync + 'static,
    {
        let mut out = Vec::with_capacity(chosen.len());
        for (i, &on) in chosen.iter().enumerate() {
            let made = match on {
                true => {
                    let block = forward(i);
                    Some(Checkpoint::new(move |inputs: &[Tensor]| block(inputs).map_err(|e| e.to_string())).map_err(torch)?)
                }
                false => None,
            };
            out.push(made);
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
