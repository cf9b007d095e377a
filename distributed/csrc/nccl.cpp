// The NCCL process group, in its own translation unit: its headers need the CUDA
// toolkit's, and a build without CUDA skips this file.
#include "backend.h"

#include <c10/cuda/CUDAFunctions.h>
#include <cstdlib>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

namespace pd {
c10::intrusive_ptr<c10d::Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                            int world, std::chrono::milliseconds timeout,
                                            int device) {
  // As torch.cuda.set_device(local_rank): NCCL's own set-up otherwise lands on
  // the current device, GPU 0, on every rank.
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
  // The watchdog compares each collective against this timeout. By default
  // (3, SkipCleanUp) it then tears the process down; 2 (CleanUpOnly) aborts the
  // communicators instead, so the failure reaches the caller as an error (the
  // run's summary is written, exit 1). Read by the constructor; a value the user
  // set wins.
  setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2", /*overwrite=*/0);
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  auto group = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world, options);
  group->setBoundDeviceId(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device)));
  return group;
}
}  // namespace pd
