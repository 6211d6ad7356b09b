// LAMB and LARS (per-tensor trust ratios from norms computed by reductions in the same kernel)
// against the independent double references in support/trust_ratio_reference.h.
//
// Tolerance, per element after each step k (N = 12 steps):
//   params:  |p - p_ref| <= 1e-5 * sum_j<=k |p_ref,j - p_ref,j-1| + 2 k 2^-24 |p_ref|
//   states:  |s - s_ref| <= 1e-5 * max_j<=k |s_ref,j|  (+ 1e-30 absolute)
// Why: an f32 evaluation of one step's update u (a few roundings, an exact sqrt and divide) is
// within ~1e-6 relative; the norms are accumulated in double from those f32 values and rounded
// once, so the trust ratio ||p|| / ||u|| is within ~2e-6; the applied step lr * trust * u within
// ~4e-6 of the reference's, i.e. well inside 1e-5 of each step's movement, plus the rounding of p
// itself (one 2^-24 per step, twice for slack). States are EMAs rounded once per step (<= k ulp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "optfuse/optim.h"
#include "support/engine.h"
#include "support/optim_util.h"
#include "support/trust_ratio_reference.h"

namespace optfuse {
namespace {

using testing::error_of;
using testing::gen_floats;
using ::testing::HasSubstr;

constexpr int kSteps = 12;

Engine& engine() { return testing::shared_engine(); }

// Checks one tensor against its reference, with the bounds stated at the top.
struct Tracker {
  std::vector<double> moved, max_m, max_v;
  void update(const std::vector<double>& before, const std::vector<double>& after) {
    if (moved.empty()) moved.assign(after.size(), 0.0);
    for (size_t i = 0; i < after.size(); ++i) moved[i] += std::fabs(after[i] - before[i]);
  }
  static void track_max(std::vector<double>* mx, const std::vector<double>& s) {
    if (mx->empty()) mx->assign(s.size(), 0.0);
    for (size_t i = 0; i < s.size(); ++i) (*mx)[i] = std::max((*mx)[i], std::fabs(s[i]));
  }
};

void expect_params(const std::vector<float>& got, const std::vector<double>& ref, const Tracker& t,
                   int step, const std::string& what) {
  std::vector<double> bound(ref.size());
  for (size_t i = 0; i < ref.size(); ++i)
    bound[i] = 1e-5 * t.moved[i] + 2 * step * std::ldexp(std::fabs(ref[i]), -24) + 1e-30;
  EXPECT_TRUE(testing::within_bound(what + " param, step " + std::to_string(step), got.data(), ref,
                                    bound, 1.0));
}

void expect_state(const std::vector<float>& got, const std::vector<double>& ref,
                  const std::vector<double>& max_ref, int step, const std::string& what) {
  std::vector<double> bound(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) bound[i] = 1e-5 * max_ref[i] + 1e-30;
  EXPECT_TRUE(
      testing::within_bound(what + ", step " + std::to_string(step), got.data(), ref, bound, 1.0));
}

struct LambCase {
  std::string name;
  testing::LambConfig c;
};

class Lamb : public ::testing::TestWithParam<LambCase> {};

TEST_P(Lamb, MatchesTheDoubleReference) {
  const testing::LambConfig& c = GetParam().c;
  Options config = {{"type", "lamb"},
                    {"lr", c.lr},
                    {"betas", {c.beta1, c.beta2}},
                    {"eps", c.eps},
                    {"weight_decay", c.weight_decay},
                    {"bias_correction", c.bias_correction},
                    {"max_trust_ratio", c.max_trust_ratio}};
  for (size_t n : {size_t(1), size_t(7), size_t(1000), size_t(1) << 17}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    std::vector<float> p = gen_floats(3, n), g(n);
    testing::LambReference ref(c, p);
    auto opt = Optimizer::create(engine(), config);
    opt->add_param_group({{{p.data(), int64_t(n)}, {g.data(), int64_t(n)}, "w"}});
    Tracker t;
    for (int s = 1; s <= kSteps; ++s) {
      std::vector<float> gs = gen_floats(100 + s, n, 0.25);
      std::copy(gs.begin(), gs.end(), g.begin());
      std::vector<double> before = ref.param();
      ref.step(gs);
      opt->step();
      t.update(before, ref.param());
      Tracker::track_max(&t.max_m, ref.exp_avg());
      Tracker::track_max(&t.max_v, ref.exp_avg_sq());
      expect_params(p, ref.param(), t, s, GetParam().name);
      expect_state(*opt->state(0, 0, "exp_avg"), ref.exp_avg(), t.max_m, s, "exp_avg");
      expect_state(*opt->state(0, 0, "exp_avg_sq"), ref.exp_avg_sq(), t.max_v, s, "exp_avg_sq");
    }
  }
}

LambCase lamb_case(std::string name, void (*edit)(testing::LambConfig&)) {
  LambCase k{std::move(name), {}};
  edit(k.c);
  return k;
}

INSTANTIATE_TEST_SUITE_P(Optim, Lamb,
                         ::testing::Values(lamb_case("defaults", [](testing::LambConfig&) {}),
                                           lamb_case("no_bias_correction_no_decay",
                                                     [](testing::LambConfig& c) {
                                                       c.bias_correction = false;
                                                       c.weight_decay = 0;
                                                       c.lr = 1e-2;
                                                     }),
                                           lamb_case("clamped",
                                                     [](testing::LambConfig& c) {
                                                       c.max_trust_ratio = 0.5;
                                                       c.lr = 1e-2;
                                                       c.beta1 = 0.8;
                                                       c.beta2 = 0.99;
                                                       c.weight_decay = 0.1;
                                                     })),
                         [](const auto& info) { return info.param.name; });

struct LarsCase {
  std::string name;
  testing::LarsConfig c;
};

class Lars : public ::testing::TestWithParam<LarsCase> {};

TEST_P(Lars, MatchesTheDoubleReference) {
  const testing::LarsConfig& c = GetParam().c;
  Options config = {{"type", "lars"},
                    {"lr", c.lr},
                    {"momentum", c.momentum},
                    {"weight_decay", c.weight_decay},
                    {"trust_coefficient", c.trust_coefficient},
                    {"eps", c.eps}};
  for (size_t n : {size_t(1), size_t(7), size_t(1000), size_t(1) << 17}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    std::vector<float> p = gen_floats(5, n), g(n);
    testing::LarsReference ref(c, p);
    auto opt = Optimizer::create(engine(), config);
    opt->add_param_group({{{p.data(), int64_t(n)}, {g.data(), int64_t(n)}, "w"}});
    Tracker t;
    for (int s = 1; s <= kSteps; ++s) {
      std::vector<float> gs = gen_floats(200 + s, n, 0.25);
      std::copy(gs.begin(), gs.end(), g.begin());
      std::vector<double> before = ref.param();
      ref.step(gs);
      opt->step();
      t.update(before, ref.param());
      expect_params(p, ref.param(), t, s, GetParam().name);
      if (c.momentum != 0) {
        Tracker::track_max(&t.max_m, ref.momentum_buffer());
        expect_state(*opt->state(0, 0, "momentum_buffer"), ref.momentum_buffer(), t.max_m, s,
                     "momentum_buffer");
      } else {
        EXPECT_EQ(opt->state(0, 0, "momentum_buffer"), nullptr);
      }
    }
  }
}

LarsCase lars_case(std::string name, void (*edit)(testing::LarsConfig&)) {
  LarsCase k{std::move(name), {}};
  edit(k.c);
  return k;
}

INSTANTIATE_TEST_SUITE_P(Optim, Lars,
                         ::testing::Values(lars_case("defaults", [](testing::LarsConfig&) {}),
                                           lars_case("decay_no_momentum",
                                                     [](testing::LarsConfig& c) {
                                                       c.momentum = 0;
                                                       c.weight_decay = 1e-2;
                                                       c.trust_coefficient = 0.02;
                                                     }),
                                           lars_case("decay_momentum",
                                                     [](testing::LarsConfig& c) {
                                                       c.weight_decay = 5e-4;
                                                       c.lr = 1.0;
                                                     })),
                         [](const auto& info) { return info.param.name; });

// Each tensor has its own norms: two tensors in one group, one scaled by 100, get different
// trust ratios (a ratio over the whole group would couple them).
TEST(TrustRatio, PerTensorNorms) {
  const size_t n = 500;
  std::vector<float> a = gen_floats(1, n), b = gen_floats(2, n), ga(n), gb(n);
  for (float& x : b) x *= 100;
  testing::LambReference ra({}, a), rb({}, b);
  auto opt = Optimizer::create(engine(), {{"type", "lamb"}});
  opt->add_param_group({{{a.data(), int64_t(n)}, {ga.data(), int64_t(n)}, "a"},
                        {{b.data(), int64_t(n)}, {gb.data(), int64_t(n)}, "b"}});
  std::vector<float> g = gen_floats(9, n, 0.25);
  std::copy(g.begin(), g.end(), ga.begin());
  std::copy(g.begin(), g.end(), gb.begin());
  ra.step(g);
  rb.step(g);
  opt->step();
  EXPECT_GT(rb.last_trust_ratio(), 50 * ra.last_trust_ratio());
  std::vector<float> a0 = gen_floats(1, n), b0 = gen_floats(2, n);
  for (float& x : b0) x *= 100;
  Tracker ta, tb;
  ta.update(std::vector<double>(a0.begin(), a0.end()), ra.param());
  tb.update(std::vector<double>(b0.begin(), b0.end()), rb.param());
  expect_params(a, ra.param(), ta, 1, "a");
  expect_params(b, rb.param(), tb, 1, "b");
}

// A zero norm gives a trust ratio of 1 (apex, torchlars): zero params, zero grads.
TEST(TrustRatio, ZeroNormsGiveOne) {
  const size_t n = 64;
  {
    std::vector<float> p(n, 0.f), g = gen_floats(4, n, 0.25);
    testing::LambConfig c;
    c.weight_decay = 0;
    testing::LambReference ref(c, p);
    auto opt = Optimizer::create(engine(), {{"type", "lamb"}, {"weight_decay", 0.0}});
    opt->add_param_group({{{p.data(), int64_t(n)}, {g.data(), int64_t(n)}}});
    ref.step(g);
    opt->step();
    EXPECT_EQ(ref.last_trust_ratio(), 1.0);
    for (size_t i = 0; i < n; ++i) EXPECT_NEAR(p[i], ref.param()[i], 1e-6 * 1e-3) << i;
  }
  {
    std::vector<float> p = gen_floats(5, n), g(n, 0.f);
    testing::LarsConfig c;
    testing::LarsReference ref(c, p);
    auto opt = Optimizer::create(engine(), {{"type", "lars"}});
    opt->add_param_group({{{p.data(), int64_t(n)}, {g.data(), int64_t(n)}}});
    ref.step(g);
    opt->step();
    EXPECT_EQ(ref.last_local_lr(), 1.0);
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(double(p[i]), ref.param()[i]) << i;  // d = 0
  }
}

TEST(TrustRatio, Bf16ParamsWithMasterWeights) {
  // LAMB's norms see the f32 master copy: the same trajectory as f32 params, the bf16 copy its
  // round-to-nearest-even (covered for every optimizer in test_mixed_precision; here the
  // reference).
  const size_t n = 1000;
  std::vector<float> p0 = gen_floats(6, n);
  std::vector<uint16_t> p16(n);
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &p0[i], 4);
    p16[i] = static_cast<uint16_t>(u >> 16);  // truncation: p0 becomes exactly representable
    u &= 0xffff0000u;
    std::memcpy(&p0[i], &u, 4);
  }
  std::vector<float> g(n);
  testing::LambReference ref({}, p0);
  auto opt = Optimizer::create(engine(), {{"type", "lamb"}});
  opt->add_param_group({{{p16.data(), int64_t(n), {}, DType::BF16}, {g.data(), int64_t(n)}}});
  Tracker t;
  for (int s = 1; s <= 5; ++s) {
    std::vector<float> gs = gen_floats(300 + s, n, 0.25);
    std::copy(gs.begin(), gs.end(), g.begin());
    std::vector<double> before = ref.param();
    ref.step(gs);
    opt->step();
    t.update(before, ref.param());
    expect_params(*opt->state(0, 0, "master"), ref.param(), t, s, "lamb bf16 master");
  }
}

TEST(TrustRatio, InvalidOptionsAreRejected) {
  EXPECT_THAT(error_of([] {
                Optimizer::create(engine(), {{"type", "lamb"}, {"max_trust_ratio", -1}});
              }),
              HasSubstr("Invalid max_trust_ratio value: -1.0"));
  EXPECT_THAT(error_of([] {
                Optimizer::create(engine(), {{"type", "lars"}, {"trust_coefficient", -1}});
              }),
              HasSubstr("Invalid trust_coefficient value: -1.0"));
  EXPECT_THAT(error_of([] {
                Optimizer::create(engine(), {{"type", "lars"}, {"momentum", -0.5}});
              }),
              HasSubstr("Invalid momentum value: -0.5"));
  EXPECT_THAT(error_of([] {
                Optimizer::create(engine(), {{"type", "lamb"}, {"betas", {1.0, 0.9}}});
              }),
              HasSubstr("Invalid beta parameter at index 0: 1.0"));
}

}  // namespace
}  // namespace optfuse
