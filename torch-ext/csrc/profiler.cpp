// libtorch's own profiler, used only for its FLOP count (the formulas PyTorch's
// profiler applies to matmuls and convolutions from the recorded input shapes).
#include "ptx.h"

#include <torch/csrc/autograd/profiler_kineto.h>

namespace prof = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;

static prof::ProfilerConfig flops_config() {
  return prof::ProfilerConfig(prof::ProfilerState::KINETO, /*report_input_shapes=*/true,
                              /*profile_memory=*/false, /*with_stack=*/false,
                              /*with_flops=*/true, /*with_modules=*/false);
}

extern "C" char* ptx_profiler_start() {
  PTX_TRY
  std::set<ActivityType> activities{ActivityType::CPU};
  prof::prepareProfiler(flops_config(), activities);
  prof::enableProfiler(flops_config(), activities);
  PTX_CATCH
}

extern "C" char* ptx_profiler_stop(uint64_t* flops, uint64_t* counted_ops) {
  PTX_TRY
  auto result = prof::disableProfiler();
  uint64_t total = 0, ops = 0;
  for (const auto& event : result->events()) {
    if (event.flops() > 0) {
      total += event.flops();
      ops += 1;
    }
  }
  *flops = total;
  *counted_ops = ops;
  PTX_CATCH
}

// ---------------------------------------------------------------------------
// A FLOP counter on the legacy CPU-state profiler: it records operators and their
// input shapes on the calling thread (and threads it hands work to, as autograd's
// device threads) without Kineto, which logs errors on hosts with a CUDA build but
// no driver. Attention kernels have no FLOP formula in libtorch; they are counted
// here from their recorded shapes, as PyTorch's FlopCounterMode counts them.
#include <torch/csrc/autograd/profiler_legacy.h>

namespace {

bool starts_with(const std::string& s, const char* prefix) {
  return s.rfind(prefix, 0) == 0;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The fused scaled-dot-product attention kernels. The math fallback is left out:
// it runs through bmm, which the profiler counts already.
bool is_fused_attention(const std::string& name) {
  static const char* const kernels[] = {
      "aten::_scaled_dot_product_flash_attention",
      "aten::_scaled_dot_product_flash_attention_for_cpu",
      "aten::_scaled_dot_product_efficient_attention",
      "aten::_scaled_dot_product_cudnn_attention",
      "aten::_scaled_dot_product_fused_attention_overrideable",
  };
  std::string base = ends_with(name, "_backward") ? name.substr(0, name.size() - 9) : name;
  for (const char* k : kernels) {
    if (base == k) return true;
  }
  return false;
}

// q [..., T, E], k [..., S, E], v [..., S, Ev]: QK^T and PV, 2*T*S*(E+Ev) per
// leading index; the backward pass is four such products, twice the forward.
uint64_t attention_flops(const std::vector<std::vector<int64_t>>& shapes, bool backward) {
  size_t first = backward ? 1 : 0;  // backward kernels take grad_out first
  if (shapes.size() < first + 3) return 0;
  const auto& q = shapes[first];
  const auto& k = shapes[first + 1];
  const auto& v = shapes[first + 2];
  if (q.size() < 2 || k.size() < 2 || v.size() < 2) return 0;
  uint64_t lead = 1;
  for (size_t i = 0; i + 2 < q.size(); ++i) lead *= static_cast<uint64_t>(q[i]);
  uint64_t t = q[q.size() - 2], e = q.back(), s = k[k.size() - 2], ev = v.back();
  uint64_t forward = 2 * lead * t * s * (e + ev);
  return backward ? 2 * forward : forward;
}

// oneDNN's linear (csrc/linear.cpp's products): X [.., K] W [N, K] -> 2 * rows * N * K.
// libtorch has no formula for it either.
uint64_t onednn_linear_flops(const std::vector<std::vector<int64_t>>& shapes) {
  if (shapes.size() < 2 || shapes[0].empty() || shapes[1].size() != 2) return 0;
  uint64_t rows = 1;
  for (size_t i = 0; i + 1 < shapes[0].size(); ++i) rows *= static_cast<uint64_t>(shapes[0][i]);
  return 2 * rows * static_cast<uint64_t>(shapes[1][0]) * static_cast<uint64_t>(shapes[0].back());
}

}  // namespace

extern "C" char* ptx_flop_count_start() {
  PTX_TRY
  prof::ProfilerConfig config(prof::ProfilerState::CPU, /*report_input_shapes=*/true,
                              /*profile_memory=*/false, /*with_stack=*/false,
                              /*with_flops=*/true, /*with_modules=*/false);
  prof::enableProfilerLegacy(config);
  PTX_CATCH
}

// out: matmul FLOPs (mm, addmm, bmm, baddbmm, conv2d, oneDNN's linear), elementwise FLOPs (add,
// mul), attention FLOPs, operator calls with a formula, attention kernel calls.
extern "C" char* ptx_flop_count_stop(uint64_t* out) {
  PTX_TRY
  for (int i = 0; i < 5; ++i) out[i] = 0;
  auto lists = prof::disableProfilerLegacy();
  for (auto& list : lists) {
    for (auto& event : list) {
      if (event.kind() != prof::EventKind::PushRange) continue;
      std::string name = event.name();
      if (is_fused_attention(name)) {
        uint64_t f = attention_flops(event.shapes(), ends_with(name, "_backward"));
        out[2] += f;
        out[4] += 1;
        continue;
      }
      uint64_t f = name == "mkldnn::_linear_pointwise" ? onednn_linear_flops(event.shapes()) : event.flops();
      if (f == 0) continue;
      if (name == "aten::add" || name == "aten::mul") {
        out[1] += f;
      } else {
        out[0] += f;
      }
      out[3] += 1;
    }
  }
  PTX_CATCH
}
