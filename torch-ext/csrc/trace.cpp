// libtorch's Kineto profiler as torch.profiler drives it: prepare (the schedule's
// warm-up), enable (recording), `ProfilerStep#N` spans, disable, and the Chrome
// trace export (`export_chrome_trace`), which may run on another thread. On CUDA,
// the caching allocator's history and its `_snapshot()` pickle.
#include "ptx.h"

#include <ATen/record_function.h>
#include <stdexcept>
#include <torch/csrc/autograd/profiler_kineto.h>

#ifdef PTX_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/cuda/memory_snapshot.h>
#endif

namespace torch::autograd::profiler {
// Declared in profiler/kineto_shim.h, which needs libkineto's headers.
TORCH_API void addMetadataJson(const std::string& key, const std::string& value);
}  // namespace torch::autograd::profiler

namespace prof = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

namespace {

ProfilerConfig trace_config(bool shapes, bool memory) {
  return ProfilerConfig(ProfilerState::KINETO, shapes, memory, /*with_stack=*/false,
                        /*with_flops=*/false, /*with_modules=*/false);
}

std::set<ActivityType> trace_activities(bool cuda) {
  std::set<ActivityType> activities{ActivityType::CPU};
  if (cuda) activities.insert(ActivityType::CUDA);
  return activities;
}

}  // namespace

// Kineto's warm-up: the tracer is set up but records nothing yet.
extern "C" char* ptx_trace_prepare(bool cuda, bool shapes, bool memory) {
  PTX_TRY
  prof::prepareProfiler(trace_config(shapes, memory), trace_activities(cuda));
  PTX_CATCH
}

// Starts recording (after ptx_trace_prepare).
extern "C" char* ptx_trace_start(bool cuda, bool shapes, bool memory) {
  PTX_TRY
  prof::enableProfiler(trace_config(shapes, memory), trace_activities(cuda));
  PTX_CATCH
}

// While recording: `value` (JSON) under `key` at the top of the trace, as
// torch.profiler adds distributedInfo.
extern "C" char* ptx_trace_metadata(const char* key, const char* value) {
  PTX_TRY
  prof::addMetadataJson(key, value);
  PTX_CATCH
}

// Stops recording; *result receives the recorded trace (free with ptx_trace_free).
// With sync_device >= 0 it first waits for that GPU, as torch.profiler's exit
// synchronises: the window's last step is usually still running on the device,
// and Kineto stopped now would drop its kernels.
extern "C" char* ptx_trace_stop(int32_t sync_device, void** result) {
  PTX_TRY
#ifdef PTX_CUDA
  if (sync_device >= 0) {
    // Not c10::cuda::CUDAGuard: its inline code calls the CUDA runtime directly,
    // which the shim does not link.
    auto previous = c10::cuda::ExchangeDevice(static_cast<c10::DeviceIndex>(sync_device));
    c10::cuda::device_synchronize();
    c10::cuda::ExchangeDevice(previous);
  }
#else
  if (sync_device >= 0) throw std::runtime_error("this build has no CUDA");
#endif
  *result = prof::disableProfiler().release();
  PTX_CATCH
}

// Writes the trace as Chrome trace JSON, as torch.profiler's export_chrome_trace.
extern "C" char* ptx_trace_save(void* result, const char* path) {
  PTX_TRY
  static_cast<prof::ProfilerResult*>(result)->save(path);
  PTX_CATCH
}

extern "C" void ptx_trace_free(void* result) {
  delete static_cast<prof::ProfilerResult*>(result);
}

// A user-scope span (torch.profiler.record_function): `ProfilerStep#N`.
extern "C" char* ptx_record_begin(const char* name, void** handle) {
  PTX_TRY
  auto span = new at::RecordFunction(at::RecordScope::USER_SCOPE);
  if (span->isActive()) span->before(std::string(name));
  *handle = span;
  PTX_CATCH
}

extern "C" char* ptx_record_end(void* handle) {
  PTX_TRY
  auto span = static_cast<at::RecordFunction*>(handle);
  span->end();
  delete span;
  PTX_CATCH
}

// torch.cuda.memory._record_memory_history(enabled="all" | None, max_entries).
extern "C" char* ptx_cuda_memory_history(bool enabled, int64_t max_entries) {
  PTX_TRY
#ifdef PTX_CUDA
  if (enabled) {
    torch::cuda::_record_memory_history(std::string("all"), std::string("all"), "all",
                                        static_cast<size_t>(max_entries));
  } else {
    torch::cuda::_record_memory_history(std::nullopt);
  }
#else
  throw std::runtime_error("this build has no CUDA");
#endif
  PTX_CATCH
}

// torch.cuda.memory._snapshot(), pickled as torch.cuda.memory._dump_snapshot writes
// it; *out receives malloc'ed bytes (free with ptx_free), *len their length.
extern "C" char* ptx_cuda_memory_snapshot(char** out, int64_t* len) {
  PTX_TRY
#ifdef PTX_CUDA
  std::string pickled = torch::cuda::_memory_snapshot_pickled();
  *out = static_cast<char*>(std::malloc(pickled.size()));
  std::memcpy(*out, pickled.data(), pickled.size());
  *len = static_cast<int64_t>(pickled.size());
#else
  throw std::runtime_error("this build has no CUDA");
#endif
  PTX_CATCH
}
