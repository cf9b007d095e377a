// SwiGLU's gating, silu(gate) * up, keeping only `gate` and `up` for backward (as
// Liger's fused SwiGLU): autograd's two nodes would keep silu(gate) too, one more
// [tokens, intermediate] tensor per block. Backward recomputes silu(gate) and runs
// the very ops autograd's MulBackward0 and SiluBackward0 run, in their order, so the
// gradients are the unfused ones bit for bit.
#include "ptx.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct SwiGlu : public torch::autograd::Function<SwiGlu> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor gate, at::Tensor up) {
    ctx->save_for_backward({gate, up});
    return at::silu(gate).mul(up);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& gate = saved[0];
    const at::Tensor& up = saved[1];
    const at::Tensor& grad = grads[0];
    at::Tensor grad_gate, grad_up;
    // MulBackward0: each factor's gradient is grad times the other factor, in the
    // factor's own type.
    if (ctx->needs_input_grad(1)) grad_up = grad.mul(at::silu(gate)).to(up.scalar_type());
    if (ctx->needs_input_grad(0)) grad_gate = at::silu_backward(grad.mul(up).to(gate.scalar_type()), gate);
    return {grad_gate, grad_up};
  }
};

extern "C" char* ptx_swiglu(ptx_tensor gate, ptx_tensor up, ptx_tensor* out) {
  PTX_TRY
  auto t = [](ptx_tensor p) { return *static_cast<at::Tensor*>(p); };
  *out = new at::Tensor(SwiGlu::apply(t(gate), t(up)));
  PTX_CATCH
}
