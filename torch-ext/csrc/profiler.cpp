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
