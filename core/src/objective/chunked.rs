//! The output projection and the cross-entropy, `chunk` positions at a time, so that
//! only one chunk's logits ever exist (`train.loss_chunk`): a batch of 8 x 1024
//! positions over Qwen2's 151,936 ids is 5 GB of float32 logits, and as much again
//! for their gradient.
//!
//! As Liger's fused linear cross-entropy and torchtune's `LinearCrossEntropyLoss`,
//! the gradient of each chunk is computed in the forward pass: for the summed loss,
//! d/dlogits = softmax(logits) - onehot(target) on trained positions, so the
//! hidden states get `g @ W` and the projection `g^T @ h`. The loss returned has
//! the summed loss as its value and those gradients through a surrogate
//! (`h . grad_h + W . grad_W`, minus its own value), so backward
//! needs nothing more. Logits and softmax are float32 whatever the hidden states'
//! type. The three GEMMs run in the hidden states' type (the learner hands them out
//! in bf16 under bf16 autocast): then the gradient `g` is rounded to bf16 for its
//! two, as the whole-logits path's backward does, and each chunk's `g^T h` is summed
//! into a float32 `grad_W`. Where the model soft-caps its logits (the [`Head`] says
//! so), each chunk's are capped, and `g` goes through the cap's derivative.

use tch::{Device, Kind, Tensor};

use super::IGNORE_INDEX;
use crate::{
    error::{Error, Result},
    model::Head,
};

/// `a W^T` (2-D): through oneDNN's float32 CPU product where `run.cpu_matmul` chose it
/// (faster than MKL's for these two products at Qwen2's 151,936 ids; the weight
/// gradient `g^T h` stays MKL's, faster there), else `matmul`.
fn matmul_t(a: &Tensor, w: &Tensor) -> Result<Tensor> {
    ptrain_torch_ext::linear::matmul_t(a, w).map_err(|e| Error::Other(format!("chunked loss: {e}")))
}

/// Hidden states `[N, D]` and targets `[N]` flattened from `[.., D]` and `[..]`;
/// on the CPU, only the trained positions (with their indices into the flattened
/// targets). On a GPU, finding them is a host/device synchronisation: there every
/// position is computed and the untrained ones masked.
fn trained_positions(hidden: &Tensor, targets: &Tensor) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    let width = hidden.size().last().copied().ok_or_else(|| Error::Other("chunked loss: hidden states without a width".into()))?;
    let h = hidden.f_reshape([-1, width])?;
    let y = targets.f_reshape([-1])?;
    if h.device() != Device::Cpu {
        return Ok((h, y, None));
    }
    let trained = y.f_ne(IGNORE_INDEX)?.f_nonzero()?.f_squeeze_dim(1)?;
    Ok((h.f_index_select(0, &trained)?, y.f_index_select(0, &trained)?, Some(trained)))
}

/// Turns `logits` `[len, V]` into `exp(logits - max)` in place (each row's max) and
/// returns each row's sum of those `[len, 1]` and its logsumexp `log(sum) + max`
/// `[len]`: `f_logsumexp`'s arithmetic (bit for bit on finite logits), without its `[len, V]`
/// temporary `logits - max` (297 MiB at 512 positions of Qwen2's 151,936 ids). The
/// softmax is then this buffer divided by the sums.
fn exp_shifted_(logits: &mut Tensor) -> Result<(Tensor, Tensor)> {
    let max = logits.f_amax([-1], true)?;
    let _ = logits.f_sub_(&max)?.f_exp_()?;
    let sums = logits.f_sum_dim_intlist(Some(&[-1i64][..]), true, Kind::Float)?;
    let lse = sums.f_log()?.f_add(&max)?.f_squeeze_dim(1)?;
    Ok((sums, lse))
}

/// The cross-entropy summed over the positions whose target is not
/// [`IGNORE_INDEX`], of the logits `hidden [.., D] @ weight [V, D]^T` (the `head`'s,
/// soft-capped if it says so), computed
/// `chunk` positions at a time; with `scale` (float32, shaped as `targets`, no
/// gradient), each position's cross-entropy multiplied by its scale: DPO's
/// gradient, where each completion's log-probability weighs as the pair's loss
/// says ([`super::dpo`]).
pub fn summed(hidden: &Tensor, head: &Head, targets: &Tensor, scale: Option<&Tensor>, chunk: i64) -> Result<Tensor> {
    let weight = &head.weight;
    let (h, y, trained) = trained_positions(hidden, targets)?;
    let width = h.size()[1];
    let scale = match (scale, &trained) {
        (None, _) => None,
        (Some(s), None) => Some(s.f_reshape([-1])?),
        (Some(s), Some(trained)) => Some(s.f_reshape([-1])?.f_index_select(0, trained)?),
    };
    let n = h.size()[0];
    // A frozen head (LoRA's tied embedding) gets no gradient: skip its [V, D] GEMM per chunk.
    let trains_w = weight.requires_grad();
    let (grad_h, grad_w, loss) = tch::no_grad(|| -> Result<(Tensor, Option<Tensor>, Tensor)> {
        let w = weight.f_detach()?.f_to_kind(h.kind())?;
        // float32 hidden states: the gradient GEMMs in float32 against float32 weights.
        let w32 = if h.kind() == Kind::Float { Some(weight.f_detach()?.f_to_kind(Kind::Float)?) } else { None };
        let grad_h = Tensor::f_zeros([n, width], (h.kind(), h.device()))?;
        let mut grad_w = if trains_w { Some(Tensor::f_zeros(weight.size(), (Kind::Float, h.device()))?) } else { None };
        let mut loss = Tensor::f_zeros([], (Kind::Float, h.device()))?;
        let mut start = 0;
        while start < n {
            let len = chunk.min(n - start);
            let hc = h.f_narrow(0, start, len)?.f_detach()?;
            let yc = y.f_narrow(0, start, len)?;
            let (mut logits, tanh) = capped(head, matmul_t(&hc, &w)?.f_to_kind(Kind::Float)?)?;
            let mut valid = yc.f_ne(IGNORE_INDEX)?.f_to_kind(Kind::Float)?;
            if let Some(scale) = &scale {
                valid = valid.f_mul(&scale.f_narrow(0, start, len)?)?;
            }
            let index = yc.f_clamp_min(0)?.f_unsqueeze(1)?;
            let picked = logits.f_gather(1, &index, false)?.f_squeeze_dim(1)?;
            let (sums, lse) = exp_shifted_(&mut logits)?;
            loss = loss.f_add(&lse.f_sub(&picked)?.f_mul(&valid)?.f_sum(Kind::Float)?)?;
            // (softmax - onehot) * valid, in the logits' own buffer: exp(x - max) * valid / sum,
            // then -valid at each target.
            let valid = valid.f_unsqueeze(1)?;
            let _ = logits.f_mul_(&valid.f_div(&sums)?)?;
            let _ = logits.f_scatter_add_(1, &index, &valid.f_neg()?)?;
            // Through the cap: d(c tanh(z / c)) / dz = 1 - tanh(z / c)^2.
            if let Some(tanh) = tanh {
                let _ = logits.f_mul_(&tanh.f_square()?.f_neg()?.f_add_scalar(1.0)?)?;
            }
            match &w32 {
                Some(w32) => {
                    grad_h.f_narrow(0, start, len)?.f_copy_(&matmul_t(&logits, &w32.f_tr()?)?)?;
                    // grad_W += g^T h, in place: no [V, D] temporary per chunk.
                    if let Some(grad_w) = grad_w.as_mut() {
                        let _ = grad_w.f_addmm_(&logits.f_tr()?, &hc)?;
                    }
                }
                None => {
                    let g = logits.f_to_kind(h.kind())?;
                    grad_h.f_narrow(0, start, len)?.f_copy_(&g.f_matmul(&w)?)?;
                    if let Some(grad_w) = grad_w.as_mut() {
                        let _ = grad_w.f_add_(&g.f_tr()?.f_matmul(&hc)?)?;
                    }
                }
            }
            start += len;
        }
        Ok((grad_h, grad_w, loss))
    })?;
    let grad_w = grad_w.map(|g| g.f_to_kind(weight.kind())).transpose()?;
    ptrain_torch_ext::precomputed(&h, weight, &loss, grad_h, grad_w).map_err(|e| Error::Other(format!("chunked loss: {e}")))
}

/// `logits` (float32) soft-capped as `head` says, with `tanh(logits / cap)` for the
/// cap's derivative; unchanged (and `None`) without a cap.
fn capped(head: &Head, logits: Tensor) -> Result<(Tensor, Option<Tensor>)> {
    match head.softcap {
        Some(cap) => {
            let tanh = logits.f_div_scalar(cap)?.f_tanh()?;
            Ok((tanh.f_mul_scalar(cap)?, Some(tanh)))
        }
        None => Ok((logits, None)),
    }
}

/// Each position's log-probability of its target under the logits
/// `hidden [.., D] @ weight [V, D]^T` (the `head`'s, soft-capped if it says so),
/// float32 shaped as `targets` (0 where the target is [`IGNORE_INDEX`]), `chunk`
/// positions at a time, without gradient.
pub fn token_logps(hidden: &Tensor, head: &Head, targets: &Tensor, chunk: i64) -> Result<Tensor> {
    Ok(token_values(hidden, head, targets, chunk, false)?.0)
}

/// [`token_logps`], and each position's logits averaged over the vocabulary (TRL's
/// `mean_logits`, for DPO's `logits/chosen`), from the same chunks' logits.
pub fn token_logps_and_logit_means(hidden: &Tensor, head: &Head, targets: &Tensor, chunk: i64) -> Result<(Tensor, Tensor)> {
    let (logps, means) = token_values(hidden, head, targets, chunk, true)?;
    Ok((logps, means.ok_or_else(|| Error::Other("chunked loss: no logit means".into()))?))
}

fn token_values(hidden: &Tensor, head: &Head, targets: &Tensor, chunk: i64, with_means: bool) -> Result<(Tensor, Option<Tensor>)> {
    tch::no_grad(|| {
        let (h, y, trained) = trained_positions(hidden, targets)?;
        let w = head.weight.f_to_kind(h.kind())?;
        let n = h.size()[0];
        let mut pieces = Vec::with_capacity((n / chunk.max(1) + 1) as usize);
        let mut means = Vec::new();
        let mut start = 0;
        while start < n {
            let len = chunk.min(n - start);
            let yc = y.f_narrow(0, start, len)?;
            let mut logits = head.cap(matmul_t(&h.f_narrow(0, start, len)?, &w)?.f_to_kind(Kind::Float)?)?;
            let is_trained = yc.f_ne(IGNORE_INDEX)?;
            if with_means {
                means.push(logits.f_mean_dim(Some(&[1i64][..]), false, Kind::Float)?.f_mul(&is_trained)?);
            }
            let picked = logits.f_gather(1, &yc.f_clamp_min(0)?.f_unsqueeze(1)?, false)?.f_squeeze_dim(1)?;
            let (_, lse) = exp_shifted_(&mut logits)?;
            pieces.push(picked.f_sub(&lse)?.f_mul(&is_trained)?);
            start += len;
        }
        // The pieces placed back at their positions, shaped as `targets`.
        let place = |pieces: &[Tensor]| -> Result<Tensor> {
            let values = match pieces.is_empty() {
                true => Tensor::f_zeros([0], (Kind::Float, h.device()))?,
                false => Tensor::f_cat(pieces, 0)?,
            };
            let all = match &trained {
                None => values,
                Some(trained) => Tensor::f_zeros([targets.numel() as i64], (Kind::Float, h.device()))?.f_index_copy(0, trained, &values)?,
            };
            Ok(all.f_view_as(targets)?)
        };
        Ok((place(&pieces)?, if with_means { Some(place(&means)?) } else { None }))
    })
}

#[cfg(test)]
mod tests {
    use tch::Reduction;

    use super::*;

    #[test]
    fn loss_and_gradients_equal_the_whole_logits_computation() {
        tch::manual_seed(3);
        let (n, d, v) = (37, 16, 50);
        let weight = Tensor::randn([v, d], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let hidden = Tensor::randn([n, d], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let targets = Tensor::randint(v, [n], (Kind::Int64, Device::Cpu));
        let _ = targets.narrow(0, 5, 7).fill_(IGNORE_INDEX);

        let whole = hidden.matmul(&weight.tr()).cross_entropy_loss::<Tensor>(&targets, None, Reduction::Sum, IGNORE_INDEX, 0.0);
        whole.backward();
        let (gh, gw) = (hidden.grad().copy(), weight.grad().copy());
        let _ = hidden.grad().zero_();
        let _ = weight.grad().zero_();

        let chunked = summed(&hidden, &Head::plain(weight.shallow_clone()), &targets, None, 8).unwrap();
        chunked.backward();
        let rel = |a: &Tensor, b: &Tensor| ((a - b).abs().max().double_value(&[])) / b.abs().max().double_value(&[]).max(1e-12);
        assert!(rel(&chunked, &whole) < 1e-6, "loss {chunked} vs {whole}");
        assert!(rel(&hidden.grad(), &gh) < 1e-6, "hidden gradient");
        assert!(rel(&weight.grad(), &gw) < 1e-6, "weight gradient");
    }

    #[test]
    fn scaled_positions_and_token_log_probabilities_equal_the_whole_logits_ones() {
        tch::manual_seed(4);
        let (rows, t, d, v) = (3, 13, 16, 50);
        let weight = Tensor::randn([v, d], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let hidden = Tensor::randn([rows, t, d], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let targets = Tensor::randint(v, [rows, t], (Kind::Int64, Device::Cpu));
        let _ = targets.narrow(1, 0, 4).fill_(IGNORE_INDEX);
        let scale = Tensor::randn([rows, t], (Kind::Float, Device::Cpu));
        let rel = |a: &Tensor, b: &Tensor| ((a - b).abs().max().double_value(&[])) / b.abs().max().double_value(&[]).max(1e-12);

        let per_token =
            hidden.matmul(&weight.tr()).view([-1, v]).cross_entropy_loss::<Tensor>(&targets.view([-1]), None, Reduction::None, IGNORE_INDEX, 0.0);
        let whole_logps = per_token.neg().view([rows, t]);
        let logps = token_logps(&hidden, &Head::plain(weight.shallow_clone()), &targets, 5).unwrap();
        assert!(rel(&logps, &whole_logps) < 1e-6, "token log-probabilities {logps} vs {whole_logps}");
        assert!(!logps.requires_grad());

        let whole = (per_token.view([rows, t]) * &scale).sum(Kind::Float);
        whole.backward();
        let (gh, gw) = (hidden.grad().copy(), weight.grad().copy());
        let _ = hidden.grad().zero_();
        let _ = weight.grad().zero_();
        let chunked = summed(&hidden, &Head::plain(weight.shallow_clone()), &targets, Some(&scale), 5).unwrap();
        chunked.backward();
        assert!(rel(&chunked, &whole) < 1e-6, "scaled loss {chunked} vs {whole}");
        assert!(rel(&hidden.grad(), &gh) < 1e-6, "hidden gradient");
        assert!(rel(&weight.grad(), &gw) < 1e-6, "weight gradient");
    }

    #[test]
    fn bf16_hidden_states_give_the_float32_result_within_bf16_rounding() {
        tch::manual_seed(5);
        let (n, d, v) = (64, 32, 300);
        let weight = Tensor::randn([v, d], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let hidden = (Tensor::randn([n, d], (Kind::Float, Device::Cpu)) * 0.3).set_requires_grad(true);
        let targets = Tensor::randint(v, [n], (Kind::Int64, Device::Cpu));
        let whole = summed(&hidden, &Head::plain(weight.shallow_clone()), &targets, None, 16).unwrap();
        whole.backward();
        let (gh, gw) = (hidden.grad().copy(), weight.grad().copy());
        let _ = hidden.grad().zero_();
        let _ = weight.grad().zero_();

        // The hidden states in bf16 (as autocast hands them out): the bf16 GEMM path.
        let chunked = summed(&hidden.to_kind(Kind::BFloat16), &Head::plain(weight.shallow_clone()), &targets, None, 16).unwrap();
        chunked.backward();
        let rel = |a: &Tensor, b: &Tensor| ((a.to_kind(Kind::Float) - b).abs().max().double_value(&[])) / b.abs().max().double_value(&[]).max(1e-12);
        assert!(rel(&chunked, &whole) < 2e-2, "loss {chunked} vs {whole}");
        assert!(rel(&hidden.grad(), &gh) < 3e-2, "hidden gradient off by {}", rel(&hidden.grad(), &gh));
        assert!(rel(&weight.grad(), &gw) < 3e-2, "weight gradient off by {}", rel(&weight.grad(), &gw));
    }

    #[test]
    fn soft_capped_logits_give_the_whole_capped_logits_loss_gradients_and_log_probabilities() {
        tch::manual_seed(6);
        let (n, d, v, cap) = (29, 16, 50, 3.0);
        let weight = Tensor::randn([v, d], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let hidden = (Tensor::randn([n, d], (Kind::Float, Device::Cpu)) * 0.5).set_requires_grad(true);
        let targets = Tensor::randint(v, [n], (Kind::Int64, Device::Cpu));
        let head = Head { weight: weight.shallow_clone(), softcap: Some(cap) };
        let logits = head.logits(&hidden).unwrap();
        assert!(logits.abs().max().double_value(&[]) <= cap, "capped at {cap}");
        let whole = logits.cross_entropy_loss::<Tensor>(&targets, None, Reduction::Sum, IGNORE_INDEX, 0.0);
        whole.backward();
        let (gh, gw) = (hidden.grad().copy(), weight.grad().copy());
        let _ = hidden.grad().zero_();
        let _ = weight.grad().zero_();
        let chunked = summed(&hidden, &head, &targets, None, 8).unwrap();
        chunked.backward();
        let rel = |a: &Tensor, b: &Tensor| ((a - b).abs().max().double_value(&[])) / b.abs().max().double_value(&[]).max(1e-12);
        assert!(rel(&chunked, &whole) < 1e-6, "loss {chunked} vs {whole}");
        assert!(rel(&hidden.grad(), &gh) < 1e-5, "hidden gradient off by {}", rel(&hidden.grad(), &gh));
        assert!(rel(&weight.grad(), &gw) < 1e-5, "weight gradient off by {}", rel(&weight.grad(), &gw));
        let uncapped = summed(&hidden, &Head::plain(weight.shallow_clone()), &targets, None, 8).unwrap();
        assert!(rel(&uncapped, &whole) > 1e-2, "the cap changes the loss: {uncapped} vs {whole}");
        let logps = token_logps(&hidden, &head, &targets, 5).unwrap();
        let want = logits.log_softmax(-1, Kind::Float).gather(1, &targets.unsqueeze(1), false).squeeze_dim(1);
        assert!(rel(&logps, &want) < 1e-6, "token log-probabilities {logps} vs {want}");
    }
}
