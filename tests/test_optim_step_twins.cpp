// Step-level features on EVERY optimizer, by twins: an optimizer with a feature must end exactly
// where a plain optimizer (no step options) ends when the plain one is fed the gradients the
// feature implies. Where that gradient is computed exactly (powers of two), the comparison is
// bit-for-bit; this shows the scale is applied inside each rule's own fused kernel with one
// rounding at most, for every rule, and that the micro-steps leave params and state untouched.
//   loss scaling, static S = 1024 and dynamic (S = 65536): grads * S -> g_eff = (g * S) * (1/S) ==
//   g:
//     bit-identical.
//   accumulation "sum", k = 2: g_eff = float(g1 + g2), the plain twin is fed float(g1 + g2)
//   accumulation "mean", k = 2: g_eff = float(g1 + g2) * 0.5, exact, == float((g1 + g2) / 2)
//     g_eff is the same value, but the kernel's code differs (an add instead of a load), and LLVM
//     then may fuse the other product of a sum of two products into an FMA (Halide allows
//     contraction): e.g. exp_avg_sq = beta2 * v + (1 - beta2) * g * g differs by an ulp in some
//     elements (observed). So accumulation twins are compared within 1e-5 relative + 1e-7
//     absolute (a few ulp of values ~1 per step, carried over 4 updates, cancellation included);
//     micro-steps are still bit-exact.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "optfuse/optim.h"
#include "support/engine.h"
#include "support/optim_util.h"

namespace optfuse {
namespace {

using testing::Model;

Engine& engine() { return testing::shared_engine(); }

struct RuleCase {
  std::string name;
  Options config;
};

void PrintTo(const RuleCase& c, std::ostream* os) { *os << c.name; }

std::vector<RuleCase> rule_cases() {
  return {
      {"sgd_nesterov",
       {{"type", "sgd"},
        {"lr", 0.05},
        {"momentum", 0.9},
        {"nesterov", true},
        {"weight_decay", 1e-3}}},
      {"adam_amsgrad", {{"type", "adam"}, {"lr", 0.01}, {"amsgrad", true}, {"weight_decay", 0.01}}},
      {"adamw", {{"type", "adamw"}, {"lr", 0.01}, {"weight_decay", 0.1}}},
      {"adagrad", {{"type", "adagrad"}, {"lr", 0.05}, {"lr_decay", 0.01}}},
      {"rmsprop_centered",
       {{"type", "rmsprop"}, {"lr", 0.01}, {"centered", true}, {"momentum", 0.9}}},
      {"adamax", {{"type", "adamax"}, {"lr", 0.01}}},
      {"nadam", {{"type", "nadam"}, {"lr", 0.01}, {"weight_decay", 0.01}}},
      {"radam", {{"type", "radam"}, {"lr", 0.01}, {"betas", {0.8, 0.9}}}},
      {"lion", {{"type", "lion"}, {"lr", 1e-3}, {"weight_decay", 0.1}}},
      {"adadelta", {{"type", "adadelta"}, {"weight_decay", 0.01}}},
      {"asgd", {{"type", "asgd"}, {"lr", 0.01}, {"t0", 2.0}, {"weight_decay", 0.01}}},
      {"rprop", {{"type", "rprop"}, {"lr", 0.01}, {"maximize", true}}},
  };
}

// Two groups; 40000 elements is more than one task (its kernel runs parallel inside), the
// others are single tasks.
const std::vector<std::vector<size_t>> kSizes = {{5, 40000, 1}, {17, 3}};
constexpr int kUpdates = 4;

std::unique_ptr<Optimizer> make(const Options& config, Model& m) {
  auto opt = Optimizer::create(engine(), config);
  for (size_t g = 0; g < m.groups.size(); ++g) opt->add_param_group(m.refs(g));
  return opt;
}

bool close(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k)
    if (!(std::fabs(double(a[k]) - double(b[k])) <= 1e-5 * std::fabs(double(b[k])) + 1e-7))
      return false;
  return true;
}

// Params, step counts and every state buffer of a and b, bit for bit (or close: see the top).
void expect_same(const Optimizer& a, const Model& ma, const Optimizer& b, const Model& mb,
                 const std::string& when, bool exact = true) {
  auto same = [&](const std::vector<float>& x, const std::vector<float>& y) {
    return exact ? testing::same_bits(x, y) : close(x, y);
  };
  for (size_t g = 0; g < ma.groups.size(); ++g)
    for (size_t i = 0; i < ma.groups[g].size(); ++i) {
      std::string who = when + ", group " + std::to_string(g) + " tensor " + std::to_string(i);
      EXPECT_TRUE(same(ma.groups[g][i].p, mb.groups[g][i].p)) << who << ": param";
      EXPECT_EQ(a.step_count(g, i), b.step_count(g, i)) << who;
      for (const auto& name : testing::all_state_names()) {
        const std::vector<float>* sa = a.state(g, i, name);
        const std::vector<float>* sb = b.state(g, i, name);
        ASSERT_EQ(sa == nullptr, sb == nullptr) << who << ": state " << name;
        if (sa) EXPECT_TRUE(same(*sa, *sb)) << who << ": state " << name;
      }
    }
}

void scale_grads(Model& m, float s) {
  for (auto& group : m.groups)
    for (auto& t : group)
      for (float& x : t.g) x *= s;
}

class StepTwins : public ::testing::TestWithParam<RuleCase> {};

void check_loss_scale(const RuleCase& c, const Options& scale_options, float S) {
  Model plain_m = Model::make(kSizes, 3), scaled_m = plain_m;
  auto plain = make(c.config, plain_m);
  Options config = c.config;
  config.update(scale_options);
  auto scaled = make(config, scaled_m);
  for (int step = 1; step <= kUpdates; ++step) {
    plain_m.fill_grads(step);
    scaled_m.fill_grads(step);
    ASSERT_EQ(scaled->loss_scale(), S);
    scale_grads(scaled_m, S);
    plain->step();
    StepResult r = scaled->step();
    ASSERT_TRUE(r.applied());
    EXPECT_EQ(r.loss_scale, S);
    expect_same(*plain, plain_m, *scaled, scaled_m, "step " + std::to_string(step));
  }
}

TEST_P(StepTwins, StaticLossScaleIsExactForPowersOfTwo) {
  check_loss_scale(GetParam(), {{"loss_scale", 1024.0}}, 1024.f);
}

TEST_P(StepTwins, DynamicLossScaleIsExactForPowersOfTwo) {
  check_loss_scale(GetParam(), {{"loss_scale", "dynamic"}}, 65536.f);
}

void check_accumulation(const RuleCase& c, bool mean) {
  Model plain_m = Model::make(kSizes, 5), acc_m = plain_m;
  auto plain = make(c.config, plain_m);
  Options config = c.config;
  config["accumulation_steps"] = 2;
  config["accumulation"] = mean ? "mean" : "sum";
  auto acc = make(config, acc_m);
  for (int step = 1; step <= kUpdates; ++step) {
    // micro-step 1: nothing but the accumulation buffer changes
    acc_m.fill_grads(2 * step - 1);
    Model before = acc_m;
    std::vector<std::vector<float>> state_before;
    for (size_t g = 0; g < acc_m.groups.size(); ++g)
      for (size_t i = 0; i < acc_m.groups[g].size(); ++i)
        for (const auto& name : testing::all_state_names())
          if (const std::vector<float>* s = acc->state(g, i, name)) state_before.push_back(*s);
    StepResult r1 = acc->step();
    EXPECT_EQ(r1.outcome, StepResult::Outcome::Accumulated);
    EXPECT_EQ(r1.micro_step, 1);
    size_t k = 0;
    for (size_t g = 0; g < acc_m.groups.size(); ++g)
      for (size_t i = 0; i < acc_m.groups[g].size(); ++i) {
        EXPECT_TRUE(testing::same_bits(before.groups[g][i].p, acc_m.groups[g][i].p));
        for (const auto& name : testing::all_state_names())
          if (const std::vector<float>* s = acc->state(g, i, name))
            EXPECT_TRUE(testing::same_bits(*s, state_before.at(k++))) << name;
      }
    Model first = acc_m;
    acc_m.fill_grads(2 * step);
    StepResult r2 = acc->step();
    EXPECT_TRUE(r2.applied());
    EXPECT_EQ(r2.micro_step, 2);
    // the plain twin gets float(g1 + g2) (times 0.5: exact)
    for (size_t g = 0; g < plain_m.groups.size(); ++g)
      for (size_t i = 0; i < plain_m.groups[g].size(); ++i) {
        auto& out = plain_m.groups[g][i].g;
        for (size_t k = 0; k < out.size(); ++k) {
          float sum = first.groups[g][i].g[k] + acc_m.groups[g][i].g[k];
          out[k] = mean ? sum * 0.5f : sum;
        }
      }
    plain->step();
    expect_same(*plain, plain_m, *acc, acc_m, "update " + std::to_string(step), false);
  }
}

TEST_P(StepTwins, AccumulationSum) { check_accumulation(GetParam(), false); }
TEST_P(StepTwins, AccumulationMean) { check_accumulation(GetParam(), true); }

INSTANTIATE_TEST_SUITE_P(AllRules, StepTwins, ::testing::ValuesIn(rule_cases()),
                         [](const auto& info) { return info.param.name; });

// A group without step options compiles the rule's graph unchanged: same kernel key as before.
TEST(StepGraph, NoStepOptionsLeaveTheKernelKeyAlone) {
  Options adamw = {{"type", "adamw"}};
  std::string plain = engine().kernel_key(update_graph(adamw));
  Options clipped = adamw;
  clipped["max_grad_norm"] = 1.0;
  EXPECT_NE(engine().kernel_key(update_graph(clipped)), plain);
  Options scaled = adamw;
  scaled["loss_scale"] = "dynamic";
  // clipping and loss scaling both only need grad_scale: one kernel for both
  EXPECT_EQ(engine().kernel_key(update_graph(scaled)), engine().kernel_key(update_graph(clipped)));
  Options sum = adamw;
  sum["accumulation_steps"] = 4;
  sum["accumulation"] = "sum";
  Options mean = sum;
  mean["accumulation"] = "mean";
  EXPECT_NE(engine().kernel_key(update_graph(sum)), engine().kernel_key(update_graph(mean)));
  Options one = adamw;
  one["accumulation_steps"] = 1;
  EXPECT_EQ(engine().kernel_key(update_graph(one)), plain);
}

}  // namespace
}  // namespace optfuse
