#include "optim/group_plan.h"

#include <algorithm>
#include <utility>

#include "optfuse/error.h"

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

Graph group_graph(const GraphRecipe& r, bool centralized) {
  Graph g = [&] {
    if (centralized || !centralizes(r.options)) return rule_graph(*r.rule, r.options, r.precision);
    Options plain = r.options;
    plain["grad_centralization"] = false;
    return rule_graph(*r.rule, plain, r.precision);
  }();
  for (const Transform& t : kTransforms) g = t.apply(g, r);
  return g;
}

std::vector<StateSlot> graph_state(const Graph& g) {
  std::vector<StateSlot> out;
  for (const Node& n : g.nodes())
    if (n.op == Op::Input && n.role == Role::State) out.push_back({n.name, n.dtype});
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
    for (const StateSlot& s : graph_state(rule.graph(h)))
      if (std::find(names.begin(), names.end(), s.name) == names.end()) names.push_back(s.name);
  }
  return names;
}

bool GroupPlan::has_state(const std::string& name) const {
  return std::any_of(state.begin(), state.end(),
                     [&](const StateSlot& s) { return s.name == name; });
}

std::shared_ptr<const GroupPlan> plan_group(Engine& engine, GraphRecipe r, uint64_t epoch) {
  auto plan = std::make_shared<GroupPlan>();
  plan->centralizes = centralizes(r.options);
  plan->graph = group_graph(r, false);
  plan->graph_text = print(plan->graph);
  plan->recipe = std::move(r);
  plan->kernel = engine.kernel(plan->graph);
  const KernelSignature& sig = plan->kernel->signature();
  for (const auto& in : sig.inputs)
    if (in.role == Role::State) plan->state.push_back({in.name, in.dtype});
  for (const auto& out : sig.outputs) {
    const int i = sig.input_index(out.replaces);
    if (i < 0) internal_error("output replaces unknown input '" + out.replaces + "'");
    plan->output_input.push_back(static_cast<size_t>(i));
  }
  plan->key_slot = sig.scalar_index(kRoundingKey);
  plan->epoch = epoch;
  return plan;
}

bool same_graph(const GroupPlan& plan, const GraphRecipe& r) {
  const GraphRecipe& p = plan.recipe;
  if (p.rule != r.rule || !(p.precision == r.precision) ||
      p.prologue.accumulated != r.prologue.accumulated || p.prologue.scaled != r.prologue.scaled ||
      plan.centralizes != centralizes(r.options))
    return false;
  return print(group_graph(r, false)) == plan.graph_text;
}

}  // namespace optfuse::optim
