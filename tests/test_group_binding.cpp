// A group's binding (src/optim/group_binding.h): its tensors' kernels, compiled on a thread of
// their own from when the plan is made, waited for by the first step; a hyperparameter change
// keeps it (and its kernels), a structural one makes a new one.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "optfuse/engine.h"
#include "optfuse/error.h"
#include "optfuse/optim.h"
#include "optim/group_binding.h"
#include "optim/group_plan.h"
#include "optim/options.h"
#include "optim/precision.h"
#include "support/engine.h"
#include "support/optim_util.h"

namespace optfuse {
namespace {

using testing::Model;

// An AdamW optimizer over one group of a vector and a matrix.
struct AdamwGroup {
  Engine engine{testing::memory_only()};
  Model model = Model::make({{1000, 3 * 64}}, 7);
  std::unique_ptr<Optimizer> opt;
  explicit AdamwGroup(const Options& config = {{"type", "adamw"}, {"lr", 1e-3}}) {
    model.groups[0][1].shape = {3, 64};
    opt = Optimizer::create(engine, config);
    opt->add_param_group(model.refs(0));
  }
};

// state_spec answers from the plan's signatures: the kernel it names compiles meanwhile, and the
// first step runs it (one compile in all).
TEST(GroupBinding, StateSpecAnswersFromSignaturesAndTheStepRunsTheCompiledKernel) {
  AdamwGroup s;
  const std::vector<Optimizer::StateSpec> spec = s.opt->state_spec(0, 1);
  ASSERT_EQ(spec.size(), 2u);
  EXPECT_EQ(spec[0].name, "exp_avg");
  EXPECT_EQ(spec[0].shape, (std::vector<int64_t>{3, 64}));
  s.model.fill_grads(1);
  const Model before = s.model;
  EXPECT_TRUE(s.opt->step().applied());
  EXPECT_EQ(s.engine.counters().compiles, 1);
  EXPECT_NE(s.model.groups[0][0].p, before.groups[0][0].p);
  ASSERT_EQ(s.opt->kernel_uses().size(), 1u);
  EXPECT_EQ(s.opt->kernel_uses()[0].tensors, 2);
}

// A scheduler's lr, new betas or weight decay keep the binding: no graph is built and no kernel
// looked up again. The twin binds anew (amsgrad on and off again) and runs the same
// kernel (one key, from the engine's table) with the same scalars: its bits must be the same,
// which shows the kept binding took the new values.
TEST(GroupBinding, HyperparameterChangesKeepTheBinding) {
  AdamwGroup s, twin;
  auto change = [](Optimizer& opt) {
    opt.set(0, "lr", 0.5);
    opt.set(0, "betas", {0.8, 0.9});
    opt.set(0, "weight_decay", 0.25);
  };
  s.model.fill_grads(1);
  ASSERT_TRUE(s.opt->step().applied());
  const int64_t lookups = s.engine.counters().lookups, graphs = optim::group_graphs_built();
  change(*s.opt);
  (void)s.opt->state_spec(0);  // (as the Python binding asks after each change)
  s.model.fill_grads(2);
  ASSERT_TRUE(s.opt->step().applied());
  EXPECT_EQ(s.engine.counters().lookups, lookups);
  EXPECT_EQ(optim::group_graphs_built(), graphs);

  twin.model.fill_grads(1);
  ASSERT_TRUE(twin.opt->step().applied());
  const int64_t twin_lookups = twin.engine.counters().lookups;
  change(*twin.opt);
  twin.opt->set(0, "amsgrad", true);
  (void)twin.opt->state_spec(0);
  twin.opt->set(0, "amsgrad", false);
  twin.model.fill_grads(2);
  ASSERT_TRUE(twin.opt->step().applied());
  EXPECT_GT(twin.engine.counters().lookups, twin_lookups);
  for (size_t i = 0; i < 2; ++i)
    EXPECT_TRUE(testing::same_bits(s.model.groups[0][i].p, twin.model.groups[0][i].p)) << i;
}

// A structural change (amsgrad) binds anew: a new state buffer, made at the next step.
TEST(GroupBinding, StructuralChangeMakesANewBinding) {
  AdamwGroup s;
  s.model.fill_grads(1);
  ASSERT_TRUE(s.opt->step().applied());
  s.opt->set(0, "amsgrad", true);
  const std::vector<Optimizer::StateSpec> spec = s.opt->state_spec(0, 0);
  ASSERT_EQ(spec.size(), 3u);
  EXPECT_EQ(spec[2].name, "max_exp_avg_sq");
  s.model.fill_grads(2);
  ASSERT_TRUE(s.opt->step().applied());
  EXPECT_EQ(s.engine.counters().compiles, 2);
}

// The binding's kernels: one per distinct kernel, each with the plan's arguments; GC on a matrix
// only. Destroyed before its compile ends, it waits for it.
TEST(GroupBinding, ChoosesEachTensorsKernelAndWaitsWhenDestroyed) {
  Engine engine(testing::memory_only());
  auto rule = optim::make_rule("sgd");
  optim::GraphRecipe r;
  r.rule = rule.get();
  r.options = optim::merge(optim::with_precision_defaults(rule->defaults()),
                           {{"momentum", 0.9}, {"grad_centralization", true}}, "sgd", "group");
  auto plan = optim::plan_group(engine, r);
  EXPECT_EQ(engine.counters().compiles, 0);
  { optim::GroupBinding dropped(engine, plan, {{100, 1}}, true); }
  EXPECT_EQ(engine.counters().compiles, 1);
  optim::GroupBinding b(engine, plan, {{100, 1}, {64, 2}, {50, 1}}, true);
  const auto& k = b.kernels();
  ASSERT_EQ(k.size(), 3u);
  EXPECT_EQ(k[0], k[2]);
  EXPECT_NE(k[0], k[1]);
  EXPECT_FALSE(k[0]->signature().per_row);
  EXPECT_TRUE(k[1]->signature().per_row);  // gradient-centralized
  EXPECT_EQ(engine.counters().compiles, 2);
}

// A compile's Error reaches whoever waits for the kernels (the step, which then changes
// nothing, and drops the binding so that its next try compiles again); the binding keeps it.
TEST(GroupBinding, ACompileErrorSurfacesAtTheStepAndChangesNothing) {
  Engine engine(testing::memory_only());
  auto rule = optim::make_rule("sgd");
  optim::GraphRecipe r;
  r.rule = rule.get();
  r.options = optim::merge(optim::with_precision_defaults(rule->defaults()), {}, "sgd", "group");
  auto plan = optim::plan_group(engine, r);
  // A kernel plan whose graph cannot compile: an opaque op registered after the plan was made
  // is there for the signature but the graph below names one that is not.
  auto broken = std::make_shared<optim::GroupPlan>(*plan);
  Graph g("broken");
  Value p = g.param("param"), grad = g.grad("grad");
  g.output("param", p - opaque("nowhere", grad));
  broken->dense.graph = g;
  optim::GroupBinding b(engine, broken, {{10, 1}}, true);
  EXPECT_THROW(b.kernels(), Error);
  EXPECT_THROW(b.kernels(), Error);
}

// advise_huge_pages (optim.h), what the optimizer uses for new state with OPTFUSE_HUGE_PAGES=1:
// advice for the whole 2 MiB pages inside a range, taken where the OS offers transparent huge
// pages.
TEST(GroupBinding, HugePageAdviceCoversWholePagesOnly) {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const bool offered = !modes.empty() && modes.find("[never]") == std::string::npos;
  std::vector<float> big;
  big.reserve(size_t(4) << 20);  // 16 MiB, not written
  EXPECT_EQ(advise_huge_pages(big.data(), big.capacity() * sizeof(float)), offered);
  std::vector<char> small(4096);
  EXPECT_FALSE(advise_huge_pages(small.data(), small.size()));
}

// The optimizer advises its new state into huge pages only with OPTFUSE_HUGE_PAGES=1 (off by
// default: on some hosts it slows the first step down, optfuse/optim.h).
TEST(GroupBinding, HugePagesForNewStateOnlyWhenTold) {
  constexpr size_t kBig = size_t(16) << 20;
  ASSERT_EQ(unsetenv("OPTFUSE_HUGE_PAGES"), 0);
  EXPECT_FALSE(huge_pages_for_new_state(kBig));
  ASSERT_EQ(setenv("OPTFUSE_HUGE_PAGES", "0", 1), 0);
  EXPECT_FALSE(huge_pages_for_new_state(kBig));
  ASSERT_EQ(setenv("OPTFUSE_HUGE_PAGES", "1", 1), 0);
  EXPECT_TRUE(huge_pages_for_new_state(kBig));
  ASSERT_EQ(unsetenv("OPTFUSE_HUGE_PAGES"), 0);
}

}  // namespace
}  // namespace optfuse
