//! The one cross-entropy every objective computes, and the ignore index: defined in
//! plugin-api ([`ptrain_plugin_api::loss`]), so that plugins that recompute a loss
//! (`dataset-metrics`) compute the trainer's.

use tch::{Reduction, Tensor};

pub use ptrain_plugin_api::loss::IGNORE_INDEX;

use crate::error::Result;

/// [`ptrain_plugin_api::loss::cross_entropy`]: `logits` against `targets`, skipping
/// [`IGNORE_INDEX`], in float32 whatever the logits' type.
pub fn cross_entropy(logits: &Tensor, targets: &Tensor, reduction: Reduction) -> Result<Tensor> {
    Ok(ptrain_plugin_api::loss::cross_entropy(logits, targets, reduction)?)
}
