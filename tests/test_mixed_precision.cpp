// Mixed precision (include/optfuse/optim.h, src/optim/precision.h): bf16/f16 params with f32
// master weights, bf16/f16 grads, bf16 optimizer state, stochastic rounding.
//
// What is exact and what is bounded:
//   * The master path is f32: for every optimizer, a bf16 (or f16) param run whose initial
//     values are representable in 16 bits makes the same f32 computation as the f32 run of those
//     values: after N steps master == f32 param and every state is equal, bit for bit where the
//     two kernels contract multiply-adds alike, else within a few ulp (kMaxUlps says why). The
//     f32 path itself is checked against the double reference in test_optim_reference; here
//     AdamW's master is also checked against it directly (2 x the reference's running bound).
//   * The param copy is the round-to-nearest-even of master, bit for bit (an independent RNE
//     written here from the definition), so |param - reference| <= 2 x bound + 2^-8 |master|.
//   * 16-bit grads are widened exactly: a bf16/f16-grad run equals the f32 run fed the widened
//     grads, bit for bit.
//   * bf16 state: the kernel computes in f32 and stores RNE, so after ONE step from zero state the
//     bf16 state is exactly the RNE of the f32 run's state. Over N steps the roundings accumulate:
//     each stored m, v carries a relative error <= 2^-8 that the EMA carries on (decaying), so
//     after N steps |m_bf16 - m_f32| <= N 2^-8 max_k |m_k| (likewise v), and the update
//     m / (sqrt(v) + eps) is off by at most (N + N/2) 2^-8 relative, to first order. We check
//     params against 2 x that (second-order terms, the eps term): |p_bf16s - p_f32s| <=
//     2 * 1.5 N 2^-8 * sum_k |p_k - p_{k-1}| (the f32 run's per-step movement), + 1e-7 |p|.
//   * Stochastic rounding: unbiased (the mean of 2^16 roundings of one value is within 5 standard
//     deviations, 0.01 bf16 ulp, of the value, where round-to-nearest is 0.3 ulp off),
//     reproducible (same seed and step: same bits; the kernel equals the interpreter bit for bit),
//     and always one of the two bf16 neighbours of master.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "optfuse/engine.h"
#include "optfuse/optfuse.h"
#include "optfuse/optim.h"
#include "support/engine.h"
#include "support/optim_util.h"
#include "support/reference_optim.h"
#include "support/run_kernel.h"

namespace optfuse {
namespace {

using testing::error_of;
using testing::gen_floats;
using ::testing::HasSubstr;

Engine& engine() { return testing::shared_engine(); }

// ---- 16-bit values, written from the definitions (not optfuse's conversions) -----------------

float bf16_value(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even with 8 significant bits, in double: exact for the normal f32 values the
// tests use.
uint16_t bf16_rne(float x) {
  int e;
  std::frexp(x, &e);
  double quantum = std::ldexp(1.0, e - 8);
  auto r = static_cast<float>(std::nearbyint(x / quantum) * quantum);
  uint32_t u;
  std::memcpy(&u, &r, 4);
  EXPECT_EQ(u & 0xffffu, 0u);
  return static_cast<uint16_t>(u >> 16);
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out;
  for (float x : v) out.push_back(bf16_rne(x));
  return out;
}
std::vector<float> from_bf16(const std::vector<uint16_t>& v) {
  std::vector<float> out;
  for (uint16_t b : v) out.push_back(bf16_value(b));
  return out;
}
std::vector<uint16_t> to_f16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    _Float16 h = static_cast<_Float16>(v[i]);
    std::memcpy(&out[i], &h, 2);
  }
  return out;
}
std::vector<float> from_f16(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    _Float16 h;
    std::memcpy(&h, &v[i], 2);
    out[i] = static_cast<float>(h);
  }
  return out;
}

std::vector<float> grads_at(int step, size_t n) { return gen_floats(1000 + step, n, 0.5); }

// ---- One tensor trained by one optimizer, in a given precision -------------------------------

struct Trained {
  std::unique_ptr<Optimizer> opt;
  std::vector<float> p32, g32;
  std::vector<uint16_t> p16, g16;
};

// A one-tensor optimizer over `p0` (whose values must be representable in `param`).
Trained make_run(const Options& config, const std::vector<float>& p0, DType param, DType grad,
                 const Options& overrides = {}) {
  Trained r;
  r.opt = Optimizer::create(engine(), config);
  size_t n = p0.size();
  TensorRef p{nullptr, int64_t(n), {}, param}, g{nullptr, int64_t(n), {}, grad};
  if (param == DType::F32) {
    r.p32 = p0;
    p.data = r.p32.data();
  } else {
    r.p16 = param == DType::BF16 ? to_bf16(p0) : to_f16(p0);
    p.data = r.p16.data();
  }
  if (grad == DType::F32) {
    r.g32.assign(n, 0);
    g.data = r.g32.data();
  } else {
    r.g16.assign(n, 0);
    g.data = r.g16.data();
  }
  r.opt->add_param_group({{p, g, "w"}}, overrides);
  return r;
}

// Overwrites the grad buffer in place (the optimizer holds its address).
void set_grads(Trained& r, const std::vector<float>& g, DType grad) {
  if (grad == DType::F32) {
    std::copy(g.begin(), g.end(), r.g32.begin());
    return;
  }
  std::vector<uint16_t> bits = grad == DType::BF16 ? to_bf16(g) : to_f16(g);
  std::copy(bits.begin(), bits.end(), r.g16.begin());
}

// `v` made representable in `t` (so that a 16-bit run and an f32 run start equal).
std::vector<float> representable(const std::vector<float>& v, DType t) {
  if (t == DType::BF16) return from_bf16(to_bf16(v));
  if (t == DType::F16) return from_f16(to_f16(v));
  return v;
}

Options config_for(const std::string& type) {
  Options c = {{"type", type}, {"lr", 1e-2}};
  if (type == "sgd") c["momentum"] = 0.9;
  if (type == "lion") c["lr"] = 1e-3;
  // Adafactor's default eps1 is the param dtype's epsilon (torch's): the same one for both runs.
  if (type == "adafactor") c["eps"] = {1e-7, 1e-3};
  return c;
}

// ---- The master path is the f32 path ---------------------------------------------------------

// max |a - b| in units of the last place of the larger magnitude (f32).
double max_ulps(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double m = std::max(std::fabs(double(a[i])), std::fabs(double(b[i])));
    if (m == 0) continue;
    int e;
    std::frexp(m, &e);
    worst =
        std::max(worst, std::fabs(double(a[i]) - b[i]) / std::ldexp(1.0, std::max(e, -125) - 24));
  }
  return worst;
}

// Both runs are f32 evaluations of the same formulas on the same values, bit-identical where the
// two kernels contract multiply-adds alike. Not always: canonicalize() orders commutative operands
// by their subgraphs' hashes, which differ in the mixed graph (master for param, cast(grad) for
// grad), so an add of two products, such as Adam's g = sign * grad + weight_decay * p, can come in
// the other order, and LLVM fuses the first product into the FMA: one rounding moves from one
// product to the other, and the following steps carry it. Measured after 5 steps, the same on AVX2
// and AVX-512 (OPTFUSE_HOST_TARGET): Adam 6 ulp, NAdam and RAdam 3, the others bit-identical (SGD
// too: its weight_decay is 0, so the other product is 0 exactly); 16 allowed. The rounding of the
// 16-bit copy from master is checked exactly either way.
constexpr double kMaxUlps = 16;

class EveryOptimizer : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryOptimizer, MasterIsTheF32RunBitForBitAndParamIsItsRoundToNearestEven) {
  const size_t n = 1000 + 3;
  for (DType low : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(std::string(dtype_name(low)));
    std::vector<float> p0 = representable(gen_floats(7, n), low);
    Trained f32 = make_run(config_for(GetParam()), p0, DType::F32, DType::F32);
    Trained mixed = make_run(config_for(GetParam()), p0, low, DType::F32);
    for (int s = 1; s <= 5; ++s) {
      std::vector<float> g = grads_at(s, n);
      set_grads(f32, g, DType::F32);
      set_grads(mixed, g, DType::F32);
      f32.opt->step();
      mixed.opt->step();
    }
    const std::vector<float>* master = mixed.opt->state(0, 0, "master");
    ASSERT_NE(master, nullptr);
    double worst = max_ulps(*master, f32.p32);
    std::vector<uint16_t> want = low == DType::BF16 ? to_bf16(*master) : to_f16(*master);
    EXPECT_EQ(mixed.p16, want);
    for (const std::string& name : testing::all_state_names()) {
      const std::vector<float>* a = f32.opt->state(0, 0, name);
      const std::vector<float>* b = mixed.opt->state(0, 0, name);
      ASSERT_EQ(a == nullptr, b == nullptr) << name;
      if (a) worst = std::max(worst, max_ulps(*a, *b));
    }
    EXPECT_LE(worst, kMaxUlps);
    std::printf("%s, %s params: master and state vs the f32 run: %s\n", GetParam().c_str(),
                std::string(dtype_name(low)).c_str(),
                worst == 0 ? "bit-identical" : ("max " + std::to_string(worst) + " ulp").c_str());
  }
}

// Every optimizer with dense gradients (sparseadam's mixed precision: test_optim_sparse_adam).
std::vector<std::string> dense_optimizers() {
  std::vector<std::string> out;
  for (const std::string& t : optimizer_types())
    if (t != "sparseadam") out.push_back(t);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Mixed, EveryOptimizer, ::testing::ValuesIn(dense_optimizers()));

TEST(MixedPrecision, Bf16AdamWWithinTheDoubleReferenceBound) {
  const size_t n = 1000;
  std::vector<float> p0 = representable(gen_floats(3, n), DType::BF16);
  testing::AdamConfig c;
  c.decoupled_weight_decay = true;
  c.lr = 1e-2;
  c.weight_decay = 0.1;
  testing::ReferenceOptimizer ref(c, p0);
  Trained run = make_run({{"type", "adamw"}, {"lr", 1e-2}, {"weight_decay", 0.1}}, p0, DType::BF16,
                         DType::F32);
  for (int s = 1; s <= 10; ++s) {
    std::vector<float> g = grads_at(s, n);
    set_grads(run, g, DType::F32);
    run.opt->step();
    ref.step(g);
    const std::vector<float>& master = *run.opt->state(0, 0, "master");
    EXPECT_TRUE(testing::within_bound("master", master.data(), ref.param(), ref.param_bound(),
                                      testing::kEvaluationOrderSlack));
    std::vector<double> bound(n);
    for (size_t i = 0; i < n; ++i)
      bound[i] = testing::kEvaluationOrderSlack * ref.param_bound()[i] +
                 std::ldexp(std::fabs(master[i]), -8);  // + half a bf16 ulp (RNE): u = 2^-8
    std::vector<float> param = from_bf16(run.p16);
    EXPECT_TRUE(testing::within_bound("bf16 param", param.data(), ref.param(), bound, 1.0));
  }
}

TEST(MixedPrecision, SixteenBitGradsAreWidenedExactly) {
  const size_t n = 517;
  for (DType gd : {DType::BF16, DType::F16}) {
    std::vector<float> p0 = gen_floats(5, n);
    Trained wide = make_run({{"type", "adam"}}, p0, DType::F32, DType::F32);
    Trained low = make_run({{"type", "adam"}}, p0, DType::F32, gd);
    for (int s = 1; s <= 3; ++s) {
      std::vector<float> g = representable(grads_at(s, n), gd);
      set_grads(wide, g, DType::F32);
      set_grads(low, g, gd);
      wide.opt->step();
      low.opt->step();
    }
    EXPECT_TRUE(testing::same_bits(wide.p32, low.p32)) << dtype_name(gd);
  }
}

// Bit-identical by construction: AdamW's mixed graph orders every add of two products as the f32
// graph does, and the bf16 conversions are integer ops (src/lower/bf16.h), so both kernels compile
// the same f32 instructions (test_bf16 checks the objects for AVX2 and AVX-512 targets). Halide's
// strict_float emulation had made the master differ by up to 15 ulp on every x86 target but
// avx512_sapphirerapids (issue 15).
TEST(MixedPrecision, Bf16ParamsAndBf16GradsTogether) {
  const size_t n = 300;
  std::vector<float> p0 = representable(gen_floats(8, n), DType::BF16);
  Trained wide = make_run({{"type", "adamw"}}, p0, DType::F32, DType::F32);
  Trained low = make_run({{"type", "adamw"}}, p0, DType::BF16, DType::BF16);
  for (int s = 1; s <= 3; ++s) {
    std::vector<float> g = representable(grads_at(s, n), DType::BF16);
    set_grads(wide, g, DType::F32);
    set_grads(low, g, DType::BF16);
    wide.opt->step();
    low.opt->step();
  }
  EXPECT_TRUE(testing::same_bits(*low.opt->state(0, 0, "master"), wide.p32));
  EXPECT_EQ(low.p16, to_bf16(wide.p32));
}

// Clipping, loss scaling and accumulation read 16-bit grads through their own kernels (the
// statistics pass and the micro-steps, one per grad dtype; the accumulation buffer stays f32): a
// bf16/f16 grad must give exactly what its f32 widening gives, total norms included.
TEST(MixedPrecision, StepFeaturesReadSixteenBitGrads) {
  const size_t n = 2000;
  const Options config = {
      {"type", "adamw"}, {"max_grad_norm", 0.05}, {"loss_scale", 8.0}, {"accumulation_steps", 2}};
  std::vector<float> p0 = representable(gen_floats(12, n), DType::BF16);
  for (DType gd : {DType::BF16, DType::F16}) {
    Trained wide = make_run(config, p0, DType::BF16, DType::F32);
    Trained low = make_run(config, p0, DType::BF16, gd);
    bool clipped = false;
    for (int s = 1; s <= 6; ++s) {
      std::vector<float> g = representable(grads_at(s, n), gd);
      set_grads(wide, g, DType::F32);
      set_grads(low, g, gd);
      StepResult rw = wide.opt->step(), rl = low.opt->step();
      ASSERT_EQ(rw.outcome, rl.outcome) << dtype_name(gd) << " step " << s;
      ASSERT_EQ(rw.has_total_norm, rl.has_total_norm);
      EXPECT_EQ(rw.total_norm, rl.total_norm) << dtype_name(gd) << " step " << s;
      clipped = clipped || (rw.applied() && rw.clip_coef < 1);
    }
    EXPECT_TRUE(clipped) << "max_grad_norm too large to exercise clipping";
    EXPECT_TRUE(
        testing::same_bits(*low.opt->state(0, 0, "master"), *wide.opt->state(0, 0, "master")))
        << dtype_name(gd);
    EXPECT_EQ(low.p16, wide.p16) << dtype_name(gd);
  }
}

// ---- bf16 optimizer state --------------------------------------------------------------------

TEST(Bf16State, FirstStepStoresTheRoundToNearestEvenOfTheF32State) {
  const size_t n = 1000;
  std::vector<float> p0 = gen_floats(9, n);
  Trained f32 = make_run({{"type", "adamw"}}, p0, DType::F32, DType::F32);
  Trained bf = make_run({{"type", "adamw"}}, p0, DType::F32, DType::F32, {{"state_dtype", "bf16"}});
  set_grads(f32, grads_at(1, n), DType::F32);
  set_grads(bf, grads_at(1, n), DType::F32);
  f32.opt->step();
  bf.opt->step();
  for (const char* name : {"exp_avg", "exp_avg_sq"}) {
    ASSERT_NE(bf.opt->state_bf16(0, 0, name), nullptr) << name;
    EXPECT_EQ(bf.opt->state(0, 0, name), nullptr) << name;
    EXPECT_EQ(*bf.opt->state_bf16(0, 0, name), to_bf16(*f32.opt->state(0, 0, name))) << name;
  }
  // Step 1 reads zero state either way: the params agree exactly.
  EXPECT_TRUE(testing::same_bits(f32.p32, bf.p32));
}

TEST(Bf16State, ParamsStayWithinTheStatedBoundOfTheF32StateRun) {
  const size_t n = 1000;
  const int steps = 10;
  std::vector<float> p0 = gen_floats(11, n);
  Trained f32 = make_run({{"type", "adamw"}, {"lr", 1e-2}}, p0, DType::F32, DType::F32);
  Trained bf = make_run({{"type", "adamw"}, {"lr", 1e-2}}, p0, DType::F32, DType::F32,
                        {{"state_dtype", "bf16"}});
  std::vector<double> moved(n, 0.0);
  std::vector<double> max_m(n, 0.0), max_v(n, 0.0);
  for (int s = 1; s <= steps; ++s) {
    std::vector<float> before = f32.p32;
    set_grads(f32, grads_at(s, n), DType::F32);
    set_grads(bf, grads_at(s, n), DType::F32);
    f32.opt->step();
    bf.opt->step();
    for (size_t i = 0; i < n; ++i) {
      moved[i] += std::fabs(double(f32.p32[i]) - before[i]);
      max_m[i] = std::max(max_m[i], std::fabs(double((*f32.opt->state(0, 0, "exp_avg"))[i])));
      max_v[i] = std::max(max_v[i], std::fabs(double((*f32.opt->state(0, 0, "exp_avg_sq"))[i])));
    }
  }
  const double u = std::ldexp(1.0, -8), rel = 2 * 1.5 * steps * u;
  double worst = 0;
  std::vector<float> m = bf.opt->state_values(0, 0, "exp_avg"),
                     v = bf.opt->state_values(0, 0, "exp_avg_sq");
  for (size_t i = 0; i < n; ++i) {
    double bound = rel * moved[i] + 1e-7 * std::fabs(f32.p32[i]);
    double diff = std::fabs(double(bf.p32[i]) - f32.p32[i]);
    worst = std::max(worst, diff / bound);
    ASSERT_LE(diff, bound) << "element " << i;
    EXPECT_LE(std::fabs(m[i] - (*f32.opt->state(0, 0, "exp_avg"))[i]), 2 * steps * u * max_m[i]);
    EXPECT_LE(std::fabs(v[i] - (*f32.opt->state(0, 0, "exp_avg_sq"))[i]), 2 * steps * u * max_v[i]);
  }
  std::printf("bf16 state, AdamW, %d steps: worst |p - p_f32state| / bound = %.3f\n", steps, worst);
}

TEST(Bf16State, ChangingStateDtypeConvertsTheStateInsteadOfResettingIt) {
  const size_t n = 100;
  std::vector<float> p0 = gen_floats(12, n);
  Trained r = make_run({{"type", "adam"}}, p0, DType::F32, DType::F32);
  set_grads(r, grads_at(1, n), DType::F32);
  r.opt->step();
  std::vector<float> m = *r.opt->state(0, 0, "exp_avg");
  r.opt->set(0, "state_dtype", "bf16");
  set_grads(r, std::vector<float>(n, 0.f), DType::F32);
  r.opt->step();  // m' = 0.9 m: from the converted state, not from zeros
  std::vector<float> now = r.opt->state_values(0, 0, "exp_avg");
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(now[i], 0.9 * m[i], 0.01 * std::fabs(m[i]) + 1e-30);
  EXPECT_EQ(r.opt->state(0, 0, "exp_avg"), nullptr);
}

// ---- Stochastic rounding ---------------------------------------------------------------------

// round_sr(x) for every element of a constant tensor: a kernel of one op.
Graph round_sr_graph() {
  Graph g("sr");
  Value p = g.param("p");
  g.output("p", cast(round_sr(p, g.scalar("key", DType::F64)), DType::F32));
  return g;
}

std::vector<float> round_sr_kernel(float x, size_t n, double key) {
  auto k = engine().kernel(round_sr_graph());
  testing::Tensors out =
      testing::run_kernel(*k, {{"p", std::vector<double>(n, x)}}, {{"key", key}});
  return std::vector<float>(out["p"].begin(), out["p"].end());
}

TEST(StochasticRounding, UnbiasedForValuesBetweenTwoBf16Neighbours) {
  const size_t n = size_t(1) << 16;
  // 1 + f ulp for several fractions f, negatives, and a value just under a power of two (the
  // carry crosses into the exponent).
  const float ulp1 = std::ldexp(1.0f, -7);
  for (float x : {1.0f + 0.3f * ulp1, 1.0f + 0.5f * ulp1, -(1.0f + 0.9f * ulp1), 3.0e-3f,
                  2.0f - 0.25f * ulp1, 1.7e-38f}) {
    std::vector<float> r = round_sr_kernel(x, n, 12345);
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    // x's two bf16 neighbours: truncated toward zero, and the next one away from zero.
    const float lo = bf16_value(static_cast<uint16_t>(bits >> 16));
    const float hi = bf16_value(static_cast<uint16_t>((bits >> 16) + 1));
    const double ulp = std::fabs(double(hi) - lo);
    double sum = 0;
    int ups = 0;
    for (float v : r) {
      ASSERT_TRUE(v == lo || v == hi) << v;
      sum += v;
      ups += v == hi;
    }
    double mean = sum / n;
    double frac = std::fabs(double(x) - lo) / ulp;
    // Each rounding is lo or the next bf16 away from zero: Bernoulli(frac) ulps. 5 sigma of the
    // mean (plus a tiny floor for a value with frac = 0).
    double sigma = ulp * std::sqrt(frac * (1 - frac) / n) + 1e-3 * ulp / std::sqrt(double(n));
    EXPECT_NEAR(mean, x, 5 * sigma + 1e-45) << "x = " << x << ", ups " << ups;
    EXPECT_LT(5 * sigma, 0.011 * ulp);
  }
}

TEST(StochasticRounding, KernelEqualsInterpreterAndKeysGiveDifferentBits) {
  Graph g = round_sr_graph();
  auto k = engine().kernel(g);
  const size_t n = 4099;
  std::vector<float> x = gen_floats(21, n);
  testing::Tensors in{{"p", std::vector<double>(x.begin(), x.end())}};
  for (double key : {0.0, 1.0, 4294967295.0}) {
    testing::Tensors got = testing::run_kernel(*k, in, {{"key", key}});
    testing::Tensors want = interpret(g, in, {{"key", key}});
    EXPECT_EQ(got["p"], want["p"]) << "key " << key;
  }
  EXPECT_NE(testing::run_kernel(*k, in, {{"key", 1.0}})["p"],
            testing::run_kernel(*k, in, {{"key", 2.0}})["p"]);
}

TEST(StochasticRounding, TinyUpdatesMoveBf16ParamsOnAverageWhereNearestRoundingStalls) {
  // SGD with updates far below half a bf16 ulp: nearest rounding never moves the param, while
  // stochastic rounding follows master on average.
  const size_t n = 1 << 14;
  std::vector<float> p0(n, 1.0f);
  Options cfg = {{"type", "sgd"}, {"lr", 1e-4}};
  Trained rne = make_run(cfg, p0, DType::BF16, DType::F32);
  Trained sr = make_run(cfg, p0, DType::BF16, DType::F32,
                        {{"stochastic_rounding", true}, {"rounding_seed", 7}});
  for (int s = 1; s <= 20; ++s) {
    set_grads(rne, std::vector<float>(n, -1.0f), DType::F32);  // p += 1e-4 per step
    set_grads(sr, std::vector<float>(n, -1.0f), DType::F32);
    rne.opt->step();
    sr.opt->step();
  }
  const std::vector<float>& master = *sr.opt->state(0, 0, "master");
  EXPECT_EQ(rne.p16, to_bf16(p0));  // stalled: 20 * 1e-4 < half an ulp (2^-8) at 1.0
  double mean = 0, master_mean = 0;
  for (size_t i = 0; i < n; ++i) {
    float p = bf16_value(sr.p16[i]);
    // Always one of master's two bf16 neighbours.
    EXPECT_LE(std::fabs(p - master[i]), std::ldexp(1.0f, -7)) << i;
    mean += p;
    master_mean += master[i];
  }
  mean /= n;
  master_mean /= n;
  // Bernoulli with p ~ 0.26 of one ulp (2^-7): sigma of the mean ~ 3.4e-5; 5 sigma.
  EXPECT_NEAR(mean, master_mean, 1.8e-4);
  EXPECT_GT(mean, 1.0 + 1e-3);
}

TEST(StochasticRounding, SameSeedSameBitsOtherSeedOtherBits) {
  const size_t n = 2000;
  std::vector<float> p0 = representable(gen_floats(31, n), DType::BF16);
  auto run = [&](int seed) {
    Trained r = make_run({{"type", "adamw"}, {"lr", 1e-3}}, p0, DType::BF16, DType::F32,
                         {{"stochastic_rounding", true}, {"rounding_seed", seed}});
    for (int s = 1; s <= 3; ++s) {
      set_grads(r, grads_at(s, n), DType::F32);
      r.opt->step();
    }
    return r.p16;
  };
  EXPECT_EQ(run(1), run(1));
  EXPECT_NE(run(1), run(2));
}

// ---- Bytes, state files, errors ----------------------------------------------------------------

TEST(MixedPrecision, BytesPerStepCountsEachTensorInItsDtype) {
  std::vector<float> p0 = representable(gen_floats(1, 10), DType::BF16);
  auto bytes = [&](DType p, DType g, const char* state) {
    return make_run({{"type", "adamw"}}, p0, p, g, {{"state_dtype", state}}).opt->bytes_per_step();
  };
  EXPECT_EQ(bytes(DType::F32, DType::F32, "f32"), 10 * 28);     // p r+w 8, g 4, m v r+w 16
  EXPECT_EQ(bytes(DType::BF16, DType::BF16, "f32"), 10 * 28);   // master r+w 8, p w 2, g 2, 16
  EXPECT_EQ(bytes(DType::BF16, DType::BF16, "bf16"), 10 * 20);  // 8 + 2 + 2 + 8
  EXPECT_EQ(bytes(DType::F32, DType::F32, "bf16"), 10 * 20);    // 8 + 4 + 8
}

TEST(MixedPrecision, TheBf16ParamIsWrittenButNeverLoaded) {
  Graph g = update_graph({{"type", "adamw"}}, {}, DType::BF16, DType::BF16);
  std::string stmt = engine().lowered_stmt(g);
  // The param's ImageParam is named in<k>_param; it must appear only as an output buffer.
  EXPECT_THAT(stmt, HasSubstr("_master"));
  EXPECT_EQ(stmt.find("_param["), std::string::npos) << stmt;
}

TEST(MixedPrecision, SaveAndLoadResumeBitIdenticallyWithMasterAndBf16State) {
  const size_t n = 257;
  std::vector<float> p0 = representable(gen_floats(41, n), DType::BF16);
  Options cfg = {{"type", "adamw"}};
  Options ov = {{"state_dtype", "bf16"}, {"stochastic_rounding", true}, {"rounding_seed", 3}};
  Trained a = make_run(cfg, p0, DType::BF16, DType::BF16, ov);
  for (int s = 1; s <= 3; ++s) {
    set_grads(a, grads_at(s, n), DType::BF16);
    a.opt->step();
  }
  std::string path = testing::temp_path("mixed_state");
  a.opt->save_state(path);
  Trained b = make_run(cfg, p0, DType::BF16, DType::BF16, ov);
  b.p16 = a.p16;  // the caller restores its params; the optimizer its master and state
  b.opt->load_state(path);
  for (int s = 4; s <= 6; ++s) {
    set_grads(a, grads_at(s, n), DType::BF16);
    set_grads(b, grads_at(s, n), DType::BF16);
    a.opt->step();
    b.opt->step();
  }
  EXPECT_EQ(a.p16, b.p16);
  EXPECT_TRUE(testing::same_bits(*a.opt->state(0, 0, "master"), *b.opt->state(0, 0, "master")));
  EXPECT_EQ(*a.opt->state_bf16(0, 0, "exp_avg_sq"), *b.opt->state_bf16(0, 0, "exp_avg_sq"));

  // Master weights, or stochastic rounding, do not load into a group of f32 params.
  Trained f = make_run(cfg, p0, DType::F32, DType::BF16, {{"state_dtype", "bf16"}});
  EXPECT_THAT(error_of([&] { f.opt->load_state(path); }),
              HasSubstr("stochastic_rounding needs bf16 params, the params are f32"));
  Options no_sr = {{"state_dtype", "bf16"}};
  Trained c = make_run(cfg, p0, DType::BF16, DType::BF16, no_sr);
  set_grads(c, grads_at(1, n), DType::BF16);
  c.opt->step();
  c.opt->save_state(path);
  Trained f2 = make_run(cfg, p0, DType::F32, DType::BF16, no_sr);
  EXPECT_THAT(error_of([&] { f2.opt->load_state(path); }),
              HasSubstr("master weights (for a 16-bit param) but the param here is f32"));
}

TEST(MixedPrecisionErrors, DtypeMismatchesAndBadOptionsAreRejectedAndChangeNothing) {
  std::vector<float> p(8, 1.f), g(8, 0.f);
  std::vector<uint16_t> p16(8), g16(8);
  auto opt = Optimizer::create(engine(), {{"type", "adamw"}});
  TensorRef P{p.data(), 8}, G{g.data(), 8};
  TensorRef P16{p16.data(), 8, {}, DType::BF16}, G16{g16.data(), 8, {}, DType::BF16};
  EXPECT_THAT(error_of([&] {
                opt->add_param_group({{{p.data(), 8, {}, DType::U8}, G}});
              }),
              HasSubstr("param group 0, tensor 0: param dtype u8 is not supported (params and "
                        "grads are f32, bf16, f16 or f64)"));
  EXPECT_THAT(error_of([&] {
                opt->add_param_group({{P, {g.data(), 8, {}, DType::Bool}}});
              }),
              HasSubstr("grad dtype bool is not supported"));
  EXPECT_THAT(error_of([&] {
                opt->add_param_group({{P16, G16, "a"}, {P, G, "b"}});
              }),
              HasSubstr("param group 0, tensor 1 ('b'): param dtype f32 differs from the group's "
                        "bf16"));
  EXPECT_THAT(
      error_of([&] {
        opt->add_param_group({{P, G}}, {{"stochastic_rounding", true}});
      }),
      HasSubstr("param group 0: stochastic_rounding needs bf16 params, the params are f32"));
  EXPECT_THAT(error_of([&] {
                opt->add_param_group({{P16, G}}, {{"state_dtype", "f16"}});
              }),
              HasSubstr("option 'state_dtype' must be \"f32\", \"bf16\" or \"int8\", got \"f16\""));
  EXPECT_THAT(error_of([&] {
                opt->add_param_group({{P16, G}}, {{"rounding_seed", -1}});
              }),
              HasSubstr("option 'rounding_seed' must be an integer in [0, 2^32), got -1"));
  EXPECT_THAT(error_of([&] {
                opt->add_param_group({{P16, {g16.data(), 7, {}, DType::BF16}}});
              }),
              HasSubstr("grad has 7 elements but param has 8"));
  EXPECT_EQ(opt->num_groups(), 0u);

  opt->add_param_group({{P, G}});
  EXPECT_THAT(error_of([&] { opt->set(0, "stochastic_rounding", true); }),
              HasSubstr("stochastic_rounding needs bf16 params"));
  EXPECT_EQ(opt->get(0, "stochastic_rounding"), false);
  EXPECT_THAT(error_of([&] { opt->set_grad(0, 0, G16); }),
              HasSubstr("the new grad's dtype bf16 differs from the group's grad dtype f32"));
  EXPECT_THAT(error_of([] {
                Optimizer::create(engine(), {{"type", "sgd"}, {"state_dtype", 2}});
              }),
              HasSubstr("option 'state_dtype' must be like \"f32\""));
}

TEST(MixedPrecisionCApi, TypedGroupsAndBadDtypeCodes) {
  optfuse_engine* e = nullptr;
  ASSERT_EQ(optfuse_engine_create("host", 0, &e), OPTFUSE_OK);
  optfuse_optimizer* o = nullptr;
  ASSERT_EQ(optfuse_optimizer_create(e, "{\"type\":\"adamw\",\"lr\":0.01}", &o), OPTFUSE_OK);
  std::vector<float> p0 = representable(gen_floats(2, 64), DType::BF16);
  std::vector<uint16_t> p = to_bf16(p0), g = to_bf16(grads_at(1, 64));
  void* ps[] = {p.data()};
  void* gs[] = {g.data()};
  int64_t numels[] = {64};
  EXPECT_EQ(optfuse_optimizer_add_group_typed(o, 1, ps, static_cast<optfuse_dtype>(7), gs,
                                              OPTFUSE_BF16, numels, nullptr, nullptr, nullptr),
            OPTFUSE_ERR_INVALID);
  EXPECT_THAT(optfuse_last_error(), HasSubstr("param dtype code 7 is not one of OPTFUSE_F32"));
  ASSERT_EQ(optfuse_optimizer_add_group_typed(o, 1, ps, OPTFUSE_BF16, gs, OPTFUSE_BF16, numels,
                                              nullptr, nullptr, "{\"state_dtype\":\"bf16\"}"),
            OPTFUSE_OK);
  ASSERT_EQ(optfuse_optimizer_step(o), OPTFUSE_OK);
  // The same as the C++ API: a bf16 param moved by one AdamW step (lr 0.01 -> ~1 bf16 ulp or more).
  Trained cpp = make_run({{"type", "adamw"}, {"lr", 0.01}}, p0, DType::BF16, DType::BF16,
                         {{"state_dtype", "bf16"}});
  set_grads(cpp, grads_at(1, 64), DType::BF16);
  cpp.opt->step();
  EXPECT_EQ(p, cpp.p16);
  EXPECT_EQ(optfuse_optimizer_set_grad_typed(o, 0, 0, g.data(), OPTFUSE_F16, 64),
            OPTFUSE_ERR_INVALID);
  EXPECT_THAT(optfuse_last_error(), HasSubstr("differs from the group's grad dtype bf16"));
  optfuse_optimizer_destroy(o);
  optfuse_engine_destroy(e);
}

}  // namespace
}  // namespace optfuse
