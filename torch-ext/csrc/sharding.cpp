// Parameter sharding (ZeRO-3 / FSDP) needs two things tch does not reach: releasing
// and re-allocating a gathered block's memory while its tensors (and every reference
// autograd saved to them) stay what they are, and a callback when a tensor's gradient
// is computed (the points where a block's backward starts and ends).
#include "ptx.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/variable.h>

#include <memory>

static at::Tensor& tensor(ptx_tensor t) { return *static_cast<at::Tensor*>(t); }

// Gives the storage under `t` `nbytes` fresh bytes from its own allocator (their
// content undefined), or none with 0, as FSDP's `untyped_storage().resize_()`: the
// tensors viewing it keep their shapes and offsets, and see the new memory.
extern "C" char* ptx_storage_resize(ptx_tensor t, int64_t nbytes) {
  PTX_TRY
  auto* storage = tensor(t).storage().unsafeGetStorageImpl();
  if (nbytes < 0) throw std::runtime_error("a storage of negative size");
  if (static_cast<int64_t>(storage->nbytes()) != nbytes) {
    auto* allocator = storage->allocator();
    if (allocator == nullptr) throw std::runtime_error("this tensor's storage has no allocator to resize it with");
    storage->set_data_ptr_noswap(allocator->allocate(static_cast<size_t>(nbytes)));
    storage->set_nbytes(static_cast<size_t>(nbytes));
  }
  PTX_CATCH
}

// The Rust callback: returns nullptr or a malloc'ed message (made by ptx_error).
typedef char* (*ptx_hook_fn)(void* ctx);
typedef void (*ptx_hook_release_fn)(void* ctx);

struct GradHook {
  ptx_hook_fn call;
  ptx_hook_release_fn release;
  void* ctx;
  GradHook(ptx_hook_fn call, ptx_hook_release_fn release, void* ctx) : call(call), release(release), ctx(ctx) {}
  ~GradHook() { release(ctx); }
};

extern "C" char* ptx_hook_message(const char* text, int64_t len) {
  return ptx_error(std::string(text, static_cast<size_t>(len)));
}

// Calls back when the gradient of `t` has been computed, before it flows on (a
// tensor hook, leaving the gradient as it is). The context is released with the graph.
extern "C" char* ptx_on_grad(ptx_tensor t, ptx_hook_fn call, ptx_hook_release_fn release, void* ctx) {
  auto hook = std::make_shared<GradHook>(call, release, ctx);
  PTX_TRY
  auto& x = tensor(t);
  if (!x.requires_grad()) throw std::runtime_error("a gradient hook on a tensor that needs no gradient");
  x.register_hook([hook](const at::Tensor&) {
    char* message = hook->call(hook->ctx);
    if (message != nullptr) {
      std::string text(message);
      std::free(message);
      throw std::runtime_error(text);
    }
  });
  PTX_CATCH
}

// Whether autograd records operations on this thread now.
extern "C" bool ptx_grad_enabled() { return at::GradMode::is_enabled(); }
