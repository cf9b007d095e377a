// A linear layer whose float32 CPU products run through oneDNN where it is the faster
// kernel, and through ATen's (MKL's) where that is. On the CPU, at::linear and mm call
// MKL's sgemm; libtorch also carries oneDNN (the kernel inductor's CPU code calls, as
// mkldnn::_linear_pointwise), which bench/cpu_gemm.py measured at Qwen2-0.5B's shapes
// faster for every forward `x W^T` and input gradient `dY W` (up to 1.36x) and for the
// weight gradient `dY^T x` of a layer that narrows (the down projection, 1.21x), and
// slower (0.7-0.96x) for the weight gradient of a layer that widens or keeps its width.
// Each product here takes the faster. The sums are reordered, so the values are
// float32 rounding away from at::linear's, not bit for bit.
//
// Process-wide like torch.backends.mkldnn: off until ptx_set_onednn_matmuls turns it on.
// Off, or for anything but float32 CPU tensors outside CPU autocast, at::linear runs.
#include "ptx.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>

#include <atomic>

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

std::atomic<bool> onednn_on{false};

using LinearPointwise = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, c10::string_view,
                                   c10::List<std::optional<at::Scalar>>, std::optional<c10::string_view>);

// mkldnn::_linear_pointwise(X, W, B?, attr, scalars, algorithm): X [M, K] W [N, K]^T (+ B),
// no fused activation. Looked up once; registered by libtorch_cpu where oneDNN is built in.
at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "").typed<LinearPointwise>();
  return op.call(x, w, b, "none", c10::List<std::optional<at::Scalar>>(), std::nullopt);
}

bool available() { return at::hasMKLDNN() && at::globalContext().userEnabledMkldnn(); }

// Whether these operands take oneDNN's kernels: switched on, float32 on the CPU, and
// not in a CPU autocast region (where at::linear would cast to bfloat16 first).
bool takes_onednn(const at::Tensor& x, const at::Tensor& w) {
  return onednn_on.load(std::memory_order_relaxed) && x.device().is_cpu() && w.device().is_cpu() && x.scalar_type() == at::kFloat &&
         w.scalar_type() == at::kFloat && !at::autocast::is_autocast_enabled(at::kCPU);
}

at::Tensor rows(const at::Tensor& t) { return t.reshape({-1, t.size(-1)}); }

// `flat` [rows, n] viewed with `like`'s leading sizes: [.., n].
at::Tensor unrows(const at::Tensor& flat, const at::Tensor& like) {
  auto sizes = like.sizes().vec();
  sizes.back() = flat.size(1);
  return flat.view(sizes);
}

struct OneDnnLinear : public torch::autograd::Function<OneDnnLinear> {
  // `recompute` holds (gate, up), detached, when x = silu(gate) * up (the down
  // projection's input, which the fused SwiGLU keeps gate and up for anyway): then x is
  // not kept for the weight gradient but recomputed in backward, as SwiGlu's forward
  // computes it, so the same values.
  static at::Tensor forward(AutogradContext* ctx, at::Tensor x, at::Tensor w, std::optional<at::Tensor> b, c10::IValue recompute) {
    const bool trains_w = w.requires_grad();
    const bool recomputes = trains_w && recompute.isTuple();
    if (trains_w && !recomputes) {
      ctx->save_for_backward({x, w});
    } else {
      ctx->save_for_backward({w});
    }
    if (recomputes) ctx->saved_data["recompute"] = std::move(recompute);
    // needs_input_grad counts the tensor inputs given: no index for an absent bias.
    ctx->saved_data["has_bias"] = b.has_value();
    return unrows(onednn_linear(rows(x), w, b), x);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& w = saved.back();
    const at::Tensor dy = rows(grads[0]);
    at::Tensor dx, dw, db;
    // dY has x's leading sizes.
    if (ctx->needs_input_grad(0)) dx = unrows(onednn_linear(dy, w.t(), std::nullopt), grads[0]);
    if (ctx->needs_input_grad(1)) {
      at::Tensor x;
      if (saved.size() == 2) {
        x = rows(saved[0]);
      } else {
        auto pair = ctx->saved_data["recompute"].toTuple();
        at::NoGradGuard no_grad;
        x = rows(at::silu(pair->elements()[0].toTensor()).mul(pair->elements()[1].toTensor()));
      }
      // dW [out, in] = dY^T x: oneDNN's kernel where the layer narrows (in > out).
      dw = w.size(1) > w.size(0) ? onednn_linear(dy.t(), x.t(), std::nullopt) : dy.t().mm(x);
    }
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) db = dy.sum(0);
    return {dx, dw, db, at::Tensor()};
  }
};

}  // namespace

extern "C" char* ptx_set_onednn_matmuls(bool on, bool* applied) {
  PTX_TRY
  *applied = on && available();
  onednn_on.store(*applied);
  PTX_CATCH
}

extern "C" char* ptx_onednn_matmuls(bool* on) {
  PTX_TRY
  *on = onednn_on.load();
  PTX_CATCH
}

// `x W^T + b` (b may be null); with gate and up (both or neither), x = silu(gate) * up
// is recomputed in backward instead of kept.
extern "C" char* ptx_linear(ptx_tensor x, ptx_tensor w, ptx_tensor b, ptx_tensor gate, ptx_tensor up, ptx_tensor* out) {
  PTX_TRY
  auto t = [](ptx_tensor p) -> const at::Tensor& { return *static_cast<at::Tensor*>(p); };
  std::optional<at::Tensor> bias;
  if (b) bias = t(b);
  if (!takes_onednn(t(x), t(w))) {
    *out = new at::Tensor(at::linear(t(x), t(w), bias));
  } else {
    c10::IValue recompute;
    if (gate && up) recompute = c10::ivalue::Tuple::create({t(gate).detach(), t(up).detach()});
    *out = new at::Tensor(OneDnnLinear::apply(t(x), t(w), bias, recompute));
  }
  PTX_CATCH
}

// `a W^T` without autograd (the chunked loss's products, computed in no-grad).
extern "C" char* ptx_matmul_t(ptx_tensor a, ptx_tensor w, ptx_tensor* out) {
  PTX_TRY
  auto t = [](ptx_tensor p) -> const at::Tensor& { return *static_cast<at::Tensor*>(p); };
  *out = new at::Tensor(takes_onednn(t(a), t(w)) ? onednn_linear(t(a), t(w), std::nullopt) : at::matmul(t(a), t(w).t()));
  PTX_CATCH
}
