// x / c for a per-step scalar c as one multiply-add where the host proved it exact
// (src/optim/exact_division.h), and the kernel that branches on that proof (a select on a bool
// scalar, compiled as one loop per value: src/lower/schedule.h).
//
// Oracle: f32 division (IEEE: correctly rounded), over every significand of x in [1, 2), which
// stands for every binade the Adam graphs divide (the proof scales by powers of two). Bit-exact:
// where `exact` is claimed, the multiply-add must be the correctly rounded quotient, so any
// differing bit is a wrong claim; where it is not claimed, a significand where it differs must
// exist (the check is not merely cautious).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "optfuse/optfuse.hpp"
#include "optim/exact_division.h"
#include "support/engine.h"
#include "support/gen.h"

namespace optfuse {
namespace {

using optim::ScalarReciprocal;
using optim::split_reciprocal;

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

// torch's AdamW divisor at `step`: sqrt(1 - beta2^step) in double, rounded to f32 (as the
// kernel's f32 scalar is).
float divisor(double beta2, int step) {
  return static_cast<float>(std::sqrt(1.0 - std::pow(beta2, step)));
}

// The significands X * 2^-23 of [1, 2) (times 2^scale) where either form differs from x / c.
int64_t failures(float c, const ScalarReciprocal& r, int scale = 0) {
  int64_t bad = 0;
  for (uint32_t X = 1u << 23; X < (1u << 24); ++X) {
    const float x = std::ldexp(static_cast<float>(X), scale - 23), q = x / c;
    bad += bits(optim::divide_by_fma(x, r)) != bits(q) ||
           bits(optim::divide_by_f64_sum(x, r)) != bits(q);
  }
  return bad;
}

TEST(SplitReciprocal, ClaimHoldsForEverySignificandAndIsNotMerelyCautious) {
  // Steps 51, 52 and 126 of torch's default beta2 are divisors the check rejects; powers of two
  // (1 = late steps) are exact by construction.
  std::vector<float> cs = {divisor(0.999, 1),
                           divisor(0.999, 10),
                           divisor(0.999, 51),
                           divisor(0.999, 52),
                           divisor(0.999, 126),
                           divisor(0.999, 5000),
                           divisor(0.95, 1),
                           divisor(0.99, 6),
                           1.0f,
                           0.5f,
                           0x1p-5f};
  for (uint64_t i = 0; i < 10; ++i)  // (0.03, 1]: sqrt(1 - beta2) for beta2 up to 0.999
    cs.push_back(static_cast<float>(0.03 + 0.97 * std::abs(testing::gen(77, i))));
  // Significands with 3 and 4 trailing zeros, where T = +-8, +-16 are the only candidates: the
  // edge of the bound.
  for (int zeros : {3, 4})
    for (uint32_t odd : {0xabcdefu, 0x9e3779u})
      cs.push_back(std::ldexp(static_cast<float>((odd >> zeros | 1u) << zeros), -25));
  int claimed = 0, rejected = 0;
  for (float c : cs) {
    const ScalarReciprocal r = split_reciprocal(c);
    const int64_t bad = failures(c, r);
    if (r.exact) {
      ++claimed;
      EXPECT_EQ(bad, 0) << "c = " << std::hexfloat << c << ": claimed exact";
      EXPECT_GT(r.lo, 0.0f) << std::hexfloat << c;
    } else {
      ++rejected;
      EXPECT_GT(bad, 0) << "c = " << std::hexfloat << c << ": rejected, yet no x differs";
    }
  }
  EXPECT_GE(claimed, 8);
  EXPECT_GE(rejected, 3);  // steps 51, 52, 126 at least
}

TEST(SplitReciprocal, ZeroInfinityNanAndTheSmallestAndLargestBinades) {
  const float c = divisor(0.999, 10);
  const ScalarReciprocal r = split_reciprocal(c);
  ASSERT_TRUE(r.exact);
  const float inf = std::numeric_limits<float>::infinity();
  float nan_payload;
  const uint32_t payload = 0xffc01234u;  // negative quiet NaN with a payload
  std::memcpy(&nan_payload, &payload, 4);
  for (float x : {0.0f, -0.0f, inf, std::sqrt(-1.0f), nan_payload,
                  std::sqrt(std::numeric_limits<float>::denorm_min())}) {
    EXPECT_EQ(bits(optim::divide_by_fma(x, r)), bits(x / c)) << x;
    EXPECT_EQ(bits(optim::divide_by_f64_sum(x, r)), bits(x / c)) << x;
  }
  // The square roots of f32 values reach down to 2^-75; x * lo stays normal there.
  EXPECT_EQ(failures(c, r, -75), 0);
  // The top binade, where x / c overflows to infinity for most x.
  EXPECT_EQ(failures(c, r, 127), 0);
}

TEST(SplitReciprocal, DivisorsOutsideTheProofAreNotExact) {
  for (float c : {0.0f, -0.5f, 1.5f, std::numeric_limits<float>::quiet_NaN(),
                  std::numeric_limits<float>::infinity(), 0x1p-70f})
    EXPECT_FALSE(split_reciprocal(c).exact) << c;
}

// select(exact, fma(x, hi, x * lo), x / c) + eps as the Adam graphs write it (the sum strict:
// LLVM would re-associate eps into the multiply-add, src/optim/adam.cpp).
Graph scaled() {
  Graph g("scaled_by_fma_or_divide");
  Value x = g.param("param");
  Value by_fma = cast(cast(x, DType::F64) * cast(g.scalar("hi"), DType::F64) +
                          cast(strict(x * g.scalar("lo")), DType::F64),
                      DType::F32);
  Value q = select(g.scalar("exact", DType::Bool), by_fma, x / g.scalar("c"));
  g.output("param", strict(q + g.scalar("eps")));
  return g;
}

constexpr float kEps = 1e-8f;

// Runs the kernel over every significand of [1, 2) plus the special values, with `exact` as
// given (not necessarily true), on `n` of them (one task: the streaming loop) or all.
std::vector<float> run(const Kernel& k, float c, const ScalarReciprocal& r, bool exact,
                       const std::vector<float>& x, bool serial, int64_t cols = 0) {
  std::vector<float> p = x;
  KernelCall call;
  call.inputs.push_back(p.data());
  call.outputs.push_back(p.data());
  for (const auto& s : k.signature().scalars)
    call.scalars.push_back(s.name == "hi"    ? r.hi
                           : s.name == "lo"  ? r.lo
                           : s.name == "c"   ? c
                           : s.name == "eps" ? kEps
                                             : (exact ? 1.0 : 0.0));
  call.n = static_cast<int64_t>(p.size());
  call.cols = cols;
  call.serial = serial;
  k.run(call);
  return p;
}

// On x86 with FMA the multiply-add is one FMA; without, f32(f64(x) * hi + f64(x * lo)), the f64
// sum rounded twice (the host proves both). Both targets run on this machine.
class ExactDivision : public ::testing::TestWithParam<bool> {};

TEST_P(ExactDivision, EachLoopOfTheKernelComputesItsCase) {
  const bool fma = GetParam();
  EngineOptions options;
  options.target = fma ? "host" : "x86-64-linux-sse41";
  Engine engine(options);
  auto k = engine.kernel(scaled());
  auto model = fma ? optim::divide_by_fma : optim::divide_by_f64_sum;
  std::vector<float> x;
  for (uint32_t X = 1u << 23; X < (1u << 24); ++X)
    x.push_back(std::ldexp(static_cast<float>(X), -23));
  for (float s : {0.0f, std::numeric_limits<float>::infinity(), std::sqrt(-1.0f), 3e-23f})
    x.push_back(s);                                 // in the ragged last vector
  std::vector<float> few(x.end() - 1000, x.end());  // one task: the streaming loop
  for (int step : {10, 51}) {                       // exact, then not
    const float c = divisor(0.999, step);
    const ScalarReciprocal r = split_reciprocal(c);
    ASSERT_EQ(r.exact, step == 10);
    for (const std::vector<float>* in : {&x, &few}) {
      for (bool serial : {false, true}) {
        for (bool exact : {false, true}) {
          const std::vector<float> got = run(*k, c, r, exact, *in, serial);
          int64_t bad = 0, differ = 0;
          for (size_t i = 0; i < in->size(); ++i) {
            const float v = (*in)[i], want = (exact ? model(v, r) : v / c) + kEps;
            bad += bits(got[i]) != bits(want);
            differ += bits(want) != bits(v / c + kEps);
          }
          EXPECT_EQ(bad, 0) << "step " << step << ", " << in->size() << " elements, serial "
                            << serial << ", exact " << exact;
          // Where the proof fails, the forced multiply-add loop really is another computation.
          if (step == 51 && exact && in == &x) EXPECT_GT(differ, 0);
        }
      }
    }
  }
}

// The per-row schedule (the Adam graphs' grad_centralization form) gets the loops too: the
// divided value is x - row_min(x) (exact in the reference: a minimum, then one f32 subtract).
TEST(ExactDivisionRows, EachLoopOfThePerRowKernelComputesItsCase) {
  Graph g("scaled_rows");
  Value param = g.param("param");
  Value r = param - row_min(param);
  Value by_fma = cast(cast(r, DType::F64) * cast(g.scalar("hi"), DType::F64) +
                          cast(strict(r * g.scalar("lo")), DType::F64),
                      DType::F32);
  Value q = select(g.scalar("exact", DType::Bool), by_fma, r / g.scalar("c"));
  g.output("param", strict(q + g.scalar("eps")));
  auto k = testing::shared_engine().kernel(g);
  ASSERT_TRUE(k->signature().per_row);
  const int64_t cols = 1000, rows = 4099;  // rows of several vectors and a ragged one
  std::vector<float> x(static_cast<size_t>(cols * rows));
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = 1.0f + static_cast<float>(std::abs(testing::gen(91, i)));
  const std::string stmt = testing::shared_engine().lowered_stmt(g);
  EXPECT_NE(stmt.find("if ((uint1)"), std::string::npos);
  for (int step : {10, 51}) {
    const float c = divisor(0.999, step);
    const ScalarReciprocal rec = split_reciprocal(c);
    for (bool exact : {false, true}) {
      std::vector<float> p = run(*k, c, rec, exact, x, false, cols);
      int64_t bad = 0;
      for (int64_t row = 0; row < rows; ++row) {
        const float* in = &x[static_cast<size_t>(row * cols)];
        const float m = *std::min_element(in, in + cols);
        for (int64_t j = 0; j < cols; ++j) {
          const float d = in[j] - m;
          const float want = (exact ? optim::divide_by_fma(d, rec) : d / c) + kEps;
          bad += bits(p[static_cast<size_t>(row * cols + j)]) != bits(want);
        }
      }
      EXPECT_EQ(bad, 0) << "step " << step << ", exact " << exact;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, ExactDivision, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "Fma" : "NoFma"; });

// No loop reads the flag: each of the CPU schedule's two loops (parallel tasks; one task on the
// calling thread, streaming) is compiled once per value of it, where the select has a constant
// condition (inside strict_float Halide leaves it, and LLVM drops the other operand: the
// multiply-add loops have no divide, which is what makes them faster, src/lower/README.md).
TEST(ExactDivisionLoops, TheFlagChoosesBetweenLoopsNotLanes) {
  const std::string stmt = testing::shared_engine().lowered_stmt(scaled());
  size_t branches = 0;
  for (size_t at = stmt.find("if ((uint1)"); at != std::string::npos;
       at = stmt.find("if ((uint1)", at + 1))
    branches += stmt.compare(stmt.find(')', at + 11) - 6, 6, "_exact") == 0;
  EXPECT_EQ(branches, 2u) << stmt;
  const size_t flag = stmt.find("_exact"), param_start = stmt.rfind('s', flag);
  const std::string name = stmt.substr(param_start, flag + 6 - param_start);  // "s2_exact"
  EXPECT_EQ(stmt.find("select((uint1)" + name), std::string::npos) << stmt;
}

}  // namespace
}  // namespace optfuse
