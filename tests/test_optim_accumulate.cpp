// Gradient accumulation (optax MultiSteps / MindSpore accumulation): k micro-batch gradients,
// the update on every k-th step() with their mean or sum; micro-steps change nothing but the
// optimizer's own buffer; save/load in the middle of a cycle resumes bit-identically.
// Reference (k = 3, SGD without momentum), in double: p' = p - lr * (g1 + g2 + g3) / d, d = 3
// ("mean") or 1 ("sum"). Tolerance: optfuse sums in float32 (acc = g1, acc = acc + g2, then
// (acc + g3) * grad_scale in the kernel), so with s2 = g1 + g2, s = s2 + g3, u = 2^-24:
//   |g_eff - s / d| <= u * (|s2| + |s|) / d + 2u * |s| / d  (two sums, grad_scale and the product)
//   |p' - ref| <= lr * that + u * lr * |s| / d + u * |p'|   (lr * g_eff and the subtraction)
// which the test allows as u * (|p'| + lr * (|s2| + 4 |s|) / d).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "optfuse/optim.h"
#include "support/engine.h"
#include "support/optim_util.h"

namespace optfuse {
namespace {

using ::testing::HasSubstr;
using testing::Model;

Engine& engine() { return testing::shared_engine(); }
constexpr double u = 0x1p-24;

const std::vector<std::vector<size_t>> kSizes = {{5, 40000, 1}, {17, 3, 70000}};

std::unique_ptr<Optimizer> make(const Options& config, Model& m) {
  auto opt = Optimizer::create(engine(), config);
  for (size_t g = 0; g < m.groups.size(); ++g) opt->add_param_group(m.refs(g));
  return opt;
}

void check_against_reference(bool mean, bool clip,
                             const std::vector<std::vector<size_t>>& sizes = kSizes) {
  const double lr = 0.25, max_norm = 5.0;
  const int k = 3;
  const double d = mean ? k : 1;
  Model m = Model::make(sizes, 31);
  Options config = {{"type", "sgd"},
                    {"lr", lr},
                    {"accumulation_steps", k},
                    {"accumulation", mean ? "mean" : "sum"}};
  if (clip) config["max_grad_norm"] = max_norm;
  auto opt = make(config, m);
  for (int update = 1; update <= 2; ++update) {
    Model start = m;
    std::vector<Model> micro;
    for (int j = 1; j <= k; ++j) {
      m.fill_grads(k * update + j);
      micro.push_back(m);
      testing::Snapshot before = testing::snapshot(*opt, m.buffers());
      StepResult r = opt->step();
      EXPECT_EQ(r.micro_step, j);
      if (j < k) {
        EXPECT_EQ(r.outcome, StepResult::Outcome::Accumulated);
        testing::Snapshot after = testing::snapshot(*opt, m.buffers());
        EXPECT_TRUE(before == after) << "micro-step " << j << ": " << before.diff(after);
        continue;
      }
      ASSERT_TRUE(r.applied());
      // the reference
      double sumsq = 0;
      std::vector<std::vector<std::vector<double>>> s(m.groups.size()), s2(m.groups.size());
      for (size_t g = 0; g < m.groups.size(); ++g)
        for (size_t i = 0; i < m.groups[g].size(); ++i) {
          s[g].emplace_back(m.groups[g][i].p.size());
          s2[g].emplace_back(m.groups[g][i].p.size());
          for (size_t e = 0; e < s[g][i].size(); ++e) {
            s2[g][i][e] = double(micro[0].groups[g][i].g[e]) + double(micro[1].groups[g][i].g[e]);
            s[g][i][e] = s2[g][i][e] + double(micro[2].groups[g][i].g[e]);
            sumsq += s[g][i][e] / d * (s[g][i][e] / d);
          }
        }
      double norm = std::sqrt(sumsq);
      double coef = clip ? std::min(1.0, max_norm / (norm + 1e-6)) : 1.0;
      if (clip) {
        // optfuse's norm is of the float32 sums: within (2u + n * 2^-53) relative of the exact one
        EXPECT_NEAR(r.total_norm, norm, 1e-6 * norm);
        EXPECT_LT(r.clip_coef, 1.0);
        EXPECT_NEAR(r.clip_coef, coef, 1e-6 * coef);
      }
      for (size_t g = 0; g < m.groups.size(); ++g)
        for (size_t i = 0; i < m.groups[g].size(); ++i) {
          const auto& p0 = start.groups[g][i].p;
          std::vector<double> want(p0.size()), bound(p0.size());
          for (size_t e = 0; e < p0.size(); ++e) {
            want[e] = double(p0[e]) - lr * coef * s[g][i][e] / d;
            bound[e] = u * (std::fabs(want[e]) +
                            lr * coef * (std::fabs(s2[g][i][e]) + 4 * std::fabs(s[g][i][e])) / d +
                            (clip ? 4 * lr * coef * std::fabs(s[g][i][e]) / d : 0)) +
                       1e-30;
          }
          EXPECT_TRUE(testing::within_bound("update " + std::to_string(update),
                                            m.groups[g][i].p.data(), want, bound, 1.0));
          EXPECT_EQ(opt->step_count(g, i), update);
        }
    }
  }
}

TEST(Accumulate, MeanMatchesReference) { check_against_reference(true, false); }
TEST(Accumulate, SumMatchesReference) { check_against_reference(false, false); }
// Clipping on the k-th micro-step looks at acc + g (the averaged gradient).
TEST(Accumulate, MeanWithClippingMatchesReference) { check_against_reference(true, true); }
// 60 single-task tensors: the micro-step kernels and the statistics kernel are spread over the
// worker threads (when the machine has 2 or more), partials combined in tensor order.
TEST(Accumulate, ManySmallTensorsMatchReference) {
  std::vector<std::vector<size_t>> sizes(2);
  for (size_t i = 0; i < 30; ++i) {
    sizes[0].push_back(1 + 7 * i);
    sizes[1].push_back(300 - 5 * i);
  }
  check_against_reference(true, true, sizes);
  check_against_reference(false, false, sizes);
}

// An inf in micro-step 1 stays in the buffer; the k-th step sees it, skips, and discards the cycle.
TEST(Accumulate, OverflowInAnEarlyMicroStepSkipsTheCycle) {
  Model m = Model::make(kSizes, 32);
  auto opt = make({{"type", "adam"}, {"accumulation_steps", 2}, {"loss_scale", "dynamic"}}, m);
  m.fill_grads(1);
  m.groups[1][2].g[69999] = std::numeric_limits<float>::infinity();
  testing::Snapshot before = testing::snapshot(*opt, m.buffers());
  EXPECT_EQ(opt->step().outcome, StepResult::Outcome::Accumulated);
  m.fill_grads(2);
  testing::Snapshot before2 = testing::snapshot(*opt, m.buffers());
  StepResult r = opt->step();
  EXPECT_EQ(r.outcome, StepResult::Outcome::SkippedNonFinite);
  EXPECT_EQ(r.micro_step, 2);
  EXPECT_EQ(r.next_loss_scale, 32768.0);
  testing::Snapshot after = testing::snapshot(*opt, m.buffers());
  EXPECT_TRUE(before2 == after) << before2.diff(after);
  // A new cycle starts: the next call is micro-step 1 again.
  m.fill_grads(3);
  EXPECT_EQ(opt->step().micro_step, 1);
  m.fill_grads(4);
  EXPECT_TRUE(opt->step().applied());
  EXPECT_EQ(opt->step_count(0, 0), 1);
}

TEST(Accumulate, NoGroupInTheMiddleOfACycle) {
  Model m = Model::make(kSizes, 33), extra = Model::make({{4}}, 99);
  auto opt = make({{"type", "sgd"}, {"accumulation_steps", 3}}, m);
  m.fill_grads(1);
  opt->step();
  std::string msg = testing::error_of([&] { opt->add_param_group(extra.refs(0)); });
  EXPECT_THAT(msg, HasSubstr("param group 2: cannot add a param group in the middle of a gradient "
                             "accumulation cycle (1 of 3 micro-steps done)"));
  EXPECT_EQ(opt->num_groups(), 2u);
  opt->step();
  opt->step();
  opt->add_param_group(extra.refs(0));  // fine after the update
  EXPECT_EQ(opt->num_groups(), 3u);
}

std::string magic_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string line;
  std::getline(in, line);
  return line;
}

// Save after 1 update + 1 micro-step (scaler state and the accumulation buffers in the file), load
// into a fresh optimizer over copies of the params, continue both: bit-identical throughout.
TEST(Accumulate, SaveLoadMidCycleResumesBitIdentically) {
  Options config = {{"type", "adamw"},         {"lr", 0.01},           {"accumulation_steps", 3},
                    {"loss_scale", "dynamic"}, {"growth_interval", 2}, {"init_scale", 256.0},
                    {"max_grad_norm", 4.0}};
  Model a = Model::make(kSizes, 34);
  auto opt = make(config, a);
  auto feed = [](Model& m, Optimizer& o, int micro) {
    m.fill_grads(micro);
    for (auto& group : m.groups)
      for (auto& t : group)
        for (float& x : t.g) x *= static_cast<float>(o.loss_scale());
    if (micro == 2) m.groups[0][1].g[7] = std::numeric_limits<float>::quiet_NaN();  // one skip
    return o.step();
  };
  for (int micro = 1; micro <= 4; ++micro) feed(a, *opt, micro);  // nan at 2: 3 skips the cycle
  for (int micro = 5; micro <= 7; ++micro) feed(a, *opt, micro);  // micro 2, update, micro 1
  std::string path = testing::temp_path("accum_state");
  opt->save_state(path);
  EXPECT_EQ(magic_of(path), "OPTFUSE-STATE 2");
  Model b = a;
  auto resumed = make(config, b);
  resumed->load_state(path);
  EXPECT_EQ(resumed->loss_scale(), opt->loss_scale());
  for (int micro = 8; micro <= 15; ++micro) {
    StepResult ra = feed(a, *opt, micro), rb = feed(b, *resumed, micro);
    EXPECT_EQ(ra.outcome, rb.outcome) << micro;
    EXPECT_EQ(ra.micro_step, rb.micro_step) << micro;
    EXPECT_EQ(ra.next_loss_scale, rb.next_loss_scale) << micro;
  }
  for (size_t g = 0; g < a.groups.size(); ++g)
    for (size_t i = 0; i < a.groups[g].size(); ++i) {
      EXPECT_TRUE(testing::same_bits(a.groups[g][i].p, b.groups[g][i].p));
      EXPECT_EQ(opt->step_count(g, i), resumed->step_count(g, i));
      for (const char* s : {"exp_avg", "exp_avg_sq", "grad_accum"})
        EXPECT_TRUE(testing::same_bits(*opt->state(g, i, s), *resumed->state(g, i, s))) << s;
    }
  std::remove(path.c_str());
}

TEST(Accumulate, StateFilesOfOtherConfigsAreRejected) {
  Model a = Model::make(kSizes, 35);
  auto opt = make({{"type", "sgd"}, {"accumulation_steps", 3}, {"loss_scale", "dynamic"}}, a);
  a.fill_grads(1);
  opt->step();  // micro-step 1 of 3
  std::string path = testing::temp_path("accum_reject");
  opt->save_state(path);
  Model b = a;
  auto plain = make({{"type", "sgd"}}, b);
  testing::Snapshot before = testing::snapshot(*plain, b.buffers());
  EXPECT_THAT(testing::error_of([&] { plain->load_state(path); }),
              HasSubstr("is at micro-step 1 of a gradient accumulation cycle, but this optimizer "
                        "has accumulation_steps = 1"));
  auto no_scaler = make({{"type", "sgd"}, {"accumulation_steps", 3}}, b);
  EXPECT_THAT(testing::error_of([&] { no_scaler->load_state(path); }),
              HasSubstr("holds dynamic loss scaler state, but this optimizer has no"));
  EXPECT_TRUE(before == testing::snapshot(*plain, b.buffers()));
  // A plain optimizer still writes (and reads) version 1 files.
  std::string plain_path = testing::temp_path("plain_state");
  plain->save_state(plain_path);
  EXPECT_EQ(magic_of(plain_path), "OPTFUSE-STATE 1");
  plain->load_state(plain_path);
  std::remove(path.c_str());
  std::remove(plain_path.c_str());
}

}  // namespace
}  // namespace optfuse
