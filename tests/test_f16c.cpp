// f16 <-> f32 conversions on x86 with F16C (src/lower/f16c.h): one vcvtph2ps / vcvtps2ph each
// instead of Halide 14's integer emulation, with the same IEEE results.
//
// Oracle: GCC's _Float16 conversions in this file, built for baseline x86-64 (no F16C), so they
// are libgcc's software routines, not the instructions under test. Bit-exact: both directions are
// exactly rounded (widening is exact; narrowing rounds to nearest even), so there is nothing to
// tolerate; NaNs only need to stay NaNs (payloads are not specified across implementations).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "jit/halide_bridge.h"
#include "optfuse/optfuse.hpp"
#include "support/engine.h"
#include "support/gen.h"
#include "support/objdump.h"
#include "support/round_trip.h"

namespace optfuse {
namespace {

float widen(uint16_t bits) {
  _Float16 h;
  std::memcpy(&h, &bits, 2);
  return static_cast<float>(h);
}

uint16_t narrow(float x) {
  const _Float16 h = static_cast<_Float16>(x);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

bool f16_is_nan(uint16_t b) { return (b & 0x7c00) == 0x7c00 && (b & 0x03ff) != 0; }

// f32 values whose f16 rounding is delicate: zeros, the subnormal range and its edges, ties to
// even, the largest finite f16 and the first values that overflow, infinities, NaN.
std::vector<float> edge_values() {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          65504.0f,
                          -65504.0f,
                          65519.99f,
                          65520.0f,
                          -65520.0f,
                          1e6f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          1.0f + 1.0f / 2048,
                          1.0f + 3.0f / 2048,
                          1.0f + 1.0f / 4096,
                          std::ldexp(1.0f, -24),
                          std::ldexp(1.0f, -25),
                          std::ldexp(1.5f, -25),
                          std::ldexp(1.0f, -26),
                          std::ldexp(1.0f, -14),
                          std::ldexp(1023.0f / 1024, -14),
                          std::ldexp(1.0f, -15) * 1.5f,
                          1e-10f,
                          -1e-10f,
                          std::numeric_limits<float>::denorm_min()};
  for (int e = -30; e <= 17; ++e)  // every binade the f16 range touches, ties and near-ties
    for (float m : {1.0f, 1.0009765625f, 1.00048828125f, 1.00048828125f + 1e-7f, 1.9995117f})
      v.push_back(std::ldexp(m, e)), v.push_back(-std::ldexp(m, e));
  return v;
}

TEST(F16c, ConversionsMatchSoftwareIeeeBitForBit) {
  auto k = testing::shared_engine().kernel(testing::round_trip(DType::F16));
  // Every f16 bit pattern, plus a ragged tail, so vector bodies and the tail both run.
  const int64_t n = 65536 + 37;
  std::vector<uint16_t> param(n);
  std::vector<float> x(n);
  const std::vector<float> edges = edge_values();
  for (int64_t i = 0; i < n; ++i) {
    param[i] = static_cast<uint16_t>(i & 0xffff);
    const double random = testing::gen(7, uint64_t(i)) * std::ldexp(1.0, int(i % 40) - 25);
    x[i] = i % 3 == 0 ? edges[size_t(i / 3) % edges.size()] : static_cast<float>(random);
  }
  const std::vector<uint16_t> param0 = param;
  const std::vector<float> x0 = x;
  KernelCall call;
  for (const auto& in : k->signature().inputs)
    call.inputs.push_back(in.role == Role::Param ? static_cast<void*>(param.data()) : x.data());
  for (const auto& out : k->signature().outputs)
    call.outputs.push_back(out.replaces == "param" ? static_cast<void*>(param.data()) : x.data());
  call.n = n;
  k->run(call);
  int64_t bad = 0;
  for (int64_t i = 0; i < n && bad < 10; ++i) {
    const float want_x = widen(param0[i]);
    const bool x_ok = std::isnan(want_x) ? std::isnan(x[i]) : std::memcmp(&want_x, &x[i], 4) == 0;
    const uint16_t want_p = narrow(x0[i]);
    const bool p_ok = f16_is_nan(want_p) ? f16_is_nan(param[i]) : want_p == param[i];
    if (!x_ok || !p_ok) {
      ++bad;
      ADD_FAILURE() << "element " << i << ": f32(f16 0x" << std::hex << param0[i] << ") = " << x[i]
                    << ", want " << want_x << "; f16(" << x0[i] << ") = 0x" << param[i]
                    << ", want 0x" << want_p << std::dec;
    }
  }
}

TEST(F16c, ObjectCodeConvertsWithSingleInstructions) {
  const std::string avx2 = "x86-64-linux-avx-avx2-f16c-fma-sse41";
  const Graph g = canonicalize(testing::round_trip(DType::F16));
  const std::string with = testing::disassemble(
      jit::compile_kernel_object(g, jit::resolve_schedule(Schedule(), avx2), avx2, "k"));
  if (with.empty()) GTEST_SKIP() << "no objdump";
  EXPECT_GE(testing::occurrences(with, "vcvtph2ps"), 1u);
  EXPECT_GE(testing::occurrences(with, "vcvtps2ph"), 1u);
  // Without F16C the pass stays out and Halide's emulation remains (and still works).
  const std::string no_f16c = "x86-64-linux-avx-avx2-fma-sse41";
  const std::string without = testing::disassemble(
      jit::compile_kernel_object(g, jit::resolve_schedule(Schedule(), no_f16c), no_f16c, "k"));
  EXPECT_EQ(testing::occurrences(without, "vcvtph2ps"), 0u);
  EXPECT_EQ(testing::occurrences(without, "vcvtps2ph"), 0u);
}

}  // namespace
}  // namespace optfuse
