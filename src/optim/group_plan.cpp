#include "optim/group_plan.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "optfuse/error.h"
#include "optfuse/kernel.h"

namespace optfuse::optim {

namespace {

// After the rule's graph (rule_graph(): the master-weights or the unmastered form, with the
// rule's gradient centralization), each transform in this order rewrites the graph so far.
struct Transform {
  const char* name;
  Graph (*apply)(const Graph& g, const GraphRecipe& r);
};
constexpr Transform kTransforms[] = {
    // g_eff = (grad_accum + grad) * grad_scale: accumulation, unscaling, clipping (grad_prologue.h)
    {"grad prologue",
     [](const Graph& g, const GraphRecipe& r) { return with_grad_prologue(g, r.prologue); }},
    // 16-bit params, grads and state: conversions, the master copy, rounding (precision.h)
    {"precision",
     [](const Graph& g, const GraphRecipe& r) { return apply_precision(g, r.precision); }},
};

bool centralizes(const Options& h) { return h.value("grad_centralization", false); }

}  // namespace

Graph group_graph(const GraphRecipe& r, bool centralized, bool blocked, bool factored) {
  Graph g = [&] {
    if (factored) {
      std::optional<Graph> f = r.rule->factored_graph(r.options);
      if (!f) internal_error(r.rule->type() + " has no factored graph");
      return std::move(*f);
    }
    if (centralized || !centralizes(r.options)) return rule_graph(*r.rule, r.options, r.precision);
    Options plain = r.options;
    plain["grad_centralization"] = false;
    return rule_graph(*r.rule, plain, r.precision);
  }();
  for (const Transform& t : kTransforms) g = t.apply(g, r);
  // Last, on f32 state whatever the params' dtype: the rule's state as 8-bit codes and per-block
  // scales (block_state.h). Only for the tensors that keep 8-bit state, so not in the list.
  if (blocked) g = quantize_state(g, blocked_states(g));
  return g;
}

std::vector<StateSlot> graph_state(const Graph& g) {
  std::vector<StateSlot> out;
  for (const Node& n : g.nodes())
    if (n.op == Op::Input &&
        (n.role == Role::State || n.role == Role::RowState || n.role == Role::ColState))
      out.push_back({n.name, n.dtype, n.role == Role::RowState, n.role == Role::ColState});
  return out;
}

int64_t rule_state_count(const GraphRecipe& r) {
  return static_cast<int64_t>(graph_state(rule_graph(*r.rule, r.options, r.precision)).size());
}

std::vector<std::string> known_state_names(const UpdateRule& rule, const Options& options) {
  std::vector<Options> probes = {options};
  for (auto it = options.begin(); it != options.end(); ++it) {
    if (it.value().is_boolean()) {
      probes.push_back(options);
      probes.back()[it.key()] = !it.value().get<bool>();
    } else if (it.value().is_number()) {
      for (double v : {0.0, 0.5}) {
        probes.push_back(options);
        probes.back()[it.key()] = v;
      }
    }
  }
  std::vector<std::string> names = {kMasterState, kGradAccum};
  for (const Options& h : probes) {
    try {
      rule.validate(h, "");
    } catch (const Error&) {
      continue;  // not an option set the rule accepts
    }
    std::vector<StateSlot> slots = graph_state(rule.graph(h));
    if (std::optional<Graph> factored = rule.factored_graph(h)) {
      const std::vector<StateSlot> more = graph_state(*factored);
      slots.insert(slots.end(), more.begin(), more.end());
    }
    for (const StateSlot& s : slots)
      if (std::find(names.begin(), names.end(), s.name) == names.end()) names.push_back(s.name);
  }
  return names;
}

bool KernelPlan::has_state(const std::string& name) const {
  return std::any_of(state.begin(), state.end(),
                     [&](const StateSlot& s) { return s.name == name; });
}

namespace {

KernelPlan plan_kernel(Engine& engine, Graph graph, int64_t size_hint) {
  KernelPlan k;
  k.graph = std::move(graph);
  k.kernel = size_hint >= 0 ? engine.kernel(k.graph, size_hint) : engine.kernel(k.graph);
  const KernelSignature& sig = k.kernel->signature();
  for (const auto& in : sig.inputs)
    if (in.role == Role::State || in.role == Role::RowState || in.role == Role::ColState)
      k.state.push_back({in.name, in.dtype, in.role == Role::RowState, in.role == Role::ColState});
  for (const auto& out : sig.outputs) {
    const int i = sig.input_index(out.replaces);
    if (i < 0) internal_error("output replaces unknown input '" + out.replaces + "'");
    k.output_input.push_back(static_cast<size_t>(i));
  }
  k.key_slot = sig.scalar_index(kRoundingKey);
  return k;
}

}  // namespace

std::string unblockable(const GraphRecipe& r, const Graph& dense) {
  if (r.rule->sparse_grads()) return r.rule->type() + " takes sparse gradients";
  if (centralizes(r.options)) return "grad_centralization reduces over the kernel's rows";
  for (const Node& n : dense.nodes()) {
    if (op_has(n.op, kReduce | kRowReduce))
      return r.rule->type() + "'s update has " + std::string(op_name(n.op)) +
             " (8-bit state's blocks are the kernel's rows)";
    if (op_has(n.op, kOpaque))
      return r.rule->type() + "'s update calls opaque op \"" + n.name +
             "\" between its kernels (8-bit state needs the update in one kernel)";
  }
  return "";
}

void check_blockable(const GraphRecipe& r, const Graph& dense, const std::string& where) {
  if (std::string why = unblockable(r, dense); !why.empty())
    throw Error(where + ": state_dtype \"int8\" is not supported here: " + why);
}

std::shared_ptr<const GroupPlan> plan_group(Engine& engine, GraphRecipe r, uint64_t epoch,
                                            const std::string& where, int64_t size_hint) {
  auto plan = std::make_shared<GroupPlan>();
  plan->centralizes = centralizes(r.options);
  plan->blocking = group_blocking(r.options);
  plan->dense = plan_kernel(engine, group_graph(r, false), size_hint);
  plan->graph_text = print(plan->dense.graph);
  if (r.rule->factored_graph(r.options)) {
    plan->factored = plan_kernel(engine, group_graph(r, false, false, true), size_hint);
    plan->graph_text += print(plan->factored.graph);
  }
  if (plan->blocking.on()) {
    check_blockable(r, plan->dense.graph, where);
    plan->blocked = plan_kernel(engine, group_graph(r, false, true), size_hint);
    // (step_round.cpp computes one list of scalars per group, in the plain kernel's order.)
    const auto &a = plan->blocked.kernel->signature().scalars,
               &b = plan->dense.kernel->signature().scalars;
    const bool same = a.size() == b.size() &&
                      std::equal(a.begin(), a.end(), b.begin(), [](const auto& x, const auto& y) {
                        return x.name == y.name && x.dtype == y.dtype;
                      });
    if (!same) internal_error("the 8-bit kernel's scalars differ from the group kernel's");
  }
  plan->recipe = std::move(r);
  plan->epoch = epoch;
  return plan;
}

bool same_graph(const GroupPlan& plan, const GraphRecipe& r) {
  const GraphRecipe& p = plan.recipe;
  if (p.rule != r.rule || !(p.precision == r.precision) ||
      p.prologue.accumulated != r.prologue.accumulated || p.prologue.scaled != r.prologue.scaled ||
      plan.centralizes != centralizes(r.options) || !(plan.blocking == group_blocking(r.options)))
    return false;
  std::string text = print(group_graph(r, false));
  if (r.rule->factored_graph(r.options)) text += print(group_graph(r, false, false, true));
  return text == plan.graph_text;
}

}  // namespace optfuse::optim
