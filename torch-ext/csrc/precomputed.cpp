// A value whose gradients were computed in the forward pass (the chunked
// cross-entropy computes d loss / d hidden and d loss / d weight chunk by chunk).
// Forward returns the value; backward hands the precomputed gradients on, scaled by
// the incoming gradient in place and moved out of the graph. The surrogate this
// replaces (h . grad_h + W . grad_W) kept grad_W saved for its backward and made a
// scaled copy of it there: two [V, D] buffers beside the one gradient, at the end
// of backward, where the embedding's own gradient is made too.
#include "ptx.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct Precomputed : public torch::autograd::Function<Precomputed> {
  // `hidden`, `weight`: what the gradients are for; `value` is returned. The
  // gradients come as IValues so that they are not inputs of the graph (and an
  // undefined `grad_weight`, a frozen weight, is allowed).
  static variable_list forward(AutogradContext* ctx, at::Tensor hidden, at::Tensor weight, at::Tensor value, c10::IValue grad_hidden,
                               c10::IValue grad_weight) {
    ctx->saved_data["grad_hidden"] = std::move(grad_hidden);
    ctx->saved_data["grad_weight"] = std::move(grad_weight);
    return {value.clone()};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    // Taken out of the context: the returned tensors are then the only references,
    // so autograd accumulates into them instead of copying them.
    auto take = [&](const char* key) {
      c10::IValue saved = ctx->saved_data[key];
      at::Tensor t = saved.isTensor() ? saved.toTensor() : at::Tensor();
      ctx->saved_data.erase(key);
      return t;
    };
    at::Tensor grad_hidden = take("grad_hidden");
    at::Tensor grad_weight = take("grad_weight");
    const at::Tensor& g = grads[0];
    // d value / d value is 1 unless the loss was scaled (1 / tokens, accumulation).
    if (g.defined()) {
      grad_hidden.mul_(g);
      if (grad_weight.defined()) grad_weight.mul_(g);
    }
    // One entry per argument of forward, the non-tensor ones included.
    return {grad_hidden, grad_weight, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

extern "C" char* ptx_precomputed(ptx_tensor hidden, ptx_tensor weight, ptx_tensor value, ptx_tensor grad_hidden, ptx_tensor grad_weight,
                                 ptx_tensor* out) {
  PTX_TRY
  auto t = [](ptx_tensor p) { return p == nullptr ? at::Tensor() : *static_cast<at::Tensor*>(p); };
  auto ivalue = [&](ptx_tensor p) { return p == nullptr ? c10::IValue() : c10::IValue(t(p)); };
  auto outputs = Precomputed::apply(t(hidden), t(weight), t(value), ivalue(grad_hidden), ivalue(grad_weight));
  *out = new at::Tensor(outputs[0]);
  PTX_CATCH
}
