// Muon: its Newton-Schulz orthogonalization (the opaque op between its two kernels, through a
// CBLAS library) against an independent bf16 reference written here, and whole steps against a
// double reference of torch.optim.Muon's element-wise parts around that reference.
//
// Tolerances: the orthogonalization's in expect_close_ns (bf16 rounding, carried through the
// iterations). A step is compared from optfuse's state before it, so steps do not compound: the
// momentum buffer is an f32 lerp of f32 values, within 4 f32 ulps of its largest value; the
// orthogonalized update the step applied, recovered from the param's move, within the bf16
// bounds plus the f32 roundings of the decay and the add. Wiring errors (a transposed or sliced
// matrix, a wrong lr adjustment or momentum) are off by O(1) of the update.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "optfuse/optim.h"
#include "optfuse/partition.h"
#include "optim/newton_schulz.h"
#include "support/engine.h"
#include "support/optim_util.h"

namespace optfuse {
namespace {

using testing::error_of;
using testing::gen_floats;
using ::testing::HasSubstr;

// ---- the independent reference ------------------------------------------------------------

float bf16(double x) {  // round to nearest even, through f32 (exact for the values used here)
  float f = static_cast<float>(x);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&f, &u, 4);
  return f;
}

using Matrix = std::vector<double>;  // row-major

// torch's _zeropower_via_newtonschulz, naive double products rounded to bf16.
std::vector<float> reference_ns(const std::vector<float>& g, int64_t rows, int64_t cols,
                                const NewtonSchulz& ns) {
  const bool tall = rows > cols;
  const int64_t m = tall ? cols : rows, n = tall ? rows : cols;
  Matrix x(static_cast<size_t>(m * n));
  double sq = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      x[i * n + j] = bf16(g[tall ? j * cols + i : i * cols + j]);
      sq += x[i * n + j] * x[i * n + j];
    }
  const double norm = bf16(std::max<double>(bf16(std::sqrt(sq)), float(ns.eps)));
  for (double& v : x) v = bf16(float(v) / float(norm));
  auto mul = [](const Matrix& a, const Matrix& b, int64_t p, int64_t q, int64_t r, bool bt) {
    Matrix y(static_cast<size_t>(p * r), 0.0);  // a: p x q; b: q x r (bt: r x q)
    for (int64_t i = 0; i < p; ++i)
      for (int64_t k = 0; k < r; ++k)
        for (int64_t j = 0; j < q; ++j)
          y[i * r + k] += a[i * q + j] * (bt ? b[k * q + j] : b[j * r + k]);
    return y;
  };
  for (int s = 0; s < ns.steps; ++s) {
    Matrix a = mul(x, x, m, n, m, true);
    for (double& v : a) v = bf16(v);
    Matrix aa = mul(a, a, m, m, m, false), b(a.size());
    for (size_t i = 0; i < b.size(); ++i) b[i] = bf16(float(ns.b) * a[i] + float(ns.c) * aa[i]);
    Matrix bx = mul(b, x, m, m, n, false);
    for (size_t i = 0; i < x.size(); ++i) x[i] = bf16(float(ns.a) * x[i] + bx[i]);
  }
  std::vector<float> out(g.size());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) out[tall ? j * cols + i : i * cols + j] = float(x[i * n + j]);
  return out;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

// The orthogonalizations agree within bf16 rounding: a product near a bf16 midpoint may round the
// other way when the sums run in another order, and the quintic carries that on through the
// iterations. Measured on 200 x 300 and 768 x 768 gaussian matrices: 30% of the elements equal,
// the rest mostly one bf16 ulp off, |got - ref|_F = 0.65-0.72% of |ref|_F, the worst element 4-6
// ulps of the largest. Bounds: |got - ref|_F <= 2^-5 |ref|_F (4x the measured) and each element
// within 2^-4 of the largest (16 ulps of it). A transposed, sliced or mis-scaled matrix is off by
// O(|ref|). `slack`: more per element, for a `got` recovered from an f32 param step.
void expect_close_ns(const std::vector<float>& got, const std::vector<float>& ref,
                     const std::string& what, double slack = 0) {
  double d2 = 0, r2 = 0;
  const double worst = std::ldexp(max_abs(ref), -4) + slack;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = double(got[i]) - ref[i];
    d2 += d * d;
    r2 += double(ref[i]) * ref[i];
    ASSERT_LE(std::fabs(d), worst) << what << ", element " << i;
  }
  EXPECT_LE(std::sqrt(d2), std::ldexp(std::sqrt(r2), -5) + slack * std::sqrt(double(ref.size())))
      << what;
}

// ---- the callee -----------------------------------------------------------------------------

TEST(Muon, CalleeRoundTripsAndBadOnesAreNamed) {
  for (bool f32 : {false, true}) {
    NewtonSchulz ns{3.5, -4.25, 2.0, 7, 1e-9, f32};
    const NewtonSchulz back = parse_newton_schulz(newton_schulz_callee(ns));
    EXPECT_EQ(back.a, ns.a);
    EXPECT_EQ(back.b, ns.b);
    EXPECT_EQ(back.c, ns.c);
    EXPECT_EQ(back.steps, ns.steps);
    EXPECT_EQ(back.eps, ns.eps);
    EXPECT_EQ(back.f32_products, f32);
  }
  auto error = [](const char* args) {
    return error_of([&] { parse_newton_schulz(std::string("newton_schulz:") + args); });
  };
  EXPECT_THAT(error("a=1,b=2,c=3,steps=5,products=f32"), HasSubstr("'eps' is missing"));
  EXPECT_THAT(error("a=1,b=2,c=3,steps=2.5,eps=0,products=f32"),
              HasSubstr("steps must be a whole number below 100"));
  EXPECT_THAT(error("a=x,b=2,c=3,steps=5,eps=0,products=f32"),
              HasSubstr("'a' is not a finite number"));
  EXPECT_THAT(error("a=1,b=2,c=3,steps=5,eps=0,products=f16"),
              HasSubstr("products must be bf16 or f32"));
  EXPECT_THAT(error("a=1,b=2,c=3,steps=5,eps=0,products=f32,d=1"),
              HasSubstr("unknown constant 'd'"));
  EXPECT_THAT(error("a=1,a=2"), HasSubstr("'a' given twice"));
}

// The update is two kernels around the orthogonalization, whatever the options: the momentum
// buffer and the Nesterov blend before it, the decay and the update after it.
TEST(Muon, TheUpdateIsTwoKernelsAroundTheOrthogonalization) {
  using K = Cluster::Kind;
  for (const Options& extra : {Options::object(), Options{{"nesterov", false}},
                               Options{{"weight_decay", 0.0}, {"momentum", 0.5}}}) {
    Options config = extra;
    config["type"] = "muon";
    const Partition p = partition(update_graph(config));
    std::vector<K> kinds;
    for (const Cluster& c : p.clusters) kinds.push_back(c.kind);
    EXPECT_EQ(kinds, (std::vector<K>{K::Kernel, K::Opaque, K::Kernel})) << config.dump();
  }
}

// ---- the orthogonalization ------------------------------------------------------------------

TEST(Muon, NewtonSchulzThroughCblasMatchesTheReference) {
  const NewtonSchulz ns;
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{20, 48}, {48, 20}, {33, 33}, {1, 9}, {200, 300}, {300, 200}}) {
    const std::vector<float> g = gen_floats(7, static_cast<size_t>(rows * cols), 0.01);
    std::vector<float> got(g.size());
    optim::newton_schulz_bf16(ns, optim::cblas_gemm(), g.data(), got.data(), rows, cols);
    expect_close_ns(got, reference_ns(g, rows, cols, ns),
                    std::to_string(rows) + "x" + std::to_string(cols));
  }
}

// ---- whole steps ----------------------------------------------------------------------------

struct Config {
  double lr, weight_decay, momentum;
  bool nesterov;
  const char* adjust;  // nullptr: torch's None
};

double adjusted(const Config& c, double a, double b) {
  const std::string fn = c.adjust ? c.adjust : "original";
  if (fn == "match_rms_adamw") return c.lr * 0.2 * std::sqrt(std::max(a, b));
  if (fn == "spectral_unclamped") return c.lr * std::sqrt(a / b);
  return c.lr * std::sqrt(std::max(1.0, a / b));
}

// torch's lerp with a float32 weight.
double lerp(double start, double end, double weight) {
  const double w = static_cast<float>(weight);
  return std::fabs(w) < 0.5 ? start + w * (end - start) : end + (w - 1) * (end - start);
}

class MuonSteps : public ::testing::TestWithParam<Config> {};

TEST_P(MuonSteps, MatchTheReference) {
  const Config c = GetParam();
  // [300, 200] is larger than one task of the step's round (a sliced call would see parts of the
  // matrix), [20, 48] is wide, [48, 20] tall, [64] a vector (the 1 x 64 matrix).
  const std::vector<std::vector<int64_t>> shapes = {{300, 200}, {20, 48}, {48, 20}, {64}};
  std::vector<std::vector<float>> p, g(shapes.size());
  std::vector<ParamRef> refs;
  for (size_t t = 0; t < shapes.size(); ++t) {
    int64_t n = 1;
    for (int64_t d : shapes[t]) n *= d;
    p.push_back(gen_floats(100 + t, static_cast<size_t>(n), 0.05));
    g[t].resize(p[t].size());
  }
  for (size_t t = 0; t < shapes.size(); ++t)
    refs.push_back({{p[t].data(), static_cast<int64_t>(p[t].size()), shapes[t]},
                    {g[t].data(), static_cast<int64_t>(g[t].size()), shapes[t]},
                    "w" + std::to_string(t)});
  Options config = {{"type", "muon"},
                    {"lr", c.lr},
                    {"weight_decay", c.weight_decay},
                    {"momentum", c.momentum},
                    {"nesterov", c.nesterov},
                    {"adjust_lr_fn", nullptr}};
  if (c.adjust) config["adjust_lr_fn"] = c.adjust;
  auto opt = Optimizer::create(testing::shared_engine(), config);
  opt->add_param_group(refs);
  const NewtonSchulz ns;
  std::vector<std::vector<float>> buffers(shapes.size());
  for (size_t t = 0; t < shapes.size(); ++t) buffers[t].assign(p[t].size(), 0.0f);
  for (int step = 1; step <= 3; ++step) {
    for (size_t t = 0; t < shapes.size(); ++t) {  // (in place: the optimizer holds the address)
      const std::vector<float> grad = gen_floats(200 + 10 * step + t, g[t].size(), 0.01);
      std::copy(grad.begin(), grad.end(), g[t].begin());
    }
    const std::vector<std::vector<float>> before = p;
    opt->step();
    // The reference takes one step from optfuse's state before it, so steps do not compound.
    for (size_t t = 0; t < shapes.size(); ++t) {
      const std::string what = "tensor " + std::to_string(t) + ", step " + std::to_string(step);
      const int64_t rows = shapes[t].size() > 1 ? shapes[t][0] : 1;
      const int64_t cols = static_cast<int64_t>(p[t].size()) / rows;
      std::vector<float> u(p[t].size());
      std::vector<double> b_ref(u.size());
      double b_max = 0;
      for (size_t i = 0; i < u.size(); ++i) {
        b_ref[i] = float(lerp(buffers[t][i], g[t][i], 1.0 - c.momentum));
        u[i] = float(c.nesterov ? lerp(g[t][i], b_ref[i], c.momentum) : b_ref[i]);
        b_max = std::max(b_max, std::fabs(b_ref[i]));
      }
      buffers[t] = opt->state_values(0, t, "momentum_buffer");
      for (size_t i = 0; i < u.size(); ++i)
        ASSERT_LE(std::fabs(buffers[t][i] - b_ref[i]), 4 * std::ldexp(b_max, -24))
            << "momentum_buffer of " << what << ", element " << i;
      const std::vector<float> o = reference_ns(u, rows, cols, ns);
      const double lr_adj = adjusted(c, double(rows), double(cols));
      // The orthogonalized update the step applied, from the param's move: within the f32
      // roundings of the decay and the add (2 ulps of the param each), divided by adjusted_lr.
      std::vector<float> o_got(u.size());
      double p_max = 0;
      for (size_t i = 0; i < u.size(); ++i) {
        const double decayed = double(before[t][i]) * float(1 - c.lr * c.weight_decay);
        o_got[i] = float((decayed - p[t][i]) / lr_adj);
        p_max = std::max(p_max, std::fabs(double(before[t][i])));
      }
      expect_close_ns(o_got, o, what, 4 * std::ldexp(p_max, -24) / lr_adj);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, MuonSteps,
                         ::testing::Values(Config{0.02, 0.1, 0.95, true, nullptr},
                                           Config{0.01, 0.0, 0.3, false, "match_rms_adamw"},
                                           Config{0.02, 0.01, 0.9, true, "spectral_unclamped"}));

// ---- the opaque op's seam and the errors ----------------------------------------------------

TEST(Muon, AnImplementationRegisteredFirstServesEveryWholeMatrix) {
  Engine engine(testing::memory_only());
  std::mutex mutex;
  std::vector<std::pair<int64_t, int64_t>> calls;  // (n, cols)
  engine.register_opaque(
      "newton_schulz",
      [&](const OpaqueCall& call) {
        EXPECT_EQ(parse_newton_schulz(call.callee).steps, 3);
        std::lock_guard<std::mutex> lock(mutex);
        calls.emplace_back(call.n, call.cols);
        std::memset(call.out, 0, static_cast<size_t>(call.n) * sizeof(float));
      },
      OpaqueScope::Matrix);
  std::vector<float> p(300 * 200, 1.0f), g(p.size(), 0.5f), q(12, 1.0f), h(12, 0.5f);
  auto opt = Optimizer::create(engine, {{"type", "muon"}, {"ns_steps", 3}, {"lr", 0.1}});
  opt->add_param_group({{{p.data(), 60000, {300, 200}}, {g.data(), 60000}, "w"},
                        {{q.data(), 12, {3, 4}}, {h.data(), 12}, "v"}});
  opt->step();
  std::sort(calls.begin(), calls.end());
  EXPECT_EQ(calls, (std::vector<std::pair<int64_t, int64_t>>{{12, 4}, {60000, 200}}));
  EXPECT_EQ(p[0], 1.0f - 0.1f * 0.1f);  // the decay alone: the update was zero
}

TEST(Muon, OptionsAreCheckedInTorchsWords) {
  auto msg = [](const Options& o) {
    return error_of([&] { Optimizer::create(testing::shared_engine(), o); });
  };
  EXPECT_THAT(msg({{"type", "muon"}, {"lr", -1.0}}),
              HasSubstr("Learning rate should be >= 0 but is: -1.0"));
  EXPECT_THAT(msg({{"type", "muon"}, {"momentum", -0.5}}),
              HasSubstr("momentum should be >= 0 but is: -0.5"));
  EXPECT_THAT(msg({{"type", "muon"}, {"weight_decay", -0.5}}),
              HasSubstr("weight decay should be >= 0 but is: -0.5"));
  EXPECT_THAT(msg({{"type", "muon"}, {"adjust_lr_fn", "bogus"}}),
              HasSubstr("Adjust learning rate function \"bogus\" is not supported"));
  EXPECT_THAT(msg({{"type", "muon"}, {"ns_steps", 100}}),
              HasSubstr("Number of steps must be less than 100 for computational efficiency"));
  EXPECT_THAT(msg({{"type", "muon"}, {"ns_coefficients", {1.0, 2.0}}}),
              HasSubstr("Coefficients must be a tuple of exactly 3 values"));
  std::vector<float> p(64, 1.0f), g(64, 0.5f);
  auto opt = Optimizer::create(testing::shared_engine(), {{"type", "muon"}});
  EXPECT_THAT(error_of([&] {
                opt->add_param_group({{{p.data(), 64, {8, 8}}, {g.data(), 64}, "w"}},
                                     {{"state_dtype", "int8"}, {"min_8bit_size", 1}});
                opt->step();
              }),
              HasSubstr("calls opaque op \"newton_schulz:"));
}

}  // namespace
}  // namespace optfuse
