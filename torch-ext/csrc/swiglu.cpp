// SwiGLU's gating, silu(gate) * up, keeping only `gate` and `up` for backward (as
// Liger's fused SwiGLU): autograd's two nodes would keep silu(gate) too, one more
// [tokens, intermediate] tensor per block. Backward recomputes silu(gate) and runs
// the very ops autograd's MulBackward0 and SiluBackward0 run, in their order, so the
// gradients are the unfused ones bit for bit.
#include "ptx.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/generated/Functions.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

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

// Op-level selective recompute of the SwiGLU product (the down projection's input):
// every tensor the graph from `out` back to `product` saves that is `product` (or a
// view of it: matmul's folded [tokens, intermediate]) is dropped and recomputed as
// silu(gate) * up when backward unpacks it, through autograd's saved-tensor hooks
// (what Python's `grad_fn._raw_saved_self.register_hooks` reaches). Autograd's own
// backward then runs on the same values, bit for bit. The nodes that save a matmul's
// input: MmBackward0 (at::linear without bias) and AddmmBackward0 (with one).

namespace {

using torch::autograd::Node;
using torch::autograd::SavedVariable;

struct RecomputedProduct : public torch::autograd::SavedVariableHooks {
  RecomputedProduct(const at::Tensor& gate, const at::Tensor& up, int64_t product_offset)
      : gate_(gate.detach()), up_(up.detach()), product_offset_(product_offset) {}

  // Called once, as the hook is registered: only the view's geometry is kept.
  void call_pack_hook(const at::Tensor& saved) override {
    sizes_ = saved.sizes().vec();
    strides_ = saved.strides().vec();
    offset_ = saved.storage_offset() - product_offset_;
  }

  // SwiGlu::forward's arithmetic, so the same values.
  at::Tensor call_unpack_hook() override {
    at::NoGradGuard no_grad;
    return at::silu(gate_).mul(up_).as_strided(sizes_, strides_, offset_);
  }

  at::Tensor gate_, up_;
  int64_t product_offset_;
  std::vector<int64_t> sizes_, strides_;
  int64_t offset_ = 0;
};

// Nodes further than this from `out` are not looked at (a down projection's graph,
// with LoRA, is about 15 nodes; this keeps a graph that escapes past `product` cheap).
constexpr size_t kMaxNodes = 64;

}  // namespace

extern "C" char* ptx_recompute_swiglu_product(ptx_tensor out, ptx_tensor product, ptx_tensor gate, ptx_tensor up, int64_t* dropped) {
  PTX_TRY
  auto t = [](ptx_tensor p) -> const at::Tensor& { return *static_cast<at::Tensor*>(p); };
  const at::Tensor& p = t(product);
  *dropped = 0;
  const Node* stop = p.grad_fn().get();
  auto drop = [&](SavedVariable& saved) {
    auto raw = saved.get_raw_data();
    if (!raw || !raw->defined() || !raw->is_alias_of(p)) return;
    saved.register_hooks(std::make_unique<RecomputedProduct>(t(gate), t(up), p.storage_offset()));
    ++*dropped;
  };
  std::vector<Node*> todo;
  std::unordered_set<Node*> seen;
  if (t(out).grad_fn()) todo.push_back(t(out).grad_fn().get());
  while (!todo.empty() && seen.size() < kMaxNodes) {
    Node* node = todo.back();
    todo.pop_back();
    if (node == stop || !seen.insert(node).second) continue;
    const std::string name = node->name();
    if (name == "MmBackward0") {
      auto* mm = static_cast<torch::autograd::generated::MmBackward0*>(node);
      drop(mm->self_);
      drop(mm->mat2_);
    } else if (name == "AddmmBackward0") {
      auto* addmm = static_cast<torch::autograd::generated::AddmmBackward0*>(node);
      drop(addmm->mat1_);
      drop(addmm->mat2_);
    }
    for (const auto& edge : node->next_edges()) {
      if (edge.function) todo.push_back(edge.function.get());
    }
  }
  PTX_CATCH
}
