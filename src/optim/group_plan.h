#pragma once
// A param group's final update graph, and everything its step derives from it.
//
// group_graph() is the one pure function from (rule, options, dtypes, step features) to the
// graph a group's kernels compute: the rule's graph, then the flat list of named transforms in
// group_plan.cpp. plan_group() compiles it and derives the rest from the result alone: which
// state buffers exist and their dtypes, which input each output replaces, where a scalar goes.
// With state_dtype "int8" a group has two such kernel plans: the 8-bit one for tensors of at
// least min_8bit_size elements, and the plain one for the others.
// A group holds its plan as one immutable value (Optimizer::Impl::Group::plan), rebuilt only
// when the graph changes; `optfuse warmup` compiles the same graph (update_graph()).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "optfuse/engine.h"
#include "optfuse/graph.h"
#include "optim/block_state.h"
#include "optim/grad_prologue.h"
#include "optim/precision.h"
#include "optim/rule.h"

namespace optfuse::optim {

// The inputs of a group's graph: what the rule computes, in which dtypes, with which step-level
// features (gradient accumulation, the fused unscale / clip scalar).
struct GraphRecipe {
  const UpdateRule* rule = nullptr;
  Options options;  // the group's merged options
  Precision precision;
  GradPrologue prologue;
};

// The final update graph for `r`; `centralized` keeps the rule's gradient centralization (for
// tensors of >= 2 dims) and is otherwise turned off, so that both graphs take the same arguments.
// `blocked`: the graph of a tensor with 8-bit state (block_state.h; the options' state_dtype is
// "int8" and the tensor has at least min_8bit_size elements). `factored`: the rule's factored
// graph (UpdateRule::factored_graph, for tensors of >= 2 dims; it must have one).
Graph group_graph(const GraphRecipe& r, bool centralized, bool blocked = false,
                  bool factored = false);

// The state buffers a graph reads (Role::State, Role::RowState and Role::ColState inputs), in
// input order, with their dtypes: the rule's, then those the transforms add (the master copy,
// the accumulation buffer, 8-bit state's per-block scales).
struct StateSlot {
  std::string name;
  DType dtype;
  // Row state: one value per row of the kernel's view (8-bit state's scales: per block; a
  // factored graph's: per row of each matrix); column state: one per column of each matrix.
  bool rows = false;
  bool cols = false;
};
std::vector<StateSlot> graph_state(const Graph& g);

// The number of the rule's own state buffers in a group's step (bytes_per_step's count).
int64_t rule_state_count(const GraphRecipe& r);

// The state names a state file may hold for this rule: the rule's state under any of the
// structures its options select (each boolean option flipped, each number set to 0 and to 0.5,
// one at a time from `options`, where the rule accepts them), plus the master copy and the
// accumulation buffer. Derived from the graphs: a rule declares no list of its own.
std::vector<std::string> known_state_names(const UpdateRule& rule, const Options& options);

// One graph's kernel and what its calls are derived from.
struct KernelPlan {
  Graph graph{""};
  std::shared_ptr<const Kernel> kernel;  // graph's: the arguments its tensors' kernels take
  std::vector<StateSlot> state;          // graph_state(graph)
  std::vector<size_t> output_input;      // kernel output position -> the input it replaces
  int key_slot = -1;                     // scalar position of round_sr's key; -1 if none

  bool has_state(const std::string& name) const;
};

struct GroupPlan {
  GraphRecipe recipe;
  std::string graph_text;    // the dense and factored graphs' text, what same_graph() compares
  bool centralizes = false;  // the options ask for gradient centralization
  Blocking blocking;         // 8-bit state's block and minimum size (off unless "int8")
  KernelPlan dense;          // group_graph(recipe, false)
  KernelPlan blocked;        // group_graph(recipe, false, true) when blocking.on(), else empty
  // group_graph(recipe, false, false, true) when the rule has a factored graph, else empty: the
  // kernel of its tensors of >= 2 dims.
  KernelPlan factored;
  uint64_t epoch = 0;  // unique per plan (Tensor::epoch)

  // The kernel plan of a tensor: blocked for tensors with 8-bit state, factored for tensors of
  // >= 2 dims when the rule has a factored graph.
  const KernelPlan& of(bool is_blocked, bool is_factored = false) const {
    return is_blocked ? blocked : is_factored ? factored : dense;
  }
};

// Why 8-bit state cannot serve a group of recipe `r` whose plain graph is `dense`, or "" if it
// can: its blocks are the kernel's rows, so the update itself must not reduce per row or over
// the tensor (LAMB, LARS, gradient centralization), nor take sparse gradients.
std::string unblockable(const GraphRecipe& r, const Graph& dense);
// Error naming `where` if unblockable() says why.
void check_blockable(const GraphRecipe& r, const Graph& dense, const std::string& where);

// Compiles (or loads) the kernel of `r`'s graph (and the 8-bit one for state_dtype "int8") and
// derives the plan. `epoch` identifies it. Error naming `where` (the group) if the options ask
// for 8-bit state that the rule's update cannot have. `size_hint` >= 0: the kernels take the
// schedule Engine::kernel(g, size_hint) gives (with tuned schedules, the group's largest
// tensor's), so that the plan's kernel is one its tensors run, not one more compile.
std::shared_ptr<const GroupPlan> plan_group(Engine& engine, GraphRecipe r, uint64_t epoch,
                                            const std::string& where = "param group",
                                            int64_t size_hint = -1);

// Whether `plan` was built for a graph equal to the one `r` gives (the options may differ in
// values the kernel takes as scalars, e.g. a scheduler's new lr) and the same 8-bit blocking.
bool same_graph(const GroupPlan& plan, const GraphRecipe& r);

}  // namespace optfuse::optim
