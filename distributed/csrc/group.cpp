// Rendezvous (TCPStore), the Gloo process group, and the few operations the Rust
// side drives: asynchronous all-reduce, broadcast, reduce-scatter and all-gather,
// waiting, and the foreach copies that fill and drain gradient buckets.
#include "pd.h"
#include "backend.h"

#include <ATen/ops/_foreach_copy.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

struct pd_group {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
};

struct pd_work {
  c10::intrusive_ptr<c10d::Work> work;
};

static char* pd_error(const std::string& message) {
  char* out = static_cast<char*>(std::malloc(message.size() + 1));
  std::memcpy(out, message.c_str(), message.size() + 1);
  return out;
}

// c10 errors carry a C++ backtrace in what(); the message alone is what users need.
#define PD_TRY try {
#define PD_CATCH                                  \
  }                                               \
  catch (const c10::Error& e) {                   \
    return pd_error(e.what_without_backtrace());  \
  }                                               \
  catch (const std::exception& e) {               \
    return pd_error(e.what());                    \
  }                                               \
  catch (...) {                                   \
    return pd_error("unknown C++ exception");     \
  }                                               \
  return nullptr;

static at::Tensor& tensor(pd_tensor t) { return *static_cast<at::Tensor*>(t); }

// What a collective reads or writes: the tensor's storage, never its autograd history.
// Gloo's CUDA paths copy results back with copy_, which autograd refuses on a leaf that
// requires grad (the start-up parameter broadcast of a run on one GPU over Gloo failed so);
// a detached alias shares the storage and is refused nothing. NCCL and Gloo's CPU paths
// write through raw pointers and never noticed.
static at::Tensor operand(pd_tensor t) {
  const at::Tensor& x = tensor(t);
  return x.requires_grad() ? x.detach() : x;
}

static std::vector<at::Tensor> list(pd_tensor* ts, int64_t n) {
  std::vector<at::Tensor> out;
  out.reserve(n);
  for (int64_t i = 0; i < n; i++) out.push_back(operand(ts[i]));
  return out;
}

#ifndef PD_NCCL
namespace pd {
c10::intrusive_ptr<c10d::Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>&, int, int,
                                            std::chrono::milliseconds, int) {
  throw std::runtime_error("this build of ptrain has no NCCL (libtorch had no CUDA at build time)");
}
}  // namespace pd
#endif

extern "C" void pd_free(char* message) { std::free(message); }

extern "C" bool pd_nccl_compiled() {
#ifdef PD_NCCL
  return true;
#else
  return false;
#endif
}

// Gloo's flight recorder (one per process, on by default with 2000 entries)
// inserts a group's first status into a std::map before taking its mutex
// (torch 2.11, FlightRecorderDetail.hpp recordWithResetEnabled), so two groups of
// one process recording at once corrupt the map and crash: the in-process
// two-rank tests and examples did, about one run in ten. ptrain has one group per
// process and never dumps Gloo's recorder, and the record also gathers a
// traceback per collective, so it is turned off: the recorder reads the variable
// once, when it is made (at the first Gloo collective), and a value the user set
// (either name) wins. NCCL groups keep theirs (hang dumps); a process holds
// either kind, never both.
static void disable_gloo_flight_recorder() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("TORCH_FR_BUFFER_SIZE") == nullptr && std::getenv("TORCH_NCCL_TRACE_BUFFER_SIZE") == nullptr)
      setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/0);
  });
}

static c10::intrusive_ptr<c10d::Backend> make_gloo(const c10::intrusive_ptr<c10d::Store>& store,
                                                   int rank, int world,
                                                   std::chrono::milliseconds timeout,
                                                   const std::string& iface, bool loopback) {
  disable_gloo_flight_recorder();
  // The options' timeout bounds every Gloo operation, so a dead or stuck peer
  // surfaces as an exception from wait() instead of a hang.
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  if (!iface.empty()) {
    std::stringstream names(iface);
    std::string name;
    while (std::getline(names, name, ','))
      if (!name.empty())
        options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
  } else if (loopback) {
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  } else {
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, options);
}

extern "C" char* pd_group_new(const char* host, uint16_t port, int32_t rank, int32_t world,
                              int64_t timeout_ms, int64_t nccl_timeout_ms, int32_t backend,
                              bool agent_store, int32_t listen_fd, const char* prefix, const char* iface,
                              bool loopback, int32_t device, pd_group** out) {
  PD_TRY
  auto timeout = std::chrono::milliseconds(timeout_ms);
  c10d::TCPStoreOptions options;
  options.port = port;
  options.isServer = rank == 0 && !agent_store;
  options.numWorkers = static_cast<size_t>(world);
  options.waitWorkers = !agent_store;
  options.timeout = timeout;
  // `ptrain launch` bound the port before starting the ranks and handed rank 0 the
  // socket: the store serves on it, so no other program can take the port between.
  if (options.isServer && listen_fd >= 0) options.masterListenFd = listen_fd;
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::TCPStore>(host, options);
  if (prefix[0] != 0) store = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
  auto group = std::make_unique<pd_group>();
  group->store = store;
  group->backend = backend == 1 ? pd::make_nccl(store, rank, world,
                                                 std::chrono::milliseconds(nccl_timeout_ms), device)
                                : make_gloo(store, rank, world, timeout, iface, loopback);
  *out = group.release();
  PD_CATCH
}

extern "C" void pd_group_free(pd_group* group) {
  try {
    group->backend->shutdown();
  } catch (...) {
  }
  delete group;
}

extern "C" char* pd_store_add(pd_group* group, const char* key, int64_t amount, int64_t* out) {
  PD_TRY
  *out = group->store->add(key, amount);
  PD_CATCH
}

extern "C" char* pd_store_set(pd_group* group, const char* key) {
  PD_TRY
  group->store->set(key, std::vector<uint8_t>{'1'});
  PD_CATCH
}

extern "C" char* pd_store_check(pd_group* group, const char* key, bool* out) {
  PD_TRY
  *out = group->store->check({key});
  PD_CATCH
}

extern "C" char* pd_allreduce(pd_group* group, pd_tensor t, pd_work** out) {
  PD_TRY
  std::vector<at::Tensor> tensors{operand(t)};
  *out = new pd_work{group->backend->allreduce(tensors)};
  PD_CATCH
}

extern "C" char* pd_broadcast(pd_group* group, pd_tensor t, int32_t root, pd_work** out) {
  PD_TRY
  std::vector<at::Tensor> tensors{operand(t)};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  *out = new pd_work{group->backend->broadcast(tensors, options)};
  PD_CATCH
}

extern "C" char* pd_reduce_scatter(pd_group* group, pd_tensor out, pd_tensor* rows, int64_t n,
                                   pd_work** work) {
  PD_TRY
  std::vector<at::Tensor> outputs{operand(out)};
  std::vector<std::vector<at::Tensor>> inputs{list(rows, n)};
  *work = new pd_work{group->backend->reduce_scatter(outputs, inputs)};
  PD_CATCH
}

extern "C" char* pd_reduce_scatter_flat(pd_group* group, pd_tensor out, pd_tensor in,
                                        pd_work** work) {
  PD_TRY
  *work = new pd_work{group->backend->_reduce_scatter_base(tensor(out), tensor(in))};
  PD_CATCH
}

extern "C" char* pd_all_gather_flat(pd_group* group, pd_tensor out, pd_tensor in, pd_work** work) {
  PD_TRY
  *work = new pd_work{group->backend->_allgather_base(tensor(out), tensor(in))};
  PD_CATCH
}

extern "C" char* pd_work_wait(pd_work* work) {
  std::unique_ptr<pd_work> owned(work);
  PD_TRY
  owned->work->wait();
  // NCCL's wait returns once the current stream is ordered after the collective;
  // an error the watchdog found (timeout, aborted communicator) is on the work.
  if (auto error = owned->work->exception()) std::rethrow_exception(error);
  PD_CATCH
}

extern "C" void pd_work_free(pd_work* work) { delete work; }

extern "C" char* pd_copy(pd_tensor* dst, pd_tensor* src, int64_t n) {
  PD_TRY
  at::_foreach_copy_(list(dst, n), list(src, n));
  PD_CATCH
}

extern "C" char* pd_scale_copy(pd_tensor flat, double scale, pd_tensor* grads, pd_tensor* views,
                               int64_t n) {
  PD_TRY
  tensor(flat).mul_(scale);
  at::_foreach_copy_(list(grads, n), list(views, n));
  PD_CATCH
}
