// Page-locked host memory for asynchronous copies to the GPU. tch 0.24's
// `pin_memory(device)` passes a device, which libtorch 2.11 deprecates: it warns
// from pin_memory and is_pinned on every call (several lines per micro-batch).
// Without the argument libtorch pins for the current accelerator, as
// `Tensor.pin_memory()` does in Python.
#include "ptx.h"

#include <ATen/core/Tensor.h>

// *out receives a new heap tensor: `t` itself when it is already pinned.
extern "C" char* ptx_pin_memory(ptx_tensor t, ptx_tensor* out) {
  PTX_TRY
  *out = new at::Tensor(static_cast<at::Tensor*>(t)->pin_memory());
  PTX_CATCH
}

extern "C" char* ptx_is_pinned(ptx_tensor t, bool* out) {
  PTX_TRY
  *out = static_cast<at::Tensor*>(t)->is_pinned();
  PTX_CATCH
}
