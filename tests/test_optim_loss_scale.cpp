// Loss scaling: grads arrive multiplied by S and the step unscales them inside the optimizer's
// kernel; a non-finite value in any gradient of any group skips the WHOLE step (every param,
// grad, state byte, option and step count bit-identical, checked by snapshot) and is reported;
// the dynamic scaler follows torch.amp.GradScaler (golden sequences recorded with torch in
// tests/golden/step_features.json, compared exactly: the scale is a float32 value).
// Tolerance for a scale that is not a power of two (S = 1000), per step from the params before it:
// g_eff = float(float(g * S) * float(1 / S)) is within 3u (u = 2^-24) relative of g, so SGD's
// p' = p - lr * g_eff lands within u * (|p'| + 4 * lr * |g|) of p - lr * g in double (one more
// rounding each for lr * g_eff and the subtraction).
// Powers of two are exact: bit-identical to the unscaled run (test_optim_step_twins.cpp, every
// optimizer).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "optfuse/optfuse.h"
#include "optfuse/optim.h"
#include "support/engine.h"
#include "support/optim_util.h"

namespace optfuse {
namespace {

using ::testing::HasSubstr;
using testing::Model;

Engine& engine() { return testing::shared_engine(); }
constexpr double u = 0x1p-24;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

const std::vector<std::vector<size_t>> kSizes = {{5, 40000, 1}, {17, 3, 20000}};

std::unique_ptr<Optimizer> make(const Options& config, Model& m) {
  auto opt = Optimizer::create(engine(), config);
  for (size_t g = 0; g < m.groups.size(); ++g) opt->add_param_group(m.refs(g));
  return opt;
}

void scale_grads(Model& m, double s) {
  for (auto& group : m.groups)
    for (auto& t : group)
      for (float& x : t.g) x = static_cast<float>(double(x) * s);
}

TEST(LossScale, OddStaticScaleUnscalesWithinTolerance) {
  const double lr = 0.1, S = 1000.0;
  Model a = Model::make(kSizes, 21), b = a;
  auto scaled = make({{"type", "sgd"}, {"lr", lr}, {"loss_scale", S}}, b);
  for (int step = 1; step <= 3; ++step) {
    a = b;  // a: the params before the step and the unscaled grads
    a.fill_grads(step);
    b.fill_grads(step);
    scale_grads(b, S);
    StepResult r = scaled->step();
    EXPECT_TRUE(r.applied());
    EXPECT_EQ(r.loss_scale, S);
    EXPECT_EQ(r.next_loss_scale, S);  // static
    for (size_t g = 0; g < a.groups.size(); ++g)
      for (size_t i = 0; i < a.groups[g].size(); ++i) {
        const auto& pa = a.groups[g][i].p;
        const auto& ga = a.groups[g][i].g;
        std::vector<double> want(pa.size()), bound(pa.size());
        for (size_t k = 0; k < pa.size(); ++k) {
          want[k] = double(pa[k]) - lr * double(ga[k]);
          bound[k] = u * (std::fabs(want[k]) + 4 * lr * std::fabs(double(ga[k]))) + 1e-30;
        }
        EXPECT_TRUE(testing::within_bound("step " + std::to_string(step), b.groups[g][i].p.data(),
                                          want, bound, 1.0));
      }
  }
}

// With S a power of two the unscaled norm is exact, so loss scaling + clipping equals clipping
// of the unscaled grads, bit for bit, and reports the same total norm.
TEST(LossScale, ClippingSeesUnscaledGradients) {
  Model a = Model::make(kSizes, 22), b = a;
  auto clip = make({{"type", "adamw"}, {"max_grad_norm", 3.0}}, a);
  auto both = make({{"type", "adamw"}, {"max_grad_norm", 3.0}, {"loss_scale", "dynamic"}}, b);
  for (int step = 1; step <= 3; ++step) {
    a.fill_grads(step);
    b.fill_grads(step);
    scale_grads(b, both->loss_scale());
    StepResult ra = clip->step(), rb = both->step();
    EXPECT_LT(ra.clip_coef, 1.0);
    EXPECT_EQ(ra.total_norm, rb.total_norm);
    EXPECT_EQ(ra.clip_coef, rb.clip_coef);
  }
  for (size_t g = 0; g < a.groups.size(); ++g)
    for (size_t i = 0; i < a.groups[g].size(); ++i)
      EXPECT_TRUE(testing::same_bits(a.groups[g][i].p, b.groups[g][i].p));
}

// One inf or nan in ONE gradient of the SECOND group skips the whole step.
void check_overflow_skip(float bad, const Options& extra) {
  Model m = Model::make(kSizes, 23);
  Options config = {
      {"type", "adamw"}, {"lr", 0.01}, {"loss_scale", "dynamic"}, {"growth_interval", 3}};
  if (!extra.is_null()) config.update(extra);
  auto opt = make(config, m);
  for (int step = 1; step <= 2; ++step) {
    m.fill_grads(step);
    scale_grads(m, opt->loss_scale());
    ASSERT_TRUE(opt->step().applied());
  }
  m.fill_grads(3);
  scale_grads(m, opt->loss_scale());
  m.groups[1][2].g[12345] = bad;
  testing::Snapshot before = testing::snapshot(*opt, m.buffers());
  StepResult r = opt->step();
  EXPECT_EQ(r.outcome, StepResult::Outcome::SkippedNonFinite);
  EXPECT_FALSE(r.applied());
  EXPECT_TRUE(r.has_total_norm);
  EXPECT_FALSE(std::isfinite(r.total_norm));
  EXPECT_EQ(r.loss_scale, 65536.0);
  EXPECT_EQ(r.next_loss_scale, 32768.0);  // backoff 0.5
  EXPECT_EQ(opt->loss_scale(), 32768.0);
  testing::Snapshot after = testing::snapshot(*opt, m.buffers());
  EXPECT_TRUE(before == after) << before.diff(after);
  // The growth tracker restarted: 3 clean steps from here grow the scale again, not 1.
  for (int step = 4; step <= 6; ++step) {
    m.fill_grads(step);
    scale_grads(m, opt->loss_scale());
    StepResult ok = opt->step();
    EXPECT_TRUE(ok.applied());
    EXPECT_EQ(ok.next_loss_scale, step < 6 ? 32768.0 : 65536.0) << "step " << step;
  }
  EXPECT_EQ(opt->step_count(1, 2), 5);
}

TEST(LossScale, InfInOneGradOfSecondGroupSkipsEverything) { check_overflow_skip(kInf, {}); }
TEST(LossScale, NanInOneGradOfSecondGroupSkipsEverything) { check_overflow_skip(kNaN, {}); }
// Skipping takes precedence over clip_grad_norm_'s error_if_nonfinite.
TEST(LossScale, SkipWithClippingAndErrorIfNonfinite) {
  check_overflow_skip(-kInf, {{"max_grad_norm", 1.0}, {"error_if_nonfinite", true}});
}

TEST(LossScale, StaticScaleSkipsWithoutChangingScale) {
  Model m = Model::make(kSizes, 24);
  auto opt = make({{"type", "sgd"}, {"lr", 0.1}, {"momentum", 0.9}, {"loss_scale", 128.0}}, m);
  m.fill_grads(1);
  opt->step();
  m.fill_grads(2);
  m.groups[1][0].g[0] = kNaN;
  testing::Snapshot before = testing::snapshot(*opt, m.buffers());
  StepResult r = opt->step();
  EXPECT_EQ(r.outcome, StepResult::Outcome::SkippedNonFinite);
  EXPECT_EQ(r.next_loss_scale, 128.0);
  EXPECT_TRUE(before == testing::snapshot(*opt, m.buffers()));
}

// The scale sequence of torch.amp.GradScaler, driven by the same found-inf flags.
TEST(LossScale, DynamicScalerMatchesTorchGradScaler) {
  std::ifstream in(std::string(OPTFUSE_TEST_DATA_DIR) + "/golden/step_features.json");
  ASSERT_TRUE(in) << "missing tests/golden/step_features.json";
  nlohmann::json golden = nlohmann::json::parse(in);
  for (auto it = golden["grad_scaler"].begin(); it != golden["grad_scaler"].end(); ++it) {
    const nlohmann::json& c = it.value();
    Model m = Model::make({{3}}, 25);
    auto opt = make({{"type", "sgd"},
                     {"lr", 0.0},
                     {"loss_scale", "dynamic"},
                     {"init_scale", c["init_scale"]},
                     {"growth_factor", c["growth_factor"]},
                     {"backoff_factor", c["backoff_factor"]},
                     {"growth_interval", c["growth_interval"]}},
                    m);
    for (size_t k = 0; k < c["found_inf"].size(); ++k) {
      m.fill_grads(int(k) + 1);
      if (c["found_inf"][k].get<int>()) m.groups[0][0].g[1] = kInf;
      StepResult r = opt->step();
      EXPECT_EQ(r.applied(), c["found_inf"][k].get<int>() == 0);
      EXPECT_EQ(opt->loss_scale(), c["scales"][k].get<double>()) << it.key() << " update " << k;
    }
  }
}

TEST(LossScale, CApiReportsTheStep) {
  optfuse_engine* e = nullptr;
  ASSERT_EQ(optfuse_engine_create("host", 0, &e), OPTFUSE_OK);
  optfuse_optimizer* o = nullptr;
  ASSERT_EQ(
      optfuse_optimizer_create(
          e, R"({"type":"adam","loss_scale":"dynamic","init_scale":1024,"max_grad_norm":0.5})", &o),
      OPTFUSE_OK)
      << optfuse_last_error();
  std::vector<float> p = {1, 2, 3, 4}, g = {0.5f * 1024, -0.25f * 1024, 0, 1024};
  float* ps[] = {p.data()};
  float* gs[] = {g.data()};
  int64_t n[] = {4};
  ASSERT_EQ(optfuse_optimizer_add_group(o, 1, ps, gs, n, nullptr, nullptr, nullptr), OPTFUSE_OK);
  double s = 0;
  ASSERT_EQ(optfuse_optimizer_loss_scale(o, &s), OPTFUSE_OK);
  EXPECT_EQ(s, 1024.0);
  optfuse_step_result r;
  ASSERT_EQ(optfuse_optimizer_step_ex(o, &r), OPTFUSE_OK) << optfuse_last_error();
  EXPECT_EQ(r.outcome, OPTFUSE_STEP_APPLIED);
  EXPECT_EQ(r.has_total_norm, 1);
  EXPECT_NEAR(r.total_norm, std::sqrt(0.25 + 0.0625 + 1.0), 1e-12);
  EXPECT_NEAR(r.clip_coef, 0.5 / (r.total_norm + 1e-6), 1e-12);
  g[2] = kInf;
  std::vector<float> p_before = p;
  ASSERT_EQ(optfuse_optimizer_step_ex(o, &r), OPTFUSE_OK);
  EXPECT_EQ(r.outcome, OPTFUSE_STEP_SKIPPED_NONFINITE);
  EXPECT_EQ(r.loss_scale, 1024.0);
  EXPECT_EQ(r.next_loss_scale, 512.0);
  EXPECT_TRUE(testing::same_bits(p, p_before));
  EXPECT_EQ(optfuse_optimizer_step_ex(o, nullptr), OPTFUSE_OK);  // result optional
  optfuse_optimizer* bad = nullptr;
  EXPECT_EQ(optfuse_optimizer_create(e, R"({"type":"adam","accumulation_steps":0})", &bad),
            OPTFUSE_ERR_INVALID);
  EXPECT_THAT(optfuse_last_error(), HasSubstr("accumulation_steps must be an integer >= 1, got 0"));
  optfuse_optimizer_destroy(o);
  optfuse_engine_destroy(e);
}

}  // namespace
}  // namespace optfuse
