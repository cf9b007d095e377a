// CUDA pieces tch lacks: the caching allocator's statistics and
// empty_cache, and the device name. Compiled to no-ops without CUDA headers.
#include "ptx.h"

#ifdef PTX_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>

// Declared here rather than through ATen/cuda/CUDAContextLight.h, whose cuBLAS and
// cuSPARSE includes need the CUDA C++ core library headers. Defined in
// libtorch_cuda, so referencing it also keeps that library (and CUDA) linked in.
namespace at::cuda {
cudaDeviceProp* getDeviceProperties(c10::DeviceIndex device);
}
#include <c10/cuda/CUDAFunctions.h>
#endif

extern "C" bool ptx_cuda_compiled() {
#ifdef PTX_CUDA
  return true;
#else
  return false;
#endif
}

extern "C" int64_t ptx_cuda_device_count() {
#ifdef PTX_CUDA
  try {
    return c10::cuda::device_count();
  } catch (...) {
    return 0;
  }
#else
  return 0;
#endif
}

extern "C" char* ptx_cuda_empty_cache() {
  PTX_TRY
#ifdef PTX_CUDA
  c10::cuda::CUDACachingAllocator::emptyCache();
#endif
  PTX_CATCH
}

// Bytes: currently allocated, peak allocated, reserved by the caching allocator.
extern "C" char* ptx_cuda_memory(int32_t device, int64_t* allocated, int64_t* peak,
                                 int64_t* reserved) {
  PTX_TRY
  *allocated = *peak = *reserved = 0;
#ifdef PTX_CUDA
  using namespace c10::CachingDeviceAllocator;
  auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
  auto aggregate = static_cast<size_t>(StatType::AGGREGATE);
  *allocated = stats.allocated_bytes[aggregate].current;
  *peak = stats.allocated_bytes[aggregate].peak;
  *reserved = stats.reserved_bytes[aggregate].current;
#endif
  PTX_CATCH
}

extern "C" char* ptx_cuda_device_name(int32_t device, char* buffer, int64_t size) {
  PTX_TRY
  buffer[0] = 0;
#ifdef PTX_CUDA
  auto props = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device));
  std::strncpy(buffer, props->name, size - 1);
  buffer[size - 1] = 0;
#endif
  PTX_CATCH
}
