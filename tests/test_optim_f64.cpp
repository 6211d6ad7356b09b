// float64 params (torch's float64 params): every optimizer's update computed in f64 throughout
// (precision.h), against the independent double reference (support/reference_optim.h) run on the
// same values, 20 steps with an lr changed every step.
//
// Tolerance: 1e-12 relative to the largest |value| of the tensor, per element and per step. The
// reference and optfuse evaluate the same formulas in double with different op orders (host
// 1/sqrt(bias_correction2) against a divide, FMA contraction) and host scalars computed in
// different orders: each differs by a few units of 2^-53 ~ 1.1e-16 per op, ~30 ops a step over
// 20 steps, compounded through state that decays (betas < 1): a few 1e-14 at most. 1e-12 leaves
// room for that, and is still 1e5 times tighter than any float32 evaluation could pass (~1e-7):
// an update computed in f32 anywhere (a scalar rounded to float, a state buffer kept in f32)
// fails it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "optfuse/optim.h"
#include "support/engine.h"
#include "support/gen.h"
#include "support/optim_util.h"
#include "support/reference_optim.h"

namespace optfuse {
namespace {

using testing::ReferenceOptimizer;

constexpr int kSteps = 20;
constexpr double kRel = 1e-12;

Engine& engine() { return testing::shared_engine(); }

struct F64Case {
  std::string name;
  Options config;
  ReferenceOptimizer (*reference)(const std::vector<float>& p0);
};

void PrintTo(const F64Case& c, std::ostream* os) { *os << c.name; }

std::vector<F64Case> cases() {
  using namespace testing;
  return {
      {"sgd_nesterov",
       {{"type", "sgd"},
        {"lr", 0.05},
        {"momentum", 0.9},
        {"nesterov", true},
        {"weight_decay", 1e-2}},
       [](const std::vector<float>& p) {
         return ReferenceOptimizer(SgdConfig{0.05, 0.9, 0, 1e-2, true, false}, p);
       }},
      {"adam_amsgrad",
       {{"type", "adam"},
        {"lr", 0.01},
        {"betas", {0.8, 0.99}},
        {"amsgrad", true},
        {"weight_decay", 0.01}},
       [](const std::vector<float>& p) {
         AdamConfig c;
         c.lr = 0.01, c.beta1 = 0.8, c.beta2 = 0.99, c.amsgrad = true, c.weight_decay = 0.01;
         return ReferenceOptimizer(c, p);
       }},
      {"adamw",
       {{"type", "adamw"}, {"lr", 0.01}, {"betas", {0.8, 0.99}}, {"weight_decay", 0.1}},
       [](const std::vector<float>& p) {
         AdamConfig c;
         c.decoupled_weight_decay = true, c.lr = 0.01, c.beta1 = 0.8, c.beta2 = 0.99;
         c.weight_decay = 0.1;
         return ReferenceOptimizer(c, p);
       }},
      {"adagrad",
       {{"type", "adagrad"}, {"lr", 0.05}, {"lr_decay", 0.1}, {"initial_accumulator_value", 0.125}},
       [](const std::vector<float>& p) {
         return ReferenceOptimizer(AdagradConfig{0.05, 0.1, 0, 0.125, 1e-10, false}, p);
       }},
      {"rmsprop_centered",
       {{"type", "rmsprop"}, {"lr", 0.01}, {"alpha", 0.9}, {"centered", true}, {"momentum", 0.9}},
       [](const std::vector<float>& p) {
         return ReferenceOptimizer(RmspropConfig{0.01, 0.9, 1e-8, 0, 0.9, true, false}, p);
       }},
      {"adamax",
       {{"type", "adamax"}, {"lr", 0.01}, {"betas", {0.8, 0.99}}},
       [](const std::vector<float>& p) {
         return ReferenceOptimizer(AdamaxConfig{0.01, 0.8, 0.99, 1e-8, 0, false}, p);
       }},
      {"nadam",
       {{"type", "nadam"}, {"lr", 0.01}, {"betas", {0.8, 0.9}}, {"momentum_decay", 0.01}},
       [](const std::vector<float>& p) {
         return ReferenceOptimizer(NadamRadamConfig{true, 0.01, 0.8, 0.9, 1e-8, 0, 0.01}, p);
       }},
      {"radam",
       {{"type", "radam"}, {"lr", 0.01}, {"betas", {0.8, 0.9}}},
       [](const std::vector<float>& p) {
         return ReferenceOptimizer(NadamRadamConfig{false, 0.01, 0.8, 0.9, 1e-8, 0, 0.01}, p);
       }},
  };
}

// f64 buffers owned by the test: params from float32 values (exact in f64, so the reference
// starts from the same numbers), grads likewise at every step.
struct F64Tensors {
  std::vector<std::vector<float>> p32;
  std::vector<std::vector<double>> p, g;

  explicit F64Tensors(const std::vector<size_t>& sizes) {
    for (size_t k = 0; k < sizes.size(); ++k) {
      p32.push_back(testing::gen_floats(static_cast<uint32_t>(11 + k), sizes[k]));
      p.emplace_back(p32.back().begin(), p32.back().end());
      g.emplace_back(sizes[k]);
    }
  }
  std::vector<float> grad32(size_t k, int step) const {
    return testing::gen_floats(static_cast<uint32_t>(1000 * step + k), p[k].size(), 0.5);
  }
  std::vector<ParamRef> refs() {
    std::vector<ParamRef> out;
    for (size_t k = 0; k < p.size(); ++k)
      out.push_back({{p[k].data(), int64_t(p[k].size()), {}, DType::F64},
                     {g[k].data(), int64_t(g[k].size()), {}, DType::F64},
                     "t" + std::to_string(k)});
    return out;
  }
};

double scale_of(const std::vector<double>& v) {
  double m = 1e-30;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

::testing::AssertionResult close(const std::string& what, const double* got,
                                 const std::vector<double>& want) {
  const double tol = kRel * scale_of(want);
  for (size_t i = 0; i < want.size(); ++i)
    if (!(std::fabs(got[i] - want[i]) <= tol))
      return ::testing::AssertionFailure()
             << what << "[" << i << "] = " << got[i] << ", the reference " << want[i] << " (|diff| "
             << std::fabs(got[i] - want[i]) << " > " << tol << ")";
  return ::testing::AssertionSuccess();
}

class F64 : public ::testing::TestWithParam<F64Case> {};

TEST_P(F64, MatchesTheDoubleReference) {
  const F64Case& c = GetParam();
  // 1 and 7: single tasks; 1000: vectors and a tail; 40000: a parallel call.
  F64Tensors t({1, 7, 1000, 40000});
  auto opt = Optimizer::create(engine(), c.config);
  opt->add_param_group(t.refs());
  std::vector<ReferenceOptimizer> refs;
  for (const auto& p0 : t.p32) refs.push_back(c.reference(p0));
  const double lr0 = c.config.at("lr").get<double>();
  for (int step = 1; step <= kSteps; ++step) {
    const double lr = lr0 * (1.0 + 0.05 * step);
    opt->set(0, "lr", lr);
    for (size_t k = 0; k < t.p.size(); ++k) {
      std::vector<float> g = t.grad32(k, step);
      std::copy(g.begin(), g.end(), t.g[k].begin());
      refs[k].set_lr(lr);
      refs[k].step(g);
    }
    opt->step();
    for (size_t k = 0; k < t.p.size(); ++k) {
      const std::string who =
          c.name + " step " + std::to_string(step) + " tensor " + std::to_string(k);
      ASSERT_TRUE(close(who + " param", t.p[k].data(), refs[k].param()));
      for (const std::string& name : refs[k].state_names()) {
        TensorRef s = opt->state_ref(0, k, name);
        ASSERT_NE(s.data, nullptr) << who << ": state " << name;
        ASSERT_EQ(s.dtype, DType::F64) << who << ": state " << name;
        ASSERT_TRUE(
            close(who + " " + name, static_cast<const double*>(s.data), *refs[k].state(name)));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllRules, F64, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

TEST(F64State, SavedAndLoadedItContinuesBitForBit) {
  F64Tensors a({1000, 3}), b = a;
  const Options config = {{"type", "adamw"}, {"lr", 0.01}, {"weight_decay", 0.1}};
  auto oa = Optimizer::create(engine(), config);
  oa->add_param_group(a.refs());
  for (int step = 1; step <= 3; ++step) {
    for (size_t k = 0; k < a.p.size(); ++k) {
      std::vector<float> g = a.grad32(k, step);
      std::copy(g.begin(), g.end(), a.g[k].begin());
    }
    oa->step();
  }
  const std::string path = ::testing::TempDir() + "f64_state";
  oa->save_state(path);
  b.p = a.p;
  auto ob = Optimizer::create(engine(), config);
  ob->add_param_group(b.refs());
  ob->load_state(path);
  for (int step = 4; step <= 6; ++step) {
    for (size_t k = 0; k < a.p.size(); ++k) {
      std::vector<float> g = a.grad32(k, step);
      std::copy(g.begin(), g.end(), a.g[k].begin());
      std::copy(g.begin(), g.end(), b.g[k].begin());
    }
    oa->step();
    ob->step();
  }
  EXPECT_EQ(a.p, b.p) << "same kernel, same state: the same bits";
  for (const char* name : {"exp_avg", "exp_avg_sq"}) {
    TensorRef sa = oa->state_ref(0, 0, name), sb = ob->state_ref(0, 0, name);
    ASSERT_EQ(sb.dtype, DType::F64);
    EXPECT_TRUE(std::equal(static_cast<const double*>(sa.data),
                           static_cast<const double*>(sa.data) + sa.numel,
                           static_cast<const double*>(sb.data)))
        << name;
  }
}

TEST(F64State, AccumulationSumsInF64) {
  // Two micro-steps of grads g1, g2 equal one step of g1 + g2 (exact in f64 for these float32
  // values). The twins' kernels differ (an add before the update instead of a load), so LLVM
  // may contract other products into FMAs differently (test_optim_step_twins.cpp): they agree
  // within kRel, which a grad_accum kept in f32 (~1e-8 relative) would not.
  F64Tensors acc({1000}), plain = acc;
  auto oa = Optimizer::create(
      engine(),
      {{"type", "adam"}, {"lr", 0.01}, {"accumulation_steps", 2}, {"accumulation", "sum"}});
  auto op = Optimizer::create(engine(), {{"type", "adam"}, {"lr", 0.01}});
  oa->add_param_group(acc.refs());
  op->add_param_group(plain.refs());
  for (int step = 1; step <= 3; ++step) {
    std::vector<float> g1 = acc.grad32(0, 2 * step), g2 = acc.grad32(0, 2 * step + 1);
    std::copy(g1.begin(), g1.end(), acc.g[0].begin());
    EXPECT_FALSE(oa->step().applied());
    std::copy(g2.begin(), g2.end(), acc.g[0].begin());
    EXPECT_TRUE(oa->step().applied());
    for (size_t i = 0; i < g1.size(); ++i) plain.g[0][i] = double(g1[i]) + double(g2[i]);
    op->step();
  }
  EXPECT_TRUE(close("param", acc.p[0].data(), plain.p[0]));
}

// The message of the Error that adding the group or its first step throws ("" if none).
std::string refusal(const Options& config, DType grad) {
  std::vector<double> p(8, 1.0), g64(8);
  std::vector<float> g32(8);
  void* g = grad == DType::F64 ? static_cast<void*>(g64.data()) : g32.data();
  try {
    auto opt = Optimizer::create(engine(), config);
    opt->add_param_group({{{p.data(), 8, {}, DType::F64}, {g, 8, {}, grad}, "w"}});
    opt->step();
  } catch (const Error& e) {
    EXPECT_EQ(p, std::vector<double>(8, 1.0)) << "a refused step changes nothing";
    return e.what();
  }
  return "";
}

TEST(F64State, OtherDtypesAndStateDtypesAreRefused) {
  EXPECT_NE(refusal({{"type", "adamw"}}, DType::F32).find("f64 params take f64 grads"),
            std::string::npos);
  for (const char* sd : {"bf16", "int8"})
    EXPECT_NE(refusal({{"type", "adamw"}, {"state_dtype", sd}}, DType::F64).find("with f64 params"),
              std::string::npos)
        << sd;
  EXPECT_EQ(refusal({{"type", "adamw"}}, DType::F64), "");
}

}  // namespace
}  // namespace optfuse
