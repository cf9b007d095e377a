// Gradient storage for sharded training: `.grad` tensors that are views of one
// flat buffer (so a whole model's gradient is reduced in place, without copies),
// releasing them, and the storage a tensor keeps alive (to measure memory held).
#include "ptx.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/variable.h>

static at::Tensor& tensor(ptx_tensor t) { return *static_cast<at::Tensor*>(t); }

// params[i].grad = flat[offset_i : offset_i + numel_i].view(params[i].shape), the
// offsets running on in order from 0. Backward then accumulates into `flat`.
extern "C" char* ptx_attach_flat_grads(ptx_tensor* params, int64_t n, ptx_tensor flat) {
  PTX_TRY
  auto& buffer = tensor(flat);
  int64_t offset = 0;
  for (int64_t i = 0; i < n; i++) {
    auto& p = tensor(params[i]);
    auto numel = p.numel();
    if (offset + numel > buffer.numel()) throw std::runtime_error("flat gradient buffer too small");
    p.mutable_grad() = buffer.narrow(0, offset, numel).view(p.sizes());
    offset += numel;
  }
  PTX_CATCH
}

// params[i].grad = None: the gradient's memory goes back to the allocator once
// nothing else holds it.
extern "C" char* ptx_detach_grads(ptx_tensor* params, int64_t n) {
  PTX_TRY
  for (int64_t i = 0; i < n; i++) tensor(params[i]).mutable_grad().reset();
  PTX_CATCH
}

// The storage a tensor (or, with grad, its `.grad`) keeps alive: its address and
// size in bytes; 0 and 0 when undefined.
extern "C" char* ptx_storage(ptx_tensor t, bool grad, uint64_t* address, uint64_t* nbytes) {
  PTX_TRY
  at::Tensor target = grad ? tensor(t).grad() : tensor(t);
  *address = 0;
  *nbytes = 0;
  if (target.defined() && target.has_storage()) {
    const auto& storage = target.storage();
    *address = reinterpret_cast<uint64_t>(storage.data());
    *nbytes = storage.nbytes();
  }
  PTX_CATCH
}

// lists[i] = params[i].grad after a backward that started from no gradients; a
// parameter that backward did not reach gets a zero gradient, so the update treats
// it as it would have with gradients held (and zeroed) between steps.
extern "C" char* ptx_bind_grads(ptx_tensor* params, ptx_tensor* lists, int64_t n) {
  PTX_TRY
  for (int64_t i = 0; i < n; i++) {
    auto& p = tensor(params[i]);
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    tensor(lists[i]) = p.grad();
  }
  PTX_CATCH
}

// lists[i] = an undefined tensor: the list no longer keeps any gradient alive.
extern "C" char* ptx_unbind_grads(ptx_tensor* lists, int64_t n) {
  PTX_TRY
  for (int64_t i = 0; i < n; i++) tensor(lists[i]).reset();
  PTX_CATCH
}
