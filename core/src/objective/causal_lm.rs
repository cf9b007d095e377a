//! A causal language model's next-token cross-entropy, over the targets that are
//! not [`IGNORE_INDEX`]: per micro-batch mean on text windows, per trained token on
//! instruction data. With `train.loss_chunk` and a model that hands out its hidden
//! states, the loss is computed a chunk of positions at a time and the whole logits
//! never exist.

use tch::{Kind, Reduction, Tensor};

use super::{chunked, cross_entropy, Count, Forward, Objective, Sum, IGNORE_INDEX};
use crate::{
    data::Batch,
    error::{Error, Result},
};

/// Text windows: every target weighs alike, so a micro-batch's loss is its mean
/// and the step's the mean of its micro-batches'.
pub struct CausalLmMean {
    /// `train.loss_chunk` (0: the whole logits).
    pub chunk: i64,
}

/// Instruction data: rows differ in length and in how many of their tokens are
/// trained, so the step's loss is the sum over its trained tokens divided by their
/// number in the whole step (each batch counts them on the host:
/// [`crate::data::Payload::TrainedTokens`]).
pub struct CausalLmPerToken {
    /// `train.loss_chunk` (0: the whole logits).
    pub chunk: i64,
}

/// The summed loss a chunk of positions at a time, when asked for and the model
/// can: `None` otherwise.
fn chunked_sum(chunk: i64, model: &mut dyn Forward, batch: &Batch, train: bool) -> Result<Option<Tensor>> {
    if chunk == 0 {
        return Ok(None);
    }
    model.forward_hidden(batch, train)?.map(|(hidden, weight)| chunked::summed(&hidden, &weight, &batch.targets, None, chunk)).transpose()
}

impl Objective for CausalLmMean {
    fn name(&self) -> &'static str {
        "causal_lm_mean"
    }

    fn count(&self, _batch: &Batch) -> Result<Count> {
        Ok(Count::MicroBatch)
    }

    fn sum(&self, model: &mut dyn Forward, batch: &Batch, train: bool) -> Result<Sum> {
        if let Some(sum) = chunked_sum(self.chunk, model, batch, train)? {
            // Training divides in float32, the loss's type; evaluation in float64,
            // the type it adds its batches up in.
            let (sum, kind) = if train { (sum, Kind::Float) } else { (sum.f_to_kind(Kind::Double)?, Kind::Double) };
            let trained = batch.targets.f_ne(IGNORE_INDEX)?.f_sum(kind)?.f_clamp_min(1.0)?;
            return Ok(Sum { loss: sum.f_div(&trained)?, metrics: Vec::new(), means: Vec::new(), logits: None });
        }
        let logits = model.forward(batch, train)?;
        Ok(Sum { loss: cross_entropy(&logits, &batch.targets, Reduction::Mean)?, metrics: Vec::new(), means: Vec::new(), logits: Some(logits) })
    }
}

impl Objective for CausalLmPerToken {
    fn name(&self) -> &'static str {
        "causal_lm_per_token"
    }

    fn count(&self, batch: &Batch) -> Result<Count> {
        let trained = batch.payload.trained_tokens().ok_or_else(|| {
            Error::Other("the per-token loss of instruction data needs batches that count their trained tokens (Payload::TrainedTokens)".into())
        })?;
        Ok(Count::Units(trained.max(0) as u64))
    }

    fn sum(&self, model: &mut dyn Forward, batch: &Batch, train: bool) -> Result<Sum> {
        if let Some(sum) = chunked_sum(self.chunk, model, batch, train)? {
            return Ok(Sum { loss: sum, metrics: Vec::new(), means: Vec::new(), logits: None });
        }
        let logits = model.forward(batch, train)?;
        Ok(Sum { loss: cross_entropy(&logits, &batch.targets, Reduction::Sum)?, metrics: Vec::new(), means: Vec::new(), logits: Some(logits) })
    }
}
