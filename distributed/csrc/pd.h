// C ABI of ptrain-dist's c10d shim. Tensors are tch handles (`at::Tensor*`).
// Functions return nullptr on success or a malloc'ed message (free with pd_free).
#pragma once
#include <cstdint>

typedef void* pd_tensor;
struct pd_group;
struct pd_work;

extern "C" {
void pd_free(char* message);
bool pd_nccl_compiled();
// Rendezvous on a TCPStore at host:port, then a Gloo (backend 0) or NCCL (backend 1)
// process group. Rank 0 serves the store unless `agent_store` (torchrun's agent
// already serves it), on the listening socket `listen_fd` when it is >= 0 (the port's,
// bound by `ptrain launch`); keys go under `prefix` (may be empty). `iface` (may be empty)
// names the network interfaces Gloo binds to; `loopback` binds Gloo to 127.0.0.1.
// `device` is this rank's CUDA device (NCCL only). `timeout_ms` bounds the rendezvous
// and Gloo's collectives, `nccl_timeout_ms` NCCL's.
char* pd_group_new(const char* host, uint16_t port, int32_t rank, int32_t world,
                   int64_t timeout_ms, int64_t nccl_timeout_ms, int32_t backend,
                   bool agent_store, int32_t listen_fd, const char* prefix,
                   const char* iface, bool loopback, int32_t device, pd_group** out);
void pd_group_free(pd_group* group);
// The rendezvous store, for agreements with their own timeouts (the end of a run):
// `*out` = the counter `key` after adding `amount`; set `key` to "1"; `*out` =
// whether `key` exists (without waiting: the caller polls, so a signal can end it).
char* pd_store_add(pd_group* group, const char* key, int64_t amount, int64_t* out);
char* pd_store_set(pd_group* group, const char* key);
char* pd_store_check(pd_group* group, const char* key, bool* out);
// Starts an in-place sum all-reduce / broadcast; finish it with pd_work_wait.
char* pd_allreduce(pd_group* group, pd_tensor tensor, pd_work** out);
char* pd_broadcast(pd_group* group, pd_tensor tensor, int32_t root, pd_work** out);
// Sharded training. Reduce-scatter: out = this rank's part of the sum, where
// `rows` holds one tensor per rank (rank r's part); `_flat`: in is one contiguous
// tensor of world * out.numel() elements. All-gather (`_flat`): out (world *
// in.numel() elements) receives every rank's `in`; in may be out's own part.
char* pd_reduce_scatter(pd_group* group, pd_tensor out, pd_tensor* rows, int64_t n, pd_work** work);
char* pd_reduce_scatter_flat(pd_group* group, pd_tensor out, pd_tensor in, pd_work** work);
char* pd_all_gather_flat(pd_group* group, pd_tensor out, pd_tensor in, pd_work** work);
// Waits for the work and frees it (also on error). A failure the NCCL watchdog
// recorded on the work (a timeout, an aborted communicator) is returned too.
char* pd_work_wait(pd_work* work);
void pd_work_free(pd_work* work);
// dst[i].copy_(src[i]) for all i, in one foreach call.
char* pd_copy(pd_tensor* dst, pd_tensor* src, int64_t n);
// flat *= scale, then grads[i].copy_(views[i]).
char* pd_scale_copy(pd_tensor flat, double scale, pd_tensor* grads, pd_tensor* views, int64_t n);
}
