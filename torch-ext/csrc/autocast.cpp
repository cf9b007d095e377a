// Autocast to bfloat16 on the CPU or CUDA. tch's own `autocast` only ever turns
// on CUDA's (and does nothing without a GPU); libtorch's CPU autocast supports
// bfloat16 too. Enter/exit mirror torch.autocast's __enter__/__exit__: the
// enabled flag and the dtype before the region are restored when it ends.
#include "ptx.h"

#include <ATen/autocast_mode.h>

static at::DeviceType device_type(bool cuda) { return cuda ? at::kCUDA : at::kCPU; }

extern "C" char* ptx_autocast_enter(bool cuda, bool* was_enabled, int32_t* was_dtype) {
  PTX_TRY
  auto type = device_type(cuda);
  *was_enabled = at::autocast::is_autocast_enabled(type);
  *was_dtype = static_cast<int32_t>(at::autocast::get_autocast_dtype(type));
  at::autocast::set_autocast_dtype(type, at::kBFloat16);
  at::autocast::set_autocast_enabled(type, true);
  at::autocast::increment_nesting();
  PTX_CATCH
}

extern "C" char* ptx_autocast_exit(bool cuda, bool was_enabled, int32_t was_dtype) {
  PTX_TRY
  // The cast-weight cache lives as long as the outermost autocast region.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_type(cuda), was_enabled);
  at::autocast::set_autocast_dtype(device_type(cuda), static_cast<at::ScalarType>(was_dtype));
  PTX_CATCH
}

// torch.get_autocast_dtype(device_type), as a c10::ScalarType code.
extern "C" char* ptx_autocast_dtype(bool cuda, int32_t* out) {
  PTX_TRY
  *out = static_cast<int32_t>(at::autocast::get_autocast_dtype(device_type(cuda)));
  PTX_CATCH
}
