// Fused optimizer steps and on-device gradient clipping: what torch.optim does with
// fused=True / foreach=True, and clip_grad_norm_ without a host sync.
#include "ptx.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/_fused_sgd.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/stack.h>
#include <vector>

static std::vector<at::Tensor> list(ptx_tensor* ts, int64_t n) {
  std::vector<at::Tensor> out;
  out.reserve(n);
  for (int64_t i = 0; i < n; i++) out.push_back(*static_cast<at::Tensor*>(ts[i]));
  return out;
}

static std::optional<at::Tensor> maybe(ptx_tensor t) {
  if (t == nullptr) return std::nullopt;
  return *static_cast<at::Tensor*>(t);
}

extern "C" void ptx_free(char* message) { std::free(message); }

// `steps` holds one float tensor per parameter (it may repeat one tensor); the
// caller increments it before the call, as torch.optim does. `lr_tensor`, when not
// null, is the learning rate as a 0-dim tensor read by the kernel (float32 on CUDA,
// where a captured step replays with what it then holds; on the CPU the kernel reads
// its value), else `lr` is.
extern "C" char* ptx_fused_adamw(ptx_tensor* params, ptx_tensor* grads, ptx_tensor* exp_avgs,
                                 ptx_tensor* exp_avg_sqs, ptx_tensor* steps, int64_t n, double lr,
                                 ptx_tensor lr_tensor, double beta1, double beta2,
                                 double weight_decay, double eps, ptx_tensor found_inf) {
  PTX_TRY
  auto ps = list(params, n), gs = list(grads, n), ms = list(exp_avgs, n), vs = list(exp_avg_sqs, n);
  auto ss = list(steps, n);
  if (lr_tensor != nullptr) {
    at::_fused_adamw_(ps, gs, ms, vs, {}, ss, *static_cast<at::Tensor*>(lr_tensor), beta1, beta2,
                      weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false,
                      /*grad_scale=*/std::nullopt, maybe(found_inf));
  } else {
    at::_fused_adamw_(ps, gs, ms, vs, {}, ss, lr, beta1, beta2, weight_decay, eps,
                      /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/std::nullopt,
                      maybe(found_inf));
  }
  PTX_CATCH
}

// Momentum buffers start at zero, which with dampening 0 equals torch's first-step
// initialisation (buf = grad), so is_first_step is always false.
extern "C" char* ptx_fused_sgd(ptx_tensor* params, ptx_tensor* grads, ptx_tensor* momentum_bufs,
                               int64_t n, double lr, ptx_tensor lr_tensor, double momentum,
                               double weight_decay, bool nesterov, ptx_tensor found_inf) {
  PTX_TRY
  std::vector<at::Tensor> bufs = momentum > 0 ? list(momentum_bufs, n) : std::vector<at::Tensor>{};
  if (lr_tensor != nullptr) {
    at::_fused_sgd_(list(params, n), list(grads, n), bufs, weight_decay, momentum,
                    *static_cast<at::Tensor*>(lr_tensor), /*dampening=*/0.0, nesterov,
                    /*maximize=*/false, /*is_first_step=*/false, /*grad_scale=*/std::nullopt,
                    maybe(found_inf));
  } else {
    at::_fused_sgd_(list(params, n), list(grads, n), bufs, weight_decay, momentum, lr,
                    /*dampening=*/0.0, nesterov, /*maximize=*/false, /*is_first_step=*/false,
                    /*grad_scale=*/std::nullopt, maybe(found_inf));
  }
  PTX_CATCH
}

// Global L2 norm of all gradients; when max_norm > 0 scales them so it is at most
// max_norm. Everything stays on the device. Writes the norm tensor to *out_norm.
extern "C" char* ptx_clip_grad_norm(ptx_tensor* grads, int64_t n, double max_norm,
                                    ptx_tensor* out_norm) {
  PTX_TRY
  auto gs = list(grads, n);
  auto norms = at::_foreach_norm(gs, 2);
  auto total = at::linalg_vector_norm(at::stack(norms), 2);
  if (max_norm > 0) {
    auto coef = total.add(1e-6).reciprocal().mul(max_norm).clamp_max(1.0);
    at::_foreach_mul_(gs, coef);
  }
  *out_norm = new at::Tensor(std::move(total));
  PTX_CATCH
}

#include <ATen/ops/_foreach_zero.h>

extern "C" char* ptx_foreach_zero(ptx_tensor* ts, int64_t n) {
  PTX_TRY
  at::_foreach_zero_(list(ts, n));
  PTX_CATCH
}
