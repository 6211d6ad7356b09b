#include "optim/group_plan.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <utility>

#include "optfuse/error.h"
#include "optfuse/kernel.h"
#include "optim/grad_centralization.h"

namespace optfuse::optim {

namespace {

// What the transforms apply beyond the recipe: group_graph()'s flags (the factored graph is the
// rule's own).
struct Variant {
  bool centralized, blocked;
};

// After the rule's graph (rule_graph(): the master-weights or the unmastered form, or its
// factored graph), each transform in this order rewrites the graph so far.
struct Transform {
  const char* name;
  Graph (*apply)(const Graph& g, const GraphRecipe& r, Variant v);
};
constexpr Transform kTransforms[] = {
    // g_eff - row_mean(g_eff) at the rule's effective gradient, for tensors of >= 2 dims when
    // the options ask (grad_centralization.h)
    {"gradient centralization", [](const Graph& g, const GraphRecipe&,
                                   Variant v) { return v.centralized ? centralize(g) : g; }},
    // g_eff = (grad_accum + grad) * grad_scale: accumulation, unscaling, clipping (grad_prologue.h)
    {"grad prologue", [](const Graph& g, const GraphRecipe& r,
                         Variant) { return with_grad_prologue(g, r.prologue); }},
    // 16-bit params, grads and state: conversions, the master copy, rounding (precision.h)
    {"precision",
     [](const Graph& g, const GraphRecipe& r, Variant) { return apply_precision(g, r.precision); }},
    // On f32 state whatever the params' dtype, for the tensors that keep 8-bit state: the rule's
    // state as 8-bit codes and per-block scales (block_state.h).
    {"8-bit state", [](const Graph& g, const GraphRecipe&,
                       Variant v) { return v.blocked ? quantize_state(g, blocked_states(g)) : g; }},
};

bool centralizes(const Options& h) { return h.value("grad_centralization", false); }

std::atomic<int64_t> graphs_built{0};

}  // namespace

int64_t group_graphs_built() { return graphs_built.load(); }

Options graph_view(const UpdateRule& rule, const Options& h) {
  const std::optional<std::vector<std::string>> names = rule.graph_options();
  if (!names) return h;
  Options view = Options::object();
  for (const std::string& name : *names)
    if (auto it = h.find(name); it != h.end()) view[name] = *it;
  return view;
}

Graph group_graph(const GraphRecipe& r, bool centralized, bool blocked, bool factored) {
  ++graphs_built;
  const Options view = graph_view(*r.rule, r.options);
  Graph g = [&] {
    if (!factored) return rule_graph(*r.rule, view, r.precision);
    std::optional<Graph> f = r.rule->factored_graph(view);
    if (!f) internal_error(r.rule->type() + " has no factored graph");
    return std::move(*f);
  }();
  const Variant v{centralized && centralizes(r.options), blocked};
  for (const Transform& t : kTransforms) g = t.apply(g, r, v);
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
  const Options view = graph_view(*r.rule, r.options);
  return static_cast<int64_t>(graph_state(rule_graph(*r.rule, view, r.precision)).size());
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
    const Options view = graph_view(rule, h);
    std::vector<StateSlot> slots = graph_state(rule.graph(view));
    if (std::optional<Graph> factored = rule.factored_graph(view)) {
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

KernelPlan plan_kernel(const Engine& engine, Graph graph) {
  KernelPlan k;
  k.planned = true;
  k.graph = std::move(graph);
  k.signature = engine.signature(k.graph);
  const KernelSignature& sig = k.signature;
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

std::shared_ptr<const GroupPlan> plan_group(const Engine& engine, GraphRecipe r,
                                            const std::string& where) {
  auto plan = std::make_shared<GroupPlan>();
  plan->structure = r.rule->structure(r.options);
  plan->centralizes = centralizes(r.options);
  plan->blocking = group_blocking(r.options);
  plan->dense = plan_kernel(engine, group_graph(r, false));
  if (r.rule->factored_graph(graph_view(*r.rule, r.options)))
    plan->factored = plan_kernel(engine, group_graph(r, false, false, true));
  if (plan->blocking.on()) {
    check_blockable(r, plan->dense.graph, where);
    plan->blocked = plan_kernel(engine, group_graph(r, false, true));
    // (step_round.cpp computes one list of scalars per group, in the plain kernel's order.)
    const auto &a = plan->blocked.signature.scalars, &b = plan->dense.signature.scalars;
    const bool same = a.size() == b.size() &&
                      std::equal(a.begin(), a.end(), b.begin(), [](const auto& x, const auto& y) {
                        return x.name == y.name && x.dtype == y.dtype;
                      });
    if (!same) internal_error("the 8-bit kernel's scalars differ from the group kernel's");
  }
  plan->recipe = std::move(r);
  return plan;
}

bool same_structure(const GroupPlan& plan, const GraphRecipe& r) {
  const GraphRecipe& p = plan.recipe;
  return p.rule == r.rule && p.precision == r.precision &&
         p.prologue.accumulated == r.prologue.accumulated &&
         p.prologue.scaled == r.prologue.scaled && plan.centralizes == centralizes(r.options) &&
         plan.blocking == group_blocking(r.options) &&
         plan.structure == r.rule->structure(r.options);
}

}  // namespace optfuse::optim
