// `at::cuda::CUDAGraph`, which tch does not bind: work captured once and replayed.
// Capture, and the warm-up before it, run a caller's function on a side stream, as
// torch.cuda.graph and make_graphed_callables do: capture cannot use the default
// stream, and warm-up there keeps the memory it allocates out of the capture's
// pool. Without CUDA every call returns an error naming that.
#include "ptx.h"

#include <stdexcept>

#ifdef PTX_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/Event.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif

// The caller's function; it never throws (a Rust closure behind a trampoline that
// keeps its own result and panics).
typedef void (*ptx_stream_fn)(void* ctx);

#ifdef PTX_CUDA
// `waiter` runs nothing until what is queued on `on` has run (no host sync).
static void wait_for(const c10::cuda::CUDAStream& waiter, const c10::cuda::CUDAStream& on) {
  c10::Event event(c10::DeviceType::CUDA);
  event.record(on);
  event.block(waiter);
}

// Runs `fn` on a side stream ordered after the current stream's work, and the
// current stream's later work after it; `inside` runs on the side stream around it.
template <class Inside>
static void on_side_stream(Inside inside) {
  auto current = c10::cuda::getCurrentCUDAStream();
  auto side = c10::cuda::getStreamFromPool();
  wait_for(side, current);
  // Not c10::cuda::CUDAStreamGuard: its header's inline guard implementation would
  // link this library to the CUDA runtime directly, which libtorch_cuda already holds.
  struct Restore {
    c10::cuda::CUDAStream previous;
    ~Restore() { c10::cuda::setCurrentCUDAStream(previous); }
  } restore{current};
  c10::cuda::setCurrentCUDAStream(side);
  inside();
  // The events name their streams, so this may run before `restore` puts `current` back.
  wait_for(current, side);
}
#define PTX_NEEDS_CUDA
#else
#define PTX_NEEDS_CUDA throw std::runtime_error("CUDA graphs need ptrain built against a libtorch with CUDA");
#endif

extern "C" char* ptx_cuda_graph_new(void** out) {
  PTX_TRY
  *out = nullptr;
  PTX_NEEDS_CUDA
#ifdef PTX_CUDA
  *out = new at::cuda::CUDAGraph();
#endif
  PTX_CATCH
}

extern "C" void ptx_cuda_graph_free(void* graph) {
#ifdef PTX_CUDA
  delete static_cast<at::cuda::CUDAGraph*>(graph);
#endif
}

// Warm-up: `fn` on a side stream, outside any capture.
extern "C" char* ptx_cuda_on_side_stream(ptx_stream_fn fn, void* ctx) {
  PTX_TRY
  PTX_NEEDS_CUDA
#ifdef PTX_CUDA
  on_side_stream([&] { fn(ctx); });
#endif
  PTX_CATCH
}

// Captures what `fn` queues into `graph`, in the memory pool (`pool_hi`, `pool_lo`)
// ({0, 0}: the graph's own; another graph's or `ptx_cuda_graph_pool_handle`'s to
// share one). The capture is ended even when `fn`'s work failed, so the stream is
// usable after; an invalidated capture is this call's error.
extern "C" char* ptx_cuda_graph_capture(void* graph, uint64_t pool_hi, uint64_t pool_lo,
                                        ptx_stream_fn fn, void* ctx) {
  PTX_TRY
  PTX_NEEDS_CUDA
#ifdef PTX_CUDA
  auto* g = static_cast<at::cuda::CUDAGraph*>(graph);
  c10::cuda::device_synchronize();
  on_side_stream([&] {
    g->capture_begin(at::cuda::MempoolId_t{pool_hi, pool_lo});
    fn(ctx);
    g->capture_end();
  });
#endif
  PTX_CATCH
}

extern "C" char* ptx_cuda_graph_replay(void* graph) {
  PTX_TRY
  PTX_NEEDS_CUDA
#ifdef PTX_CUDA
  static_cast<at::cuda::CUDAGraph*>(graph)->replay();
#endif
  PTX_CATCH
}

// The pool a captured graph allocated from, to capture another graph into it.
extern "C" char* ptx_cuda_graph_pool(void* graph, uint64_t* hi, uint64_t* lo) {
  PTX_TRY
  PTX_NEEDS_CUDA
#ifdef PTX_CUDA
  auto pool = static_cast<at::cuda::CUDAGraph*>(graph)->pool();
  *hi = pool.first;
  *lo = pool.second;
#endif
  PTX_CATCH
}

// A fresh pool id several graphs can share (one per shape bucket, replayed in turn).
extern "C" char* ptx_cuda_graph_pool_handle(uint64_t* hi, uint64_t* lo) {
  PTX_TRY
  PTX_NEEDS_CUDA
#ifdef PTX_CUDA
  auto pool = at::cuda::graph_pool_handle();
  *hi = pool.first;
  *lo = pool.second;
#endif
  PTX_CATCH
}
