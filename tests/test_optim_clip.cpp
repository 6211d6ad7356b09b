// Global-norm gradient clipping (torch.nn.utils.clip_grad_norm_ over all params of all groups)
// against an independent double-precision reference written from torch's documented formula:
//   total_norm = ||(||g_1||, ..., ||g_n||)||  (2-norm: sqrt of the sum of squares; inf: max |g|)
//   clip_coef  = min(1, max_norm / (total_norm + 1e-6)),  g <- g * clip_coef
// Tolerances:
//   * total_norm and clip_coef: relative 1e-10. optfuse sums float32 squares in double in its own
//     order (chunks x lanes); any order's error is <= n * 2^-53 relative (n <= 1e5 here: 1.1e-11).
//     The inf-norm is exact.
//   * params, SGD without momentum (p' = p - lr * g * clip_coef): |got - ref| <= u * (|p'| +
//     3 * lr * |g * clip_coef|), u = 2^-24: the kernel rounds grad_scale = float(clip_coef) once,
//     g * grad_scale once, lr * that once, and the subtraction once (an FMA only removes one).
//   * every other optimizer, by twins: AdamW with clipping vs a plain AdamW fed float(g * coef)
//     (computed in double): the only difference is g_eff's rounding, <= 2u relative on each grad,
//     which moves params and state by less than 1e-5 relative + 1e-7 absolute over 5 steps (the
//     absolute part: a few ulp of the values ~1 a param passes through before it cancels to ~0).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "optfuse/optim.h"
#include "support/engine.h"
#include "support/gen.h"
#include "support/optim_util.h"

namespace optfuse {
namespace {

using ::testing::HasSubstr;
using testing::Model;

Engine& engine() { return testing::shared_engine(); }
constexpr double u = 0x1p-24;

// 70000 elements spans two statistics chunks (64K) and several kernel tasks.
const std::vector<std::vector<size_t>> kSizes = {{5, 70000, 1}, {17, 300}};

std::unique_ptr<Optimizer> make(const Options& config, Model& m) {
  auto opt = Optimizer::create(engine(), config);
  for (size_t g = 0; g < m.groups.size(); ++g) opt->add_param_group(m.refs(g));
  return opt;
}

struct Norms {
  double total, coef;
};

Norms reference_norms(const Model& m, double max_norm, bool inf) {
  double sumsq = 0, maxabs = 0;
  for (const auto& group : m.groups)
    for (const auto& t : group)
      for (float x : t.g) {
        sumsq += double(x) * double(x);
        maxabs = std::max(maxabs, std::fabs(double(x)));
      }
  double total = inf ? maxabs : std::sqrt(sumsq);
  return {total, std::min(1.0, max_norm / (total + 1e-6))};
}

void check_sgd_clipping(bool inf, double max_norm, bool expect_clipped) {
  const double lr = 0.5;
  Model m = Model::make(kSizes, 11);
  Options config = {{"type", "sgd"}, {"lr", lr}, {"max_grad_norm", max_norm}};
  if (inf) config["norm_type"] = "inf";
  auto opt = make(config, m);
  for (int step = 1; step <= 3; ++step) {
    m.fill_grads(step);
    Norms ref = reference_norms(m, max_norm, inf);
    Model before = m;
    StepResult r = opt->step();
    ASSERT_TRUE(r.applied());
    ASSERT_TRUE(r.has_total_norm);
    EXPECT_NEAR(r.total_norm, ref.total, 1e-10 * ref.total);
    EXPECT_NEAR(r.clip_coef, ref.coef, 1e-10 * ref.coef);
    EXPECT_EQ(expect_clipped, r.clip_coef < 1.0) << r.clip_coef;
    for (size_t g = 0; g < m.groups.size(); ++g)
      for (size_t i = 0; i < m.groups[g].size(); ++i) {
        const auto& p0 = before.groups[g][i].p;
        const auto& gr = before.groups[g][i].g;
        std::vector<double> want(p0.size()), bound(p0.size());
        for (size_t k = 0; k < p0.size(); ++k) {
          double upd = lr * double(gr[k]) * ref.coef;
          want[k] = double(p0[k]) - upd;
          bound[k] = u * (std::fabs(want[k]) + 3 * std::fabs(upd)) + 1e-30;
        }
        EXPECT_TRUE(testing::within_bound("step " + std::to_string(step) + " group " +
                                              std::to_string(g) + " tensor " + std::to_string(i),
                                          m.groups[g][i].p.data(), want, bound, 1.0));
      }
  }
}

// Grads are in [-0.5, 0.5): the 2-norm over ~70K elements is ~38, the inf-norm ~0.5.
TEST(Clip, TwoNormClipsLikeTorch) { check_sgd_clipping(false, 1.0, true); }
TEST(Clip, InfNormClipsLikeTorch) { check_sgd_clipping(true, 0.25, true); }
TEST(Clip, NoClippingBelowMaxNorm) { check_sgd_clipping(false, 1e6, false); }

// Below max_norm, clip_coef is exactly 1 and g * 1 == g: the clipped run IS the plain run.
TEST(Clip, UnclippedStepIsThePlainStep) {
  Model a = Model::make(kSizes, 12), b = a;
  Options config = {{"type", "adamw"}, {"lr", 0.01}};
  auto plain = make(config, a);
  config["max_grad_norm"] = 1e6;
  auto clipped = make(config, b);
  for (int step = 1; step <= 3; ++step) {
    a.fill_grads(step);
    b.fill_grads(step);
    plain->step();
    EXPECT_EQ(clipped->step().clip_coef, 1.0);
  }
  for (size_t g = 0; g < a.groups.size(); ++g)
    for (size_t i = 0; i < a.groups[g].size(); ++i)
      EXPECT_TRUE(testing::same_bits(a.groups[g][i].p, b.groups[g][i].p));
}

::testing::AssertionResult close(const std::vector<float>& got, const std::vector<float>& want,
                                 const std::string& what) {
  for (size_t k = 0; k < got.size(); ++k) {
    double d = std::fabs(double(got[k]) - double(want[k]));
    if (!(d <= 1e-5 * std::fabs(double(want[k])) + 1e-7))
      return ::testing::AssertionFailure()
             << what << "[" << k << "]: " << got[k] << " vs " << want[k];
  }
  return ::testing::AssertionSuccess();
}

TEST(Clip, AdamWTwinFedClippedGrads) {
  Model a = Model::make(kSizes, 13), b = a;
  Options config = {{"type", "adamw"}, {"lr", 0.01}, {"amsgrad", true}};
  auto plain = make(config, a);
  config["max_grad_norm"] = 2.0;
  auto clipped = make(config, b);
  for (int step = 1; step <= 5; ++step) {
    b.fill_grads(step);
    Norms ref = reference_norms(b, 2.0, false);
    ASSERT_LT(ref.coef, 1.0);
    a.fill_grads(step);
    for (size_t g = 0; g < a.groups.size(); ++g)
      for (size_t i = 0; i < a.groups[g].size(); ++i)
        for (float& x : a.groups[g][i].g) x = static_cast<float>(double(x) * ref.coef);
    plain->step();
    clipped->step();
  }
  for (size_t g = 0; g < a.groups.size(); ++g)
    for (size_t i = 0; i < a.groups[g].size(); ++i) {
      EXPECT_TRUE(close(b.groups[g][i].p, a.groups[g][i].p, "param"));
      for (const char* s : {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"})
        EXPECT_TRUE(close(*clipped->state(g, i, s), *plain->state(g, i, s), s));
    }
}

// Clipping + loss scaling cost one read-only statistics kernel (results, no outputs) and the
// update kernel with grad_scale inside: no scaling pass. Accumulation adds its two micro-step
// kernels, and the statistics then read grad_accum + grad.
TEST(Clip, KernelsPerStep) {
  auto names_of = [](const Engine& e) {
    std::vector<std::string> names;
    for (const auto& k : e.kernels()) names.push_back(k->name());
    std::sort(names.begin(), names.end());
    return names;
  };
  {
    Engine e;
    Model m = Model::make(kSizes, 17);
    auto opt =
        Optimizer::create(e, {{"type", "adamw"}, {"max_grad_norm", 1.0}, {"loss_scale", 8.0}});
    for (size_t g = 0; g < m.groups.size(); ++g) opt->add_param_group(m.refs(g));
    m.fill_grads(1);
    opt->step();
    EXPECT_THAT(names_of(e), ::testing::ElementsAre("adamw|gscale", "grad_stats"));
    for (const auto& k : e.kernels())
      if (k->name() == "grad_stats") {
        EXPECT_TRUE(k->signature().outputs.empty());
        ASSERT_EQ(k->signature().results.size(), 1u);
        EXPECT_EQ(k->signature().results[0].name, "sumsq");
      }
  }
  {
    Engine e;
    Model m = Model::make(kSizes, 18);
    auto opt = Optimizer::create(
        e,
        {{"type", "sgd"}, {"max_grad_norm", 1.0}, {"norm_type", "inf"}, {"accumulation_steps", 3}});
    for (size_t g = 0; g < m.groups.size(); ++g) opt->add_param_group(m.refs(g));
    for (int i = 1; i <= 3; ++i) {
      m.fill_grads(i);
      opt->step();
    }
    EXPECT_THAT(names_of(e), ::testing::ElementsAre("grad_accum_add", "grad_accum_init",
                                                    "grad_stats_acc_inf", "sgd|gacc|gscale"));
  }
}

// torch: with error_if_nonfinite=True a non-finite total norm raises before any grad changes.
TEST(Clip, ErrorIfNonfiniteThrowsAndChangesNothing) {
  Model m = Model::make(kSizes, 14);
  auto opt = make({{"type", "adam"}, {"max_grad_norm", 1.0}, {"error_if_nonfinite", true}}, m);
  m.fill_grads(1);
  opt->step();
  m.fill_grads(2);
  m.groups[1][0].g[3] = std::numeric_limits<float>::quiet_NaN();
  testing::Snapshot before = testing::snapshot(*opt, m.buffers());
  std::string msg = testing::error_of([&] { opt->step(); });
  EXPECT_THAT(msg, HasSubstr("The total norm of order 2.0 for gradients is non-finite"));
  EXPECT_THAT(msg, HasSubstr("error_if_nonfinite=false"));
  testing::Snapshot after = testing::snapshot(*opt, m.buffers());
  EXPECT_TRUE(before == after) << before.diff(after);
}

// torch without error_if_nonfinite (and without a GradScaler): the grads are multiplied by the
// nan coefficient, so every param becomes nan; the total norm returned is nan. Same here.
TEST(Clip, NonfiniteNormPropagatesLikeTorch) {
  Model m = Model::make(kSizes, 15);
  auto opt = make({{"type", "sgd"}, {"lr", 0.1}, {"max_grad_norm", 1.0}}, m);
  m.fill_grads(1);
  m.groups[1][1].g[0] = std::numeric_limits<float>::quiet_NaN();
  StepResult r = opt->step();
  EXPECT_TRUE(r.applied());
  EXPECT_TRUE(std::isnan(r.total_norm));
  EXPECT_TRUE(std::isnan(m.groups[0][0].p[0]));
}

TEST(Clip, InfGradientGivesInfNorm) {
  Model m = Model::make(kSizes, 16);
  auto opt = make({{"type", "sgd"}, {"max_grad_norm", 1.0}, {"norm_type", "inf"}}, m);
  m.fill_grads(1);
  m.groups[0][1].g[70000 - 1] = -std::numeric_limits<float>::infinity();
  StepResult r = opt->step();
  EXPECT_EQ(r.total_norm, std::numeric_limits<double>::infinity());
}

// Golden numbers from torch.nn.utils.clip_grad_norm_ (tests/golden/make_golden.py): torch computes
// the norm and clip_coef in float32, optfuse in double, so the total norm agrees to ~1e-6
// relative and each clipped grad to 4u relative (u = 2^-24: torch's float32 norm and coef vs the
// double ones, and one rounding each of g * coef). SGD with lr = 1 from p = 0 leaves p = -g_eff.
TEST(Clip, MatchesTorchClipGradNorm) {
  std::ifstream in(std::string(OPTFUSE_TEST_DATA_DIR) + "/golden/step_features.json");
  ASSERT_TRUE(in) << "missing tests/golden/step_features.json";
  nlohmann::json golden = nlohmann::json::parse(in);
  for (auto it = golden["clip"].begin(); it != golden["clip"].end(); ++it) {
    const nlohmann::json& c = it.value();
    std::vector<std::vector<float>> p, g;
    std::vector<ParamRef> refs;
    for (size_t t = 0; t < c["sizes"].size(); ++t) {
      size_t n = c["sizes"][t].get<size_t>();
      p.emplace_back(n, 0.f);
      g.push_back(testing::gen_floats(200 + uint32_t(t), n, 0.5));
    }
    for (size_t t = 0; t < p.size(); ++t)
      refs.push_back(
          {{p[t].data(), int64_t(p[t].size())}, {g[t].data(), int64_t(g[t].size())}, ""});
    Options config = {{"type", "sgd"}, {"lr", 1.0}, {"max_grad_norm", c["max_norm"]}};
    if (it.key() == "inf") config["norm_type"] = "inf";
    auto opt = Optimizer::create(engine(), config);
    opt->add_param_group(refs);
    StepResult r = opt->step();
    double torch_norm = std::stod(c["total_norm"].get<std::string>());
    EXPECT_NEAR(r.total_norm, torch_norm, 1e-6 * torch_norm) << it.key();
    for (size_t t = 0; t < p.size(); ++t)
      for (size_t k = 0; k < p[t].size(); ++k) {
        double want = std::stod(c["grads"][t][k].get<std::string>());
        EXPECT_NEAR(-double(p[t][k]), want, 4 * u * std::fabs(want) + 1e-30)
            << it.key() << " tensor " << t << " [" << k << "]";
      }
  }
}

}  // namespace
}  // namespace optfuse
