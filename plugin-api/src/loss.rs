//! The training loss's conventions, shared by the host's objectives and by plugins that
//! recompute losses (per-dataset metrics): the label of a target not trained, and the
//! one cross-entropy (feature `tch`), so a plugin's per-token loss is the trainer's.

/// A target no loss is computed on (a prompt's token, padding): PyTorch's `ignore_index`,
/// which Hugging Face's collators write into their labels too.
pub const IGNORE_INDEX: i64 = -100;

/// The cross-entropy of `logits` (`[B, C]` against class ids `[B]`, or a language
/// model's `[B, T, V]` against next tokens `[B, T]`), skipping targets equal to
/// [`IGNORE_INDEX`], reduced by `reduction`: `Mean` over the targets not skipped, `Sum`,
/// or `None` for each target's loss (0 where skipped), shaped as `targets`.
///
/// In float32 even when the logits come out of bf16 autocast (as PyTorch's autocast
/// computes `cross_entropy`): a log-softmax over a large vocabulary in bf16 loses about
/// two decimal digits of the loss and of its gradient.
#[cfg(feature = "tch")]
pub fn cross_entropy(logits: &tch::Tensor, targets: &tch::Tensor, reduction: tch::Reduction) -> Result<tch::Tensor, tch::TchError> {
    use tch::{Kind, Reduction, Tensor};
    let upcast;
    let logits = if matches!(logits.kind(), Kind::BFloat16 | Kind::Half) {
        upcast = logits.f_to_kind(Kind::Float)?;
        &upcast
    } else {
        logits
    };
    // Classification's [B, C] goes in as it is: a view would be one more autograd
    // node per step.
    if logits.dim() == 2 {
        return logits.f_cross_entropy_loss::<Tensor>(targets, None, reduction, IGNORE_INDEX, 0.0);
    }
    let vocab = logits.size().last().copied().unwrap_or(0);
    let loss = logits.f_view([-1, vocab])?.f_cross_entropy_loss::<Tensor>(&targets.f_view([-1])?, None, reduction, IGNORE_INDEX, 0.0)?;
    match reduction {
        Reduction::None => loss.f_view_as(targets),
        _ => Ok(loss),
    }
}
