//! Classification: the cross-entropy of each micro-batch's class logits, its mean
//! (every sample weighs alike), and in evaluation the accuracy.

use tch::{Kind, Reduction};

use super::{cross_entropy, Count, Forward, Objective, Sum};
use crate::{data::Batch, error::Result};

pub struct Classification;

impl Objective for Classification {
    fn name(&self) -> &'static str {
        "classification"
    }

    fn count(&self, _batch: &Batch) -> Result<Count> {
        Ok(Count::MicroBatch)
    }

    fn sum(&self, model: &mut dyn Forward, batch: &Batch, train: bool) -> Result<Sum> {
        let logits = model.forward(batch, train)?;
        let loss = cross_entropy(&logits, &batch.targets, Reduction::Mean)?;
        // The accuracy costs an argmax: evaluation only. It is the micro-batch's
        // mean, as the loss is, and is averaged as the loss is.
        let metrics = match train {
            true => Vec::new(),
            false => {
                let right = logits.f_argmax(-1, false)?.f_eq_tensor(&batch.targets)?.f_sum(Kind::Double)?;
                vec![("accuracy", right.f_div_scalar(batch.targets.size()[0].max(1) as f64)?)]
            }
        };
        Ok(Sum { loss, metrics, means: Vec::new(), logits: Some(logits) })
    }
}
