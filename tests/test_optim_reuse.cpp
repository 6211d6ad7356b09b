// "Compile once, call many": one kernel per update STRUCTURE, shared by every group and tensor
// whatever their sizes, shapes and hyperparameter values; a structural change (AMSGrad, momentum,
// Nesterov, Adam vs AdamW) is a different kernel. Each test uses its own Engine so its counters
// count only its own compiles.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "optfuse/engine.h"
#include "optfuse/optim.h"
#include "support/engine.h"
#include "support/gen.h"
#include "support/optim_util.h"
#include "support/reference_optim.h"

namespace optfuse {
namespace {

using testing::Model;

constexpr size_t kGroups = 3, kTensorsPerGroup = 50;

// 3 groups x 50 tensors: 1-D sizes spread over 1..5000 (including both ends) and every third
// tensor 2-D.
Model mixed_model() {
  std::vector<std::vector<size_t>> sizes(kGroups);
  std::vector<std::vector<std::vector<int64_t>>> shapes(kGroups);
  for (size_t g = 0; g < kGroups; ++g)
    for (size_t k = 0; k < kTensorsPerGroup; ++k) {
      size_t id = g * kTensorsPerGroup + k;
      std::vector<int64_t> shape;
      if (id % 3 == 1) {
        shape = {int64_t(1 + id % 37), int64_t(1 + (id * 7) % 71)};
      } else {
        double u = (testing::gen(77, id) + 1.0) / 2.0;  // [0, 1)
        shape = {int64_t(1 + u * 4999.0)};
      }
      if (id == 0) shape = {1};
      if (id == kGroups * kTensorsPerGroup - 1) shape = {5000};
      if (id == 3) shape = {50, 100};  // 2-D with 5000 elements
      sizes[g].push_back(size_t(std::accumulate(shape.begin(), shape.end(), int64_t(1),
                                                [](int64_t a, int64_t b) { return a * b; })));
      shapes[g].push_back(shape.size() == 2 ? shape : std::vector<int64_t>{});
    }
  Model m = Model::make(sizes, 5);
  for (size_t g = 0; g < kGroups; ++g)
    for (size_t k = 0; k < kTensorsPerGroup; ++k) m.groups[g][k].shape = shapes[g][k];
  return m;
}

int64_t elements(const Model& m, size_t group) {
  int64_t n = 0;
  for (const auto& t : m.groups[group]) n += int64_t(t.p.size());
  return n;
}

TEST(KernelReuse, AdamWModelOfThreeGroupsCompilesOneKernel) {
  Engine engine(testing::memory_only());  // counts compilations
  Model model = mixed_model();
  const double lr[kGroups] = {1e-3, 3e-3, 1e-2}, wd[kGroups] = {0.0, 0.01, 0.1};
  auto opt = Optimizer::create(engine, {{"type", "adamw"}, {"betas", {0.9, 0.99}}});
  std::vector<std::vector<testing::ReferenceOptimizer>> refs(kGroups);
  for (size_t g = 0; g < kGroups; ++g) {
    opt->add_param_group(model.refs(g), {{"lr", lr[g]}, {"weight_decay", wd[g]}});
    testing::AdamConfig c;
    c.decoupled_weight_decay = true;
    c.beta2 = 0.99;
    c.lr = lr[g];
    c.weight_decay = wd[g];
    for (const auto& t : model.groups[g]) refs[g].emplace_back(c, t.p);
  }
  // Sizes and shapes really are mixed.
  std::set<size_t> distinct;
  int two_d = 0;
  for (const auto& group : model.groups)
    for (const auto& t : group) {
      distinct.insert(t.p.size());
      two_d += t.shape.size() == 2;
    }
  ASSERT_GE(distinct.size(), 100u);
  ASSERT_GE(two_d, 40);
  ASSERT_TRUE(distinct.count(1) && distinct.count(5000));

  // Several steps, every group's lr changed before each: still one kernel, and each group gets
  // its own lr and weight decay (checked against the reference).
  for (int step = 1; step <= 4; ++step) {
    model.fill_grads(step);
    for (size_t g = 0; g < kGroups; ++g) {
      double lr_now = lr[g] * (1.0 + 0.25 * step);
      opt->set(g, "lr", lr_now);
      for (auto& r : refs[g]) r.set_lr(lr_now);
    }
    opt->step();
    EXPECT_EQ(engine.counters().compiles, 1) << "step " << step;
    for (size_t g = 0; g < kGroups; ++g)
      for (size_t k = 0; k < kTensorsPerGroup; ++k) {
        refs[g][k].step(model.groups[g][k].g);
        ASSERT_TRUE(testing::within_bound("group " + std::to_string(g) + " tensor " +
                                              std::to_string(k) + " step " + std::to_string(step),
                                          model.groups[g][k].p.data(), refs[g][k].param(),
                                          refs[g][k].param_bound(),
                                          testing::kEvaluationOrderSlack));
      }
  }
  // Any hyperparameter VALUE may change without a compile.
  opt->set(0, "weight_decay", 0.5);
  opt->set(1, "betas", {0.5, 0.9});
  opt->set(2, "eps", 1e-3);
  opt->set(2, "maximize", true);
  model.fill_grads(5);
  opt->step();
  EXPECT_EQ(engine.counters().compiles, 1);

  std::vector<Optimizer::KernelUse> uses = opt->kernel_uses();
  ASSERT_EQ(uses.size(), 1u);
  EXPECT_EQ(uses[0].groups, 3);
  EXPECT_EQ(uses[0].tensors, 150);
  EXPECT_EQ(uses[0].elements, elements(model, 0) + elements(model, 1) + elements(model, 2));
  EXPECT_FALSE(uses[0].key.empty());
  // Reads p, g, exp_avg, exp_avg_sq and writes p, exp_avg, exp_avg_sq: 7 floats per element.
  EXPECT_EQ(opt->bytes_per_step(), 7 * 4 * uses[0].elements);

  // AMSGrad on one group is a new structure: exactly one more kernel, serving that group only.
  opt->set(1, "amsgrad", true);
  model.fill_grads(6);
  opt->step();
  model.fill_grads(7);
  opt->step();
  EXPECT_EQ(engine.counters().compiles, 2);
  uses = opt->kernel_uses();
  ASSERT_EQ(uses.size(), 2u);
  std::sort(uses.begin(), uses.end(),
            [](const Optimizer::KernelUse& a, const Optimizer::KernelUse& b) {
              return a.groups > b.groups;
            });
  EXPECT_EQ(uses[0].groups, 2);
  EXPECT_EQ(uses[0].tensors, 100);
  EXPECT_EQ(uses[0].elements, elements(model, 0) + elements(model, 2));
  EXPECT_EQ(uses[1].groups, 1);
  EXPECT_EQ(uses[1].tensors, 50);
  EXPECT_EQ(uses[1].elements, elements(model, 1));
  EXPECT_NE(uses[0].key, uses[1].key);
  EXPECT_NE(opt->state(1, 0, "max_exp_avg_sq"), nullptr);
  EXPECT_EQ(opt->state(0, 0, "max_exp_avg_sq"), nullptr);
  EXPECT_EQ(opt->bytes_per_step(), 28 * uses[0].elements + 36 * uses[1].elements);

  // Switching it back reuses the first kernel.
  opt->set(1, "amsgrad", false);
  model.fill_grads(8);
  opt->step();
  EXPECT_EQ(engine.counters().compiles, 2);
  EXPECT_EQ(opt->kernel_uses().size(), 1u);
}

TEST(KernelReuse, SgdWithAndWithoutMomentumAreTwoKernels) {
  Engine engine(testing::memory_only());  // counts compilations
  Model model = Model::make({{10, 3000}, {7, 1}}, 9);
  auto opt = Optimizer::create(engine, {{"type", "sgd"}, {"lr", 0.1}});
  opt->add_param_group(model.refs(0), {{"momentum", 0.9}});
  opt->add_param_group(model.refs(1));  // momentum 0 (torch's default)
  model.fill_grads(1);
  opt->step();
  EXPECT_EQ(engine.counters().compiles, 2);
  std::vector<Optimizer::KernelUse> uses = opt->kernel_uses();
  ASSERT_EQ(uses.size(), 2u);
  EXPECT_NE(uses[0].key, uses[1].key);
  EXPECT_EQ(uses[0].groups + uses[1].groups, 2);

  // Another nonzero momentum, dampening or lr is a value, not a structure.
  opt->set(0, "momentum", 0.5);
  opt->set(0, "dampening", 0.2);
  opt->set(1, "lr", 0.01);
  model.fill_grads(2);
  opt->step();
  EXPECT_EQ(engine.counters().compiles, 2);

  // Momentum on the second group makes it the first group's structure: no compile, one kernel.
  opt->set(1, "momentum", 0.8);
  model.fill_grads(3);
  opt->step();
  EXPECT_EQ(engine.counters().compiles, 2);
  uses = opt->kernel_uses();
  ASSERT_EQ(uses.size(), 1u);
  EXPECT_EQ(uses[0].groups, 2);
  EXPECT_EQ(uses[0].tensors, 4);

  // Nesterov is a structure.
  opt->set(0, "dampening", 0.0);
  opt->set(0, "nesterov", true);
  model.fill_grads(4);
  opt->step();
  EXPECT_EQ(engine.counters().compiles, 3);
  EXPECT_EQ(opt->kernel_uses().size(), 2u);
}

TEST(KernelReuse, AdamAndAdamWAreDifferentKernelsSharedAcrossOptimizers) {
  Engine engine(testing::memory_only());  // counts compilations
  Model a = Model::make({{100}}, 1), b = Model::make({{100}}, 2), c = Model::make({{33, 7}}, 3);
  auto adam = Optimizer::create(engine, {{"type", "adam"}, {"weight_decay", 0.01}});
  auto adamw = Optimizer::create(engine, {{"type", "adamw"}, {"weight_decay", 0.01}});
  adam->add_param_group(a.refs(0));
  adamw->add_param_group(b.refs(0));
  a.fill_grads(1);
  b.fill_grads(1);
  adam->step();
  adamw->step();
  EXPECT_EQ(engine.counters().compiles, 2);
  ASSERT_EQ(adam->kernel_uses().size(), 1u);
  ASSERT_EQ(adamw->kernel_uses().size(), 1u);
  EXPECT_NE(adam->kernel_uses()[0].key, adamw->kernel_uses()[0].key);

  // A second AdamW optimizer on the same engine, other sizes and lr: the same kernel, no compile.
  auto again = Optimizer::create(engine, {{"type", "adamw"}, {"lr", 0.5}});
  again->add_param_group(c.refs(0));
  c.fill_grads(1);
  int64_t hits = engine.counters().hits;
  again->step();
  EXPECT_EQ(engine.counters().compiles, 2);
  EXPECT_GT(engine.counters().hits, hits);
  EXPECT_EQ(again->kernel_uses()[0].key, adamw->kernel_uses()[0].key);
}

}  // namespace
}  // namespace optfuse
