#pragma once
// A param group's final update graph, and everything its step derives from it.
//
// group_graph() is the one pure function from (rule, options, dtypes, step features) to the
// graph a group's kernels compute: the rule's graph, then the flat list of named transforms in
// group_plan.cpp. plan_group() derives the rest from the graphs' signatures (Engine::signature,
// nothing compiles): which state buffers exist and their dtypes, which input each output
// replaces, where a scalar goes. With state_dtype "int8" a group has two such kernel plans: the
// 8-bit one for tensors of at least min_8bit_size elements, and the plain one for the others.
// A group holds its plan as one immutable value, rebuilt only when its structure changes
// (same_structure: compared without building a graph); group_binding.h compiles its tensors'
// kernels. `optfuse warmup` compiles the same graphs (update_graph()).
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

// The options of `h` that `rule`'s graphs read (UpdateRule::graph_options): what group_graph()
// gives them.
Options graph_view(const UpdateRule& rule, const Options& h);

// The final update graph for `r`; `centralized`: with the gradient centralization the options
// ask for (for tensors of >= 2 dims; both graphs take the same arguments).
// `blocked`: the graph of a tensor with 8-bit state (block_state.h; the options' state_dtype is
// "int8" and the tensor has at least min_8bit_size elements). `factored`: the rule's factored
// graph (UpdateRule::factored_graph, for tensors of >= 2 dims; it must have one).
Graph group_graph(const GraphRecipe& r, bool centralized, bool blocked = false,
                  bool factored = false);

// How many graphs group_graph() has built in this process (tests: a hyperparameter change
// builds none).
int64_t group_graphs_built();

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
  bool planned = false;  // false: the group has no such graph (e.g. no factored one)
  Graph graph{""};
  // Engine::signature(graph): the arguments of every kernel its tensors run (those may differ
  // in schedule, and a gradient-centralized one in per_row only).
  KernelSignature signature;
  std::vector<StateSlot> state;      // graph_state(graph)
  std::vector<size_t> output_input;  // kernel output position -> the input it replaces
  int key_slot = -1;                 // scalar position of round_sr's key; -1 if none

  bool has_state(const std::string& name) const;
};

struct GroupPlan {
  GraphRecipe recipe;
  std::string structure;     // what same_structure() compares (UpdateRule::structure)
  bool centralizes = false;  // the options ask for gradient centralization
  Blocking blocking;         // 8-bit state's block and minimum size (off unless "int8")
  KernelPlan dense;          // group_graph(recipe, false)
  KernelPlan blocked;        // group_graph(recipe, false, true) when blocking.on(), else empty
  // group_graph(recipe, false, false, true) when the rule has a factored graph, else empty: the
  // kernel of its tensors of >= 2 dims.
  KernelPlan factored;

  // Of a tensor of `numel` elements and `ndim` dims: the block of its 8-bit state (0: it has
  // none), whether it runs the factored graph (>= 2 dims and the rule has one), whether it is
  // gradient-centralized (>= 2 dims, GC on), and its kernel plan.
  int64_t block_of(int64_t numel) const { return blocking.applies(numel) ? blocking.block : 0; }
  bool factors(size_t ndim) const { return factored.planned && ndim >= 2; }
  bool centralized(size_t ndim) const { return centralizes && ndim >= 2 && !factors(ndim); }
  const KernelPlan& of(int64_t numel, size_t ndim) const {
    return block_of(numel) > 0 ? blocked : factors(ndim) ? factored : dense;
  }
};

// Why 8-bit state cannot serve a group of recipe `r` whose plain graph is `dense`, or "" if it
// can: its blocks are the kernel's rows, so the update itself must not reduce per row or over
// the tensor (LAMB, LARS, gradient centralization), nor take sparse gradients.
std::string unblockable(const GraphRecipe& r, const Graph& dense);
// Error naming `where` if unblockable() says why.
void check_blockable(const GraphRecipe& r, const Graph& dense, const std::string& where);

// The plan of `r`'s graphs (and the 8-bit one for state_dtype "int8"), from their signatures:
// nothing compiles. Error naming `where` (the group) if the options ask for 8-bit state that the
// rule's update cannot have, or a graph has an opaque op the engine has no implementation of.
std::shared_ptr<const GroupPlan> plan_group(const Engine& engine, GraphRecipe r,
                                            const std::string& where = "param group");

// Whether `plan` was built for the graphs `r` gives, from their recipes alone (the options may
// differ in values the kernel takes as scalars, e.g. a scheduler's new lr): no graph is built.
bool same_structure(const GroupPlan& plan, const GraphRecipe& r);

}  // namespace optfuse::optim
