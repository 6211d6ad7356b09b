#pragma once
// What an Optimizer holds, apart from the scratch of its steps (step_round.h's StepRunner): the
// rule, its groups with their plans and bindings, each tensor's state, the step options. The
// files of src/optim that implement its parts (caller_state.cpp, state_views.cpp, state_io.cpp,
// step_control.cpp, step_round.cpp) work on this; optimizer.cpp alone knows Optimizer::Impl (this
// and the step runner) and forwards to them.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "optfuse/optim.h"
#include "optim/group_binding.h"
#include "optim/group_plan.h"
#include "optim/param_index.h"
#include "optim/precision.h"
#include "optim/rule.h"
#include "optim/sparse_grad.h"
#include "optim/state_buffer.h"
#include "optim/step_control.h"

namespace optfuse::optim {

struct OptimizerState {
  struct Tensor {
    ParamRef ref;
    int64_t step = 0;  // torch's state['step']
    // Every state buffer, by name, whatever its dtype and memory (state_buffer.h): the rule's,
    // the master copy, the accumulation buffer; made at the first step that needs it, or bound
    // by the caller (Optimizer::bind_state, caller_state.cpp).
    std::map<std::string, StateBuffer> state;
    HostState host;  // the rule's per-tensor host state
    // Caller-owned scalars ("step", host state) mirrored in caller memory (Optimizer::bind_scalar).
    std::map<std::string, TensorRef> bound_scalars;
    bool bound_fresh = false;  // the bound buffers are new state for the next update
    uint32_t stream = 0;       // this tensor's stochastic-rounding stream (precision.h)
    SparseGrad sparse;         // the row-sparse gradient (rules with sparse_grads() only)
    // The row length a per-row kernel reads (KernelCall::cols): a row is everything but the
    // first dim, numel / shape[0], as gradient centralization and a custom graph's row_* ops
    // (docs/graph-json.md) mean it; a tensor of fewer than 2 dims is one row.
    int64_t row_cols() const {
      const auto& shape = ref.param.shape;
      const int64_t cols =
          shape.size() < 2 || shape[0] <= 0 ? ref.param.numel : ref.param.numel / shape[0];
      return cols > 0 ? cols : 1;
    }
    // Rules with a factored graph (UpdateRule::factored_graph): whether this tensor would run it
    // (two or more dims), and its matrices' view: the last dim (cols) and the second-to-last
    // (the rows of one matrix; the leading dims are batches).
    bool matrix() const { return ref.param.shape.size() >= 2; }
    int64_t matrix_cols() const { return matrix() ? ref.param.shape.back() : ref.param.numel; }
    int64_t matrix_rows() const {
      return matrix() ? ref.param.shape[ref.param.shape.size() - 2] : 1;
    }
    // The values of state slot `s` of this tensor: the param's numel, or one per row (8-bit
    // state's scales: per block of `block`) or column of its view.
    int64_t state_numel(const StateSlot& s, int64_t block) const;
    // The shape of a buffer of `s`: the param's, or for row (column) state torch's Adafactor
    // shape, the param's with its last (second-to-last) dim 1; 8-bit scales: 1-D.
    std::vector<int64_t> state_shape(const StateSlot& s, int64_t block) const;
    // The block size its 8-bit state buffers were made with (0: it holds none); a changed
    // block_size converts them at the next step.
    int64_t state_block = 0;
    // The group binding this tensor's state was completed for (null: never, or looked up again
    // at the next step), and the state buffer each kernel input reads then (null for the param
    // and grad, which the caller may change): a step whose binding is unchanged neither
    // re-plans the state nor looks it up.
    std::shared_ptr<const GroupBinding> bound;
    std::vector<void*> inputs;
  };
  struct Group {
    Options options;  // defaults merged with overrides, validated
    std::vector<Tensor> tensors;
    // The kernels of its tensors (group_binding.h) under the group's final update graph and all
    // that is derived from it (plan(), group_plan.h), and the options they were last checked
    // against: resolved at the first step (or state_spec) after they change.
    std::shared_ptr<const GroupBinding> binding;
    Options plan_options;
    const GroupPlan* plan() const { return binding ? &binding->plan() : nullptr; }
    // Of tensor `t` under the plan: the block size of its 8-bit state (0: none; state_dtype
    // "int8" and at least min_8bit_size elements), whether it runs the factored graph, and its
    // kernel plan.
    int64_t block_of(const Tensor& t) const { return plan()->block_of(t.ref.param.numel); }
    bool factored(const Tensor& t) const { return plan()->factors(t.ref.param.shape.size()); }
    const KernelPlan& plan_of(const Tensor& t) const {
      return plan()->of(t.ref.param.numel, t.ref.param.shape.size());
    }
    // Each tensor's kernel, by index (waits for the binding's compile; throws its Error).
    const std::vector<std::shared_ptr<const Kernel>>& kernels() const { return binding->kernels(); }

    // step()'s scalars (step_round.cpp): tensors of a group nearly always share their step and
    // host state, so the scalars (and the host state they lead to) are computed once and reused
    // while equal.
    struct ScalarMemo {
      bool valid = false;
      int64_t step = 0;
      bool created_now = false;
      int64_t rows = 0, cols = 0;  // compared only for rules whose scalars read them
      HostState host_before, host_after;
      std::vector<double> values;           // in the dense kernel's signature order
      std::vector<double> factored_values;  // in the factored kernel's, when the plan has one
    } memo;
  };

  Engine* engine = nullptr;
  // Where every param, grad and state lives (device_support.h); for Memory::Cuda, the engine's
  // CUDA context state is allocated in, and the stream of the step being run.
  Memory memory = Memory::Host;
  void* cuda_context = nullptr;
  void* cuda_stream = nullptr;
  std::unique_ptr<UpdateRule> rule;
  Options defaults;  // the rule's defaults merged with the optimizer config
  std::vector<Group> groups;
  ParamIndex params;    // every group's params by address, for set_grad's overlap check
  StepControl control;  // clipping, loss scaling, accumulation (step_control.h)

  static std::string where(size_t group) { return "param group " + std::to_string(group); }
  static std::string where(size_t group, size_t index, const ParamRef& ref);
};

// The group at `group`; Error naming it if there is none.
OptimizerState::Group& group_at(OptimizerState& impl, size_t group);
// Gives the group the plan for its current options and dtypes, and its binding (which starts
// compiling its tensors' kernels where that is new).
void resolve_plan(OptimizerState& impl, OptimizerState::Group& g, size_t group);

// The tensor's bound scalars (caller_state.cpp): read into t.step / t.host before its update,
// written back after it.
void load_bound_scalars(OptimizerState::Tensor& t);
void store_bound_scalars(const OptimizerState::Tensor& t);

// The Optimizer methods of the same names, implemented on the state (optimizer.cpp forwards):
// caller_state.cpp
std::vector<Optimizer::StateSpec> state_spec(OptimizerState& impl, size_t group);
std::vector<Optimizer::StateSpec> state_spec(OptimizerState& impl, size_t group, size_t index);
void bind_state(OptimizerState& impl, size_t group, size_t index, const std::string& name,
                const TensorRef& buffer, bool fresh);
void bind_scalar(OptimizerState& impl, size_t group, size_t index, const std::string& name,
                 const TensorRef& value);
// state_views.cpp
const std::vector<float>* state(OptimizerState& impl, size_t group, size_t index,
                                const std::string& name);
const std::vector<uint16_t>* state_bf16(OptimizerState& impl, size_t group, size_t index,
                                        const std::string& name);
std::vector<float> state_values(OptimizerState& impl, size_t group, size_t index,
                                const std::string& name);
TensorRef state_ref(OptimizerState& impl, size_t group, size_t index, const std::string& name);
int64_t step_count(OptimizerState& impl, size_t group, size_t index);
// state_io.cpp
void save_state(OptimizerState& impl, const std::string& path);
void load_state(OptimizerState& impl, const std::string& path);

}  // namespace optfuse::optim
