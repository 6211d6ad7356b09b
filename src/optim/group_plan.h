#pragma once
// A param group's final update graph, and everything its step derives from it.
//
// group_graph() is the one pure function from (rule, options, dtypes, step features) to the
// graph a group's kernels compute: the rule's graph, then the flat list of named transforms in
// group_plan.cpp. plan_group() compiles it and derives the rest from the result alone: which
// state buffers exist and their dtypes, which input each output replaces, where a scalar goes.
// A group holds its plan as one immutable value (Optimizer::Impl::Group::plan), rebuilt only
// when the graph changes; `optfuse warmup` compiles the same graph (update_graph()).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "optfuse/engine.h"
#include "optfuse/graph.h"
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
Graph group_graph(const GraphRecipe& r, bool centralized);

// The state buffers a graph reads (Role::State inputs), in input order, with their dtypes: the
// rule's, then those the transforms add (the master copy, the accumulation buffer).
struct StateSlot {
  std::string name;
  DType dtype;
};
std::vector<StateSlot> graph_state(const Graph& g);

// The number of the rule's own state buffers in a group's step (bytes_per_step's count).
int64_t rule_state_count(const GraphRecipe& r);

// The state names a state file may hold for this rule: the rule's state under any of the
// structures its options select (each boolean option flipped, each number set to 0 and to 0.5,
// one at a time from `options`, where the rule accepts them), plus the master copy and the
// accumulation buffer. Derived from the graphs: a rule declares no list of its own.
std::vector<std::string> known_state_names(const UpdateRule& rule, const Options& options);

struct GroupPlan {
  GraphRecipe recipe;
  Graph graph;                           // group_graph(recipe, false)
  std::string graph_text;                // print(graph), what same_graph() compares
  bool centralizes = false;              // the options ask for gradient centralization
  std::shared_ptr<const Kernel> kernel;  // graph's: the arguments every tensor kernel takes
  std::vector<StateSlot> state;          // graph_state(graph)
  std::vector<size_t> output_input;      // kernel output position -> the input it replaces
  int key_slot = -1;                     // scalar position of round_sr's key; -1 if none
  uint64_t epoch = 0;                    // unique per plan (Tensor::epoch)

  bool has_state(const std::string& name) const;
};

// Compiles (or loads) the kernel of `r`'s graph and derives the plan. `epoch` identifies it.
std::shared_ptr<const GroupPlan> plan_group(Engine& engine, GraphRecipe r, uint64_t epoch);

// Whether `plan` was built for a graph equal to the one `r` gives (the options may differ in
// values the kernel takes as scalars, e.g. a scheduler's new lr).
bool same_graph(const GroupPlan& plan, const GraphRecipe& r);

}  // namespace optfuse::optim
