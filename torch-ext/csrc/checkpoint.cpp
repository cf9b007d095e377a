// Activation checkpointing: the reentrant design of torch.utils.checkpoint as a C++
// custom autograd Function. Forward runs a block (Rust code, called back through a
// function pointer) without building a graph and saves only its inputs; backward
// puts back the RNG and autocast state that forward saw, recomputes the block with
// grad enabled from detached inputs, runs backward through that graph with the
// incoming gradient (which also accumulates the block's parameter gradients) and
// returns the input's gradient.
#include "ptx.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <mutex>

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The Rust block: takes ownership of `n` heap tensors in `inputs`, writes an owned
// heap tensor to `out`, and returns nullptr or a message made by ptx_checkpoint_message.
typedef char* (*ptx_block_fn)(void* ctx, ptx_tensor* inputs, int64_t n, ptx_tensor* out);
typedef void (*ptx_release_fn)(void* ctx);

// The block's callback and its Rust context, made once per block and shared by every
// graph that uses it: the context is released when the last one is gone.
struct Block : torch::CustomClassHolder {
  ptx_block_fn call;
  ptx_release_fn release;
  void* ctx;
  Block(ptx_block_fn call, ptx_release_fn release, void* ctx) : call(call), release(release), ctx(ctx) {}
  ~Block() override { release(ctx); }

  at::Tensor run(const variable_list& inputs) const {
    std::vector<ptx_tensor> raw;
    raw.reserve(inputs.size());
    for (const auto& t : inputs) raw.push_back(new at::Tensor(t));
    ptx_tensor out = nullptr;
    char* message = call(ctx, raw.data(), static_cast<int64_t>(raw.size()), &out);
    if (message != nullptr) {
      std::string text(message);
      std::free(message);
      throw std::runtime_error(text);
    }
    if (out == nullptr) throw std::runtime_error("the checkpointed block returned no tensor");
    auto* owned = static_cast<at::Tensor*>(out);
    at::Tensor result = std::move(*owned);
    delete owned;
    return result;
  }
};

// The thread's autocast settings for the CPU and CUDA (torch.utils.checkpoint saves
// the same: enabled, dtype, cache enabled).
struct AutocastState {
  bool cpu_enabled, cuda_enabled, cache_enabled;
  at::ScalarType cpu_dtype, cuda_dtype;

  static AutocastState current() {
    return {at::autocast::is_autocast_enabled(at::kCPU), at::autocast::is_autocast_enabled(at::kCUDA),
            at::autocast::is_autocast_cache_enabled(), at::autocast::get_autocast_dtype(at::kCPU),
            at::autocast::get_autocast_dtype(at::kCUDA)};
  }

  void set() const {
    at::autocast::set_autocast_enabled(at::kCPU, cpu_enabled);
    at::autocast::set_autocast_enabled(at::kCUDA, cuda_enabled);
    at::autocast::set_autocast_cache_enabled(cache_enabled);
    at::autocast::set_autocast_dtype(at::kCPU, cpu_dtype);
    at::autocast::set_autocast_dtype(at::kCUDA, cuda_dtype);
  }

  std::vector<int64_t> pack() const {
    return {cpu_enabled, cuda_enabled, cache_enabled, static_cast<int64_t>(cpu_dtype), static_cast<int64_t>(cuda_dtype)};
  }

  static AutocastState unpack(const std::vector<int64_t>& v) {
    return {v[0] != 0, v[1] != 0, v[2] != 0, static_cast<at::ScalarType>(v[3]), static_cast<at::ScalarType>(v[4])};
  }
};

// The forward's autocast state for the recompute, and the thread's own back after it,
// as torch.autocast's enter and exit (the cast cache lives as long as the region).
struct AutocastAs {
  AutocastState before;
  bool entered;
  explicit AutocastAs(const AutocastState& forward) : before(AutocastState::current()) {
    forward.set();
    entered = forward.cpu_enabled || forward.cuda_enabled;
    if (entered) at::autocast::increment_nesting();
  }
  ~AutocastAs() {
    if (entered && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    before.set();
  }
};

static at::Tensor get_state(at::Generator gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

static void set_state(at::Generator gen, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// Sets generators to the forward's states for the recompute and puts their current
// states back after it, so the recompute draws what forward drew and the global
// sequence after backward is what it would have been (torch.random.fork_rng).
struct ForkRng {
  std::vector<std::pair<at::Generator, at::Tensor>> now;
  ForkRng(const std::vector<at::Generator>& gens, const std::vector<at::Tensor>& forward) {
    for (size_t i = 0; i < gens.size(); i++) {
      now.emplace_back(gens[i], get_state(gens[i]));
      set_state(gens[i], forward[i]);
    }
  }
  ~ForkRng() {
    for (auto& [gen, state] : now) set_state(gen, state);
  }
};

// The generators a block on `device` draws from: the CPU's, and the device's own.
static std::vector<at::Generator> generators(const at::Device& device) {
  std::vector<at::Generator> gens{at::detail::getDefaultCPUGenerator()};
  if (!device.is_cpu()) gens.push_back(at::globalContext().defaultGenerator(device));
  return gens;
}

struct Checkpoint : public torch::autograd::Function<Checkpoint> {
  // inputs[0] is the hidden state (differentiable); the rest pass through to the block
  // (RoPE cos/sin, an attention mask) and carry no gradient.
  static variable_list forward(AutogradContext* ctx, at::TensorList inputs, c10::intrusive_ptr<Block> block) {
    for (size_t i = 1; i < inputs.size(); i++) {
      if (inputs[i].requires_grad())
        throw std::runtime_error("a checkpointed block's extra input " + std::to_string(i) + " requires grad: only the first may");
    }
    auto device = inputs[0].device();
    std::vector<at::Tensor> states;
    for (auto& gen : generators(device)) states.push_back(get_state(gen));
    ctx->saved_data["block"] = c10::IValue::make_capsule(block);
    ctx->saved_data["autocast"] = AutocastState::current().pack();
    ctx->saved_data["rng"] = states;
    ctx->saved_data["grad"] = inputs[0].requires_grad();
    ctx->save_for_backward(inputs.vec());
    return {block->run(inputs.vec())};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    variable_list grads(saved.size() + 1);
    if (!grad_outputs[0].defined()) return grads;
    auto block = c10::static_intrusive_pointer_cast<Block>(ctx->saved_data["block"].toCapsule());
    auto autocast = AutocastState::unpack(ctx->saved_data["autocast"].toIntVector());
    auto states = ctx->saved_data["rng"].toTensorVector();
    bool grad = ctx->saved_data["grad"].toBool();
    variable_list detached;
    for (size_t i = 0; i < saved.size(); i++) detached.push_back(saved[i].detach().requires_grad_(i == 0 && grad));
    at::Tensor output;
    {
      ForkRng rng(generators(saved[0].device()), states);
      AutocastAs as(autocast);
      at::AutoGradMode enable(true);
      output = block->run(detached);
    }
    if (output.requires_grad()) torch::autograd::backward({output}, {grad_outputs[0]});
    if (grad) grads[0] = detached[0].grad();
    return grads;
  }
};

extern "C" char* ptx_checkpoint_message(const char* text, int64_t len) {
  return ptx_error(std::string(text, static_cast<size_t>(len)));
}

extern "C" char* ptx_checkpoint_new(ptx_block_fn call, ptx_release_fn release, void* ctx, void** out) {
  PTX_TRY
  *out = c10::make_intrusive<Block>(call, release, ctx).release();
  PTX_CATCH
}

extern "C" void ptx_checkpoint_free(void* block) {
  c10::intrusive_ptr<Block>::reclaim(static_cast<Block*>(block));
}

extern "C" char* ptx_checkpoint_apply(void* block, ptx_tensor* inputs, int64_t n, ptx_tensor* out) {
  PTX_TRY
  std::vector<at::Tensor> list;
  list.reserve(n);
  for (int64_t i = 0; i < n; i++) list.push_back(*static_cast<at::Tensor*>(inputs[i]));
  // An input that needs no gradient (frozen embeddings, as with LoRA) would leave the
  // Function out of the graph, and the block's own parameters without gradients
  // (the reentrant checkpoint's trap; transformers' enable_input_require_grads).
  // A leaf that wants one keeps the block in the graph; its gradient is dropped.
  if (n > 0 && at::GradMode::is_enabled() && !list[0].requires_grad()) list[0] = list[0].detach().requires_grad_(true);
  auto shared = c10::intrusive_ptr<Block>::unsafe_reclaim_from_nonowning(static_cast<Block*>(block));
  auto outputs = Checkpoint::apply(at::TensorList(list), shared);
  *out = new at::Tensor(outputs[0]);
  PTX_CATCH
}
