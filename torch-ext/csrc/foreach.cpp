// Per-tensor reductions over a list of tensors in a few fused kernels (torch's
// _foreach ops), for plugins that watch the parameters and gradients.
#include "ptx.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/_foreach_sub.h>
#include <ATen/ops/stack.h>
#include <vector>

static std::vector<at::Tensor> tensors(ptx_tensor* ts, int64_t n) {
  std::vector<at::Tensor> out;
  out.reserve(n);
  for (int64_t i = 0; i < n; i++) out.push_back(*static_cast<at::Tensor*>(ts[i]));
  return out;
}

// torch._foreach_norm(ts, ord, dtype=float64), stacked into one [n] tensor on the
// tensors' device: ord 2 gives the L2 norms, ord 0 the counts of non-zero entries.
extern "C" char* ptx_foreach_norm(ptx_tensor* ts, int64_t n, double ord, ptx_tensor* out) {
  PTX_TRY
  auto norms = at::_foreach_norm(tensors(ts, n), ord, at::kDouble);
  *out = new at::Tensor(at::stack(norms));
  PTX_CATCH
}

// a[i] -= b[i], in place.
extern "C" char* ptx_foreach_sub_(ptx_tensor* a, ptx_tensor* b, int64_t n) {
  PTX_TRY
  at::_foreach_sub_(tensors(a, n), tensors(b, n));
  PTX_CATCH
}

// out[i] = ts[i] * scalar, new tensors (heap handles the caller owns).
extern "C" char* ptx_foreach_mul_scalar(ptx_tensor* ts, int64_t n, double scalar, ptx_tensor* out) {
  PTX_TRY
  auto products = at::_foreach_mul(tensors(ts, n), scalar);
  for (int64_t i = 0; i < n; i++) out[i] = new at::Tensor(products[i]);
  PTX_CATCH
}
