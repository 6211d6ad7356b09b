#pragma once
// Optimizer internals shared by optimizer.cpp (groups, step), step_round.cpp (the step's kernel
// calls) and state_io.cpp (save/load).
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "optfuse/optim.h"
#include "optim/device_buffer.h"
#include "optim/param_index.h"
#include "optim/precision.h"
#include "optim/rule.h"
#include "optim/sparse_grad.h"
#include "optim/step_control.h"
#include "optim/worker_pool.h"

namespace optfuse {

struct Optimizer::Impl {
  struct Tensor {
    ParamRef ref;
    int64_t step = 0;                                 // torch's state['step']
    std::map<std::string, std::vector<float>> state;  // created lazily at the first step
    optim::HostState host;                            // the rule's per-tensor host state
    // 16-bit state: bf16 (state_dtype "bf16"), or the param's dtype without master weights.
    struct Buffer16 {
      DType dtype = DType::BF16;
      std::vector<uint16_t> bits;
    };
    std::map<std::string, Buffer16> state16;
    // Device tensors: all their state, f32 and bf16, on the device (state and state16 stay
    // empty). Shared so that copies of a Tensor (set() checks a changed copy) share the memory.
    std::map<std::string, std::shared_ptr<optim::DeviceBuffer>> device;
    // Caller-owned state (Optimizer::bind_state / bind_scalar, caller_state.cpp): buffers used
    // instead of the optimizer's own, and scalars ("step", host state) mirrored in caller memory.
    std::map<std::string, TensorRef> bound;
    std::map<std::string, TensorRef> bound_scalars;
    bool bound_fresh = false;  // the bound buffers are new state for the next update
    uint32_t stream = 0;       // this tensor's stochastic-rounding stream (precision.h)
    optim::SparseGrad sparse;  // the row-sparse gradient (rules with sparse_grads() only)
    // Gradient centralization applies (GC on and >= 2 dims): its row length, else 0.
    int64_t gc_cols(const Options& options) const {
      if (ref.param.shape.size() < 2 || !options.value("grad_centralization", false)) return 0;
      return ref.param.numel / ref.param.shape[0];
    }
    // The row length a per-row kernel reads (KernelCall::cols): a row is everything but the
    // first dim, numel / shape[0], as gradient centralization and a custom graph's row_* ops
    // (docs/graph-json.md) mean it; a tensor of fewer than 2 dims is one row.
    int64_t row_cols() const {
      const auto& shape = ref.param.shape;
      const int64_t cols =
          shape.size() < 2 || shape[0] <= 0 ? ref.param.numel : ref.param.numel / shape[0];
      return cols > 0 ? cols : 1;
    }
    // The kernel this tensor runs: the group's graph (gradient-centralized where GC applies)
    // with the group's schedule, or the tuned one for its size. Same arguments as Group::kernel.
    std::shared_ptr<const Kernel> kernel;
    // The group epoch this tensor's state was completed for (0: never), and the state buffer
    // each kernel input reads then (null for the param and grad, which the caller may change):
    // a step whose group epoch is unchanged neither re-plans the state nor looks it up by name.
    uint64_t epoch = 0;
    std::vector<void*> inputs;
  };
  struct Group {
    Options options;  // defaults merged with overrides, validated
    std::vector<Tensor> tensors;
    // Resolved at the first step after a structural change:
    std::string structure;
    std::shared_ptr<const Kernel> kernel;  // the plain graph's: the signature every tensor's takes
    std::vector<int> state_slot;  // kernel input position -> index into state_names (-1: p / g)
    std::vector<std::string> state_names;
    std::vector<size_t> output_input;  // kernel output position -> the input position it replaces
    optim::Precision precision;        // the dtypes of the bound kernel
    int key_slot = -1;                 // scalar position of round_sr's key; -1 if none
    uint64_t epoch = 0;                // advanced at each such resolution (see Tensor::epoch)

    // step()'s scalars (step_round.cpp): tensors of a group nearly always share their step and
    // host state, so the scalars (and the host state they lead to) are computed once and reused
    // while equal.
    struct ScalarMemo {
      bool valid = false;
      int64_t step = 0;
      bool created_now = false;
      optim::HostState host_before, host_after;
      std::vector<double> values;  // in kernel signature order
    } memo;
  };

  Engine* engine = nullptr;
  // Where every param, grad and state lives (device_support.h); for Memory::Cuda, the engine's
  // CUDA context state is allocated in, and the stream of the step being run.
  Memory memory = Memory::Host;
  void* cuda_context = nullptr;
  void* cuda_stream = nullptr;
  std::unique_ptr<optim::UpdateRule> rule;
  Options defaults;  // the rule's defaults merged with the optimizer config
  std::vector<Group> groups;
  optim::ParamIndex params;  // every group's params by address, for set_grad's overlap check
  std::unique_ptr<optim::WorkerPool> pool;  // for small tensors; made at the first step needing it
  optim::StepControl control;               // clipping, loss scaling, accumulation (step_control.h)
  // Scratch for step()'s round of kernel calls (step_round.h), kept so that a step allocates
  // nothing: each tensor's whole call, the slices they are cut into, the runs of slices a thread
  // claims at a time (start indices, then the end), and each thread's call for its slice.
  struct Round {
    struct Call {
      const Kernel* kernel = nullptr;
      KernelCall call;
    };
    struct Slice {
      uint32_t call;  // index into calls
      int64_t begin, n;
      bool serial;  // KernelCall::serial
    };
    std::vector<Call> calls;
    std::vector<Slice> slices;
    std::vector<size_t> claims;
    std::vector<KernelCall> lanes;
  } round;

  static std::string where(size_t group) { return "param group " + std::to_string(group); }
  static std::string where(size_t group, size_t index, const ParamRef& ref);
};

// The group at `group`; Error naming it if there is none.
Optimizer::Impl::Group& group_at(Optimizer::Impl& impl, size_t group);
// Binds a group to the kernel for its current structure and dtypes (compiling on first use).
void resolve_kernel(Optimizer::Impl& impl, Optimizer::Impl::Group& g, size_t group);

namespace optim {
// The tensor's bound scalars (caller_state.cpp): read into t.step / t.host before its update,
// written back after it.
void load_bound_scalars(Optimizer::Impl::Tensor& t);
void store_bound_scalars(const Optimizer::Impl::Tensor& t);
}  // namespace optim

}  // namespace optfuse
