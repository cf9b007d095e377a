//! The model as an objective sees it ([`Forward`]), and the one way a run calls a
//! model for it ([`Runner`]): under the run's precision, refusing packed rows the
//! model cannot honour. The learner's policy and DPO's reference model both run
//! through [`Runner`], so the two cannot drift apart (they once did: the reference's
//! copy lacked the refusal of packed rows).

use tch::{Kind, Tensor};

use crate::{
    data::Batch,
    error::{Error, Result},
    model::{Head, Model, ModelInput, ModelOutput, Returns},
};

/// The model being trained, as an objective sees it.
pub trait Forward {
    /// The logits of a batch: `[B, C]` for classification, `[B, T, V]` for a language model.
    fn forward(&mut self, batch: &Batch, train: bool) -> Result<Tensor>;

    /// A language model's hidden states `[B, T, D]` and output projection `[V, D]`
    /// (with its logits' soft cap, if any), for a loss computed a chunk of positions at
    /// a time; `None` for a model without that split (see [`crate::model::Returns::Hidden`]).
    fn forward_hidden(&mut self, batch: &Batch, train: bool) -> Result<Option<(Tensor, Head)>>;
}

/// A model run as the run runs it: under bf16 autocast when the run is in bf16
/// (`autocast`: `Some(true)` on CUDA, `Some(false)` on the CPU; the objective computes
/// its loss in float32, see [`crate::objective::cross_entropy`]).
pub struct Runner<'a> {
    pub model: &'a mut dyn Model,
    pub autocast: Option<bool>,
}

impl Runner<'_> {
    /// The model's forward over a batch (its packed rows included).
    pub fn output(&mut self, batch: &Batch, train: bool, returns: Returns) -> Result<ModelOutput> {
        let model = &mut *self.model;
        if batch.segments.is_some() && !model.supports().segments {
            return Err(Error::Other(format!("model.kind {:?} cannot train on packed sequences (data.packing = true)", model.kind())));
        }
        let mut run = || model.forward(ModelInput::new(&batch.inputs, train).segments(batch.segments.as_ref()).returns(returns));
        match self.autocast {
            None => run(),
            Some(cuda) => ptrain_torch_ext::autocast_bf16(cuda, run).map_err(|e| Error::Other(format!("autocast: {e}")))?,
        }
    }
}

impl Forward for Runner<'_> {
    /// The logits of a batch (its packed rows included).
    fn forward(&mut self, batch: &Batch, train: bool) -> Result<Tensor> {
        self.output(batch, train, Returns::Logits)?.logits()
    }

    /// A language model's hidden states and output projection, under autocast like
    /// [`Forward::forward`]; `None` when the model has no such split (the loss is
    /// then computed from the logits).
    fn forward_hidden(&mut self, batch: &Batch, train: bool) -> Result<Option<(Tensor, Head)>> {
        if !self.model.supports().hidden {
            return Ok(None);
        }
        match self.output(batch, train, Returns::Hidden)? {
            // Under bf16 autocast the whole logits' head runs in bf16 (autocast casts the
            // final norm's float32 output); the chunked loss takes its GEMM dtype from the
            // states, so they go to it in bf16: in float32 those GEMMs made a Qwen2-0.5B
            // step on an H200 take twice as long as with the whole logits.
            ModelOutput::Hidden { states, head } if self.autocast.is_some() => Ok(Some((states.f_to_kind(Kind::BFloat16)?, head))),
            ModelOutput::Hidden { states, head } => Ok(Some((states, head))),
            ModelOutput::Logits(_) => Err(Error::Other(format!("model {:?} returned logits when asked for hidden states", self.model.kind()))),
        }
    }
}
