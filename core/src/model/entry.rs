//! The one way into a model, [`super::Model::forward`]: what it is given
//! ([`ModelInput`]) and what it gives back ([`ModelOutput`]).

use tch::Tensor;

use super::{KvCache, Segments};
use crate::error::Result;

/// One forward's input. A model that reads only `tokens` and `train` (as a
/// classifier does) is complete: the other fields are only set for models whose
/// [`super::Model::supports`] and [`super::Model::new_cache`] say they honour them.
pub struct ModelInput<'a> {
    /// `[B, T]` int64 tokens, or `[B, F]` float features.
    pub tokens: &'a Tensor,
    /// Packed rows and shared-prefix pairs: each token's position, row and prefix.
    pub segments: Option<&'a Segments>,
    /// Incremental decoding: `tokens` are placed after the positions the cache holds,
    /// which then holds them too.
    pub cache: Option<&'a mut KvCache>,
    /// Training (dropout on) or evaluation.
    pub train: bool,
    pub returns: Returns,
}

/// What a forward returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Returns {
    Logits,
    /// A language model's hidden states before the output projection, with the
    /// projection's weight, so the loss can be computed a chunk of positions at a time
    /// (`train.loss_chunk`).
    Hidden,
}

impl<'a> ModelInput<'a> {
    /// Logits of plain `tokens`.
    pub fn new(tokens: &'a Tensor, train: bool) -> ModelInput<'a> {
        ModelInput { tokens, segments: None, cache: None, train, returns: Returns::Logits }
    }

    pub fn segments(self, segments: Option<&'a Segments>) -> ModelInput<'a> {
        ModelInput { segments, ..self }
    }

    pub fn cache(self, cache: &'a mut KvCache) -> ModelInput<'a> {
        ModelInput { cache: Some(cache), ..self }
    }

    pub fn returns(self, returns: Returns) -> ModelInput<'a> {
        ModelInput { returns, ..self }
    }
}

/// What a forward gave back.
pub enum ModelOutput {
    /// `[B, C]` for classification, `[B, T, V]` for language models.
    Logits(Tensor),
    /// `states` `[B, T, D]` (final-normed) and the output projection `head`: the
    /// logits are [`Head::logits`] of the states.
    Hidden { states: Tensor, head: Head },
}

impl ModelOutput {
    /// The logits, projecting hidden states if that is what came back.
    pub fn logits(self) -> Result<Tensor> {
        match self {
            ModelOutput::Logits(logits) => Ok(logits),
            ModelOutput::Hidden { states, head } => head.logits(&states),
        }
    }
}

/// A term a model adds to what training minimises besides the objective's loss (a
/// mixture of experts' router losses), from its last forward without a cache
/// ([`super::Model::take_aux_loss`]). Training adds `loss` to each micro-batch's share of
/// the step divided by the step's micro-batches (as transformers adds
/// `router_aux_loss_coef * aux_loss` to each forward's loss), and `metrics` to the
/// objective's, divided alike.
pub struct AuxLoss {
    /// Weighted by its coefficients, with its graph when training; a float scalar.
    pub loss: Tensor,
    /// Named device scalars (`aux_loss`, unweighted, as transformers' `out.aux_loss`).
    pub metrics: Vec<(&'static str, Tensor)>,
}

/// A language model's output projection: the logits of hidden states `h` are
/// `h @ weight^T`, soft-capped to `cap * tanh(logits / cap)` where the model caps its
/// final logits (Gemma 2's `final_logit_softcapping`). It dereferences to `weight`,
/// which is what most of its readers need; whoever computes logits from it (the
/// chunked loss) applies [`Head::cap`] too.
#[derive(Debug)]
pub struct Head {
    /// `[V, D]`.
    pub weight: Tensor,
    pub softcap: Option<f64>,
}

impl Head {
    /// A projection whose logits are not capped.
    pub fn plain(weight: Tensor) -> Head {
        Head { weight, softcap: None }
    }

    /// The logits of `states` `[.., D]`.
    pub fn logits(&self, states: &Tensor) -> Result<Tensor> {
        self.cap(states.f_linear::<Tensor>(&self.weight, None)?)
    }

    /// `logits` soft-capped, in `transformers`' order of operations (divide, tanh,
    /// multiply); unchanged without a cap.
    pub fn cap(&self, logits: Tensor) -> Result<Tensor> {
        match self.softcap {
            Some(cap) => Ok(logits.f_div_scalar(cap)?.f_tanh()?.f_mul_scalar(cap)?),
            None => Ok(logits),
        }
    }
}

impl std::ops::Deref for Head {
    type Target = Tensor;

    fn deref(&self) -> &Tensor {
        &self.weight
    }
}

/// What a model's `forward` honours beyond `tokens` and `train`; the default,
/// nothing, is right for a model that reads only those.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Supports {
    /// [`ModelInput::segments`]: packed rows (`data.packing`) and shared-prefix
    /// pairs. A model without it is never given segments (the run stops with an error
    /// naming the model instead).
    pub segments: bool,
    /// [`Returns::Hidden`] (`train.loss_chunk`). Without it the loss is computed from
    /// the logits.
    pub hidden: bool,
}
