// A group's plan (src/optim/group_plan.h): one pure function makes the final update graph, and
// the state buffers, their dtypes and when to recompile are derived from that graph alone; a
// tensor's state buffers are one map whatever their dtype or memory (src/optim/state_buffer.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "optfuse/engine.h"
#include "optfuse/optim.h"
#include "optim/grad_centralization.h"
#include "optim/group_plan.h"
#include "optim/options.h"
#include "optim/state_buffer.h"
#include "support/engine.h"
#include "support/optim_util.h"

namespace optfuse {
namespace {

using optim::GraphRecipe;

// The rule's defaults with `overrides`, as a group holds them.
struct Recipe {
  std::unique_ptr<optim::UpdateRule> rule;
  GraphRecipe r;
  Recipe(const std::string& type, const Options& overrides) : rule(optim::make_rule(type)) {
    r.rule = rule.get();
    r.options = optim::merge(optim::with_precision_defaults(rule->defaults()), overrides, type,
                             "param group");
  }
};

std::set<std::string> state_names(const Graph& g) {
  std::set<std::string> names;
  for (const auto& s : optim::graph_state(g)) names.insert(s.name);
  return names;
}

std::set<std::string> names_of(const std::string& type, const Options& overrides) {
  Recipe x(type, overrides);
  return state_names(optim::group_graph(x.r, false));
}

TEST(GroupPlan, StateBuffersAreTheGraphsStateInputsWithTorchsNames) {
  using Names = std::set<std::string>;
  EXPECT_EQ(names_of("adamw", {}), (Names{"exp_avg", "exp_avg_sq"}));
  EXPECT_EQ(names_of("adam", {{"amsgrad", true}}),
            (Names{"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}));
  EXPECT_EQ(names_of("sgd", {}), Names{});  // no momentum: no buffer (torch keeps None)
  EXPECT_EQ(names_of("sgd", {{"momentum", 0.9}}), Names{"momentum_buffer"});
  EXPECT_EQ(names_of("rmsprop", {{"centered", true}, {"momentum", 0.9}}),
            (Names{"square_avg", "grad_avg", "momentum_buffer"}));
  EXPECT_EQ(names_of("adagrad", {}), Names{"sum"});
  EXPECT_EQ(names_of("adamax", {}), (Names{"exp_avg", "exp_inf"}));
  EXPECT_EQ(names_of("lion", {}), Names{"exp_avg"});
  EXPECT_EQ(names_of("adadelta", {}), (Names{"square_avg", "acc_delta"}));
  EXPECT_EQ(names_of("asgd", {}), Names{"ax"});  // eta and mu: host state
  EXPECT_EQ(names_of("rprop", {}), (Names{"prev", "step_size"}));
}

TEST(GroupPlan, TransformsAddTheMasterCopyAndTheAccumulationBuffer) {
  Recipe x("adamw", {{"state_dtype", "bf16"}});
  x.r.precision = optim::group_precision(x.r.options, DType::BF16, DType::BF16, "param group");
  x.r.prologue.accumulated = true;
  x.r.prologue.scaled = true;
  const Graph g = optim::group_graph(x.r, false);
  std::map<std::string, DType> dtypes;
  for (const auto& s : optim::graph_state(g)) dtypes[s.name] = s.dtype;
  EXPECT_EQ(dtypes, (std::map<std::string, DType>{{"exp_avg", DType::BF16},
                                                  {"exp_avg_sq", DType::BF16},
                                                  {optim::kMasterState, DType::F32},
                                                  {optim::kGradAccum, DType::F32}}));
  EXPECT_GE(g.find_scalar(optim::kGradScale), 0);
  // The rule's own state is what bytes_per_step counts.
  EXPECT_EQ(optim::rule_state_count(x.r), 2);
}

TEST(GroupPlan, CentralizedGraphTakesThePlainGraphsArguments) {
  Recipe x("sgd", {{"momentum", 0.9}, {"grad_centralization", true}});
  const Graph plain = optim::group_graph(x.r, false), gc = optim::group_graph(x.r, true);
  EXPECT_FALSE(uses_rows(plain));
  EXPECT_TRUE(uses_rows(gc));
  EXPECT_EQ(state_names(plain), state_names(gc));
}

// Gradient centralization is the first transform of the list, at the effective gradient the
// rule's graph labels; a label is no part of a graph's structure.
TEST(GroupPlan, GradientCentralizationTransformsTheLabelledGradient) {
  Recipe x("sgd", {{"momentum", 0.9}, {"grad_centralization", true}});
  const Graph rule = x.rule->graph(x.r.options);
  ASSERT_GE(rule.find_label(optim::kEffectiveGrad), 0);
  EXPECT_FALSE(uses_rows(rule));
  const Graph gc = optim::centralize(rule);
  EXPECT_TRUE(uses_rows(gc));
  EXPECT_EQ(gc.name(), rule.name() + "_gc");
  EXPECT_EQ(print(optim::group_graph(x.r, true)), print(gc));

  Graph a("a"), b("a");
  for (Graph* g : {&a, &b}) {
    Value p = g->param("param"), d = g->scalar("lr") * g->grad("grad");
    if (g == &a) a.label("here", d);
    g->output("param", p - d);
  }
  EXPECT_EQ(print(a), print(b));
  EXPECT_EQ(structural_hash(canonicalize(a)).hex(), structural_hash(canonicalize(b)).hex());
  EXPECT_EQ(b.find_label("here"), -1);
  EXPECT_THROW(optim::centralize(b), Error);  // (an internal error: no rule offers GC without it)
}

// Only a change of the structure makes a new plan: a value the kernel takes as a scalar does
// not, and comparing builds no graph. A plan compiles nothing: its signatures come from the
// graphs.
TEST(GroupPlan, SameStructureExactlyWhenTheGraphIsUnchanged) {
  EngineOptions o;
  o.memory_only = true;
  Engine engine(o);
  Recipe x("adam", {});
  auto plan = optim::plan_group(engine, x.r);
  EXPECT_EQ(engine.counters().compiles, 0);
  EXPECT_TRUE(plan->dense.has_state("exp_avg_sq"));
  EXPECT_FALSE(plan->dense.has_state("max_exp_avg_sq"));
  ASSERT_EQ(plan->dense.output_input.size(), plan->dense.signature.outputs.size());
  EXPECT_EQ(plan->dense.key_slot, -1);
  EXPECT_FALSE(plan->factored.planned);
  EXPECT_EQ(signature_text(plan->dense.signature),
            signature_text(engine.kernel(plan->dense.graph)->signature()));

  auto with = [&](const Options& change) {
    GraphRecipe r = x.r;
    for (auto it = change.begin(); it != change.end(); ++it) r.options[it.key()] = it.value();
    return r;
  };
  EXPECT_TRUE(optim::same_structure(*plan, with({{"lr", 0.5}})));
  EXPECT_TRUE(optim::same_structure(*plan, with({{"betas", {0.5, 0.9}}, {"eps", 1e-3}})));
  EXPECT_TRUE(optim::same_structure(*plan, with({{"maximize", true}})));  // a sign scalar
  EXPECT_FALSE(optim::same_structure(*plan, with({{"amsgrad", true}})));
  EXPECT_FALSE(optim::same_structure(*plan, with({{"grad_centralization", true}})));
  EXPECT_FALSE(optim::same_structure(*plan, with({{"state_dtype", "int8"}})));
  GraphRecipe scaled = x.r;
  scaled.prologue.scaled = true;
  EXPECT_FALSE(optim::same_structure(*plan, scaled));
  GraphRecipe sixteen = x.r;
  sixteen.precision.param = DType::BF16;
  EXPECT_FALSE(optim::same_structure(*plan, sixteen));
}

// What makes the fast comparison sound: every rule's graphs, built from the options it declares
// (UpdateRule::graph_options), are the graphs of all its options, and equal structure text means
// equal graphs. Probed over each option flipped or set to 0, 0.5 and 2 (where valid), in the
// master-weights and the unmastered form, plain and factored.
TEST(GroupPlan, EveryRulesGraphIsAFunctionOfItsStructure) {
  for (const std::string& type : optim::rule_types()) {
    SCOPED_TRACE(type);
    Recipe x(type, {});
    const optim::UpdateRule& rule = *x.rule;
    std::vector<Options> probes = {x.r.options};
    for (auto it = x.r.options.begin(); it != x.r.options.end(); ++it) {
      if (it.value().is_boolean()) {
        probes.push_back(x.r.options);
        probes.back()[it.key()] = !it.value().get<bool>();
      } else if (it.value().is_number()) {
        for (double v : {0.0, 0.5, 2.0}) {
          probes.push_back(x.r.options);
          probes.back()[it.key()] = v;
        }
      }
    }
    std::vector<std::pair<std::string, std::string>> seen;  // structure, graphs' text
    for (const Options& h : probes) {
      try {
        rule.validate(h, "");
      } catch (const Error&) {
        continue;
      }
      const Options view = optim::graph_view(rule, h);
      std::string text = print(rule.graph(h)) + print(rule.unmastered_graph(h));
      EXPECT_EQ(print(rule.graph(view)) + print(rule.unmastered_graph(view)), text) << h.dump();
      if (auto f = rule.factored_graph(h)) {
        text += print(*f);
        EXPECT_EQ(print(*rule.factored_graph(view)), print(*f)) << h.dump();
      }
      const std::string structure = rule.structure(h);
      for (const auto& [s, t] : seen)
        if (s == structure) EXPECT_EQ(t, text) << "structure " << s << ", options " << h.dump();
      seen.emplace_back(structure, text);
    }
    EXPECT_GT(seen.size(), 1u);
  }
}

TEST(GroupPlan, StateFilesMayHoldTheStateOfAnyStructure) {
  auto known = [](const std::string& type, const Options& overrides) {
    Recipe x(type, overrides);
    std::vector<std::string> k = optim::known_state_names(*x.rule, x.r.options);
    return std::set<std::string>(k.begin(), k.end());
  };
  // From SGD without momentum, a buffer made while it had some (torch keeps it too).
  EXPECT_TRUE(known("sgd", {}).count("momentum_buffer"));
  EXPECT_TRUE(known("adam", {}).count("max_exp_avg_sq"));
  const auto rms = known("rmsprop", {});
  EXPECT_TRUE(rms.count("grad_avg") && rms.count("momentum_buffer") && rms.count("square_avg"));
  EXPECT_TRUE(rms.count(optim::kMasterState) && rms.count(optim::kGradAccum));
  EXPECT_FALSE(rms.count("exp_avg"));
}

// The stale buffer of an earlier structure is saved, accepted on load and used again when the
// structure comes back, as in torch (SGD keeps momentum_buffer while momentum is 0).
TEST(GroupPlan, StaleStateSurvivesSaveAndLoad) {
  Engine& engine = testing::shared_engine();
  auto run = [&](bool through_file) {
    testing::Model m = testing::Model::make({{300}}, 11);
    auto opt = Optimizer::create(engine, {{"type", "sgd"}, {"lr", 0.1}, {"momentum", 0.9}});
    opt->add_param_group(m.refs(0));
    m.fill_grads(1);
    opt->step();
    opt->set(0, "momentum", 0.0);
    m.fill_grads(2);
    opt->step();
    EXPECT_NE(opt->state(0, 0, "momentum_buffer"), nullptr);  // kept, not used
    if (through_file) {
      const std::string path = testing::temp_path("stale_state");
      opt->save_state(path);
      opt = Optimizer::create(engine, {{"type", "sgd"}, {"lr", 0.1}, {"momentum", 0.9}});
      opt->add_param_group(m.refs(0));
      opt->load_state(path);
    }
    opt->set(0, "momentum", 0.9);
    m.fill_grads(3);
    opt->step();
    return m.groups[0][0].p;
  };
  // Saving and loading is invisible: the same bits as the uninterrupted run.
  EXPECT_TRUE(testing::same_bits(run(false), run(true)));
}

TEST(StateBuffer, OneTypeForEveryDtypeAndOwner) {
  auto f32 = optim::StateBuffer::host(std::vector<float>{1.5f, -2.0f});
  EXPECT_EQ(f32.dtype(), DType::F32);
  EXPECT_EQ(f32.numel(), 2);
  EXPECT_EQ(f32.bytes(), 8u);
  ASSERT_NE(f32.f32(), nullptr);
  EXPECT_EQ(f32.data(), f32.f32()->data());
  EXPECT_EQ(f32.bits(), nullptr);

  // bf16 bits of 1.5 and -2.0: widened exactly.
  auto b16 = optim::StateBuffer::host(DType::BF16, std::vector<uint16_t>{0x3FC0, 0xC000});
  EXPECT_EQ(b16.f32(), nullptr);
  EXPECT_EQ(b16.bytes(), 4u);
  EXPECT_EQ(b16.to_f32(), (std::vector<float>{1.5f, -2.0f}));

  std::vector<float> mine = {3.0f, 4.0f, 5.0f};
  TensorRef ref{mine.data(), 3, {3}, DType::F32, Memory::Host};
  auto caller = optim::StateBuffer::caller(ref);
  EXPECT_TRUE(caller.caller_owned());
  EXPECT_FALSE(caller.on_device());
  EXPECT_EQ(caller.data(), mine.data());  // used in place
  EXPECT_EQ(caller.f32(), nullptr);       // not the optimizer's own vector
  EXPECT_EQ(caller.to_f32(), mine);
}

}  // namespace
}  // namespace optfuse
