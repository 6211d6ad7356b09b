// f32 multiply-adds written through f64, f32(f64(a) * f64(b) + f64(c)), compiled as one FMA, and
// f32 square roots as one whole-vector sqrt, on x86 targets with FMA (src/lower/fma.h).
//
// Oracle: std::fma on f32 (one rounding of the exact a * b + c). The f64 form rounds twice, so
// the two differ where the f64 sum is an f32 tie the exact sum is not; the crafted triple below
// is such a case, so a kernel that still went through f64 fails on it. std::sqrt for the square
// root (IEEE: correctly rounded). Bit-exact: the vector body and the scalar tail must both give
// the oracle's bits.
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

namespace optfuse {
namespace {

// param' = f32(f64(param) * f64(grad) + f64(m))
Graph multiply_add() {
  Graph g("fma_through_f64");
  Value a = g.param("param"), b = g.grad("grad"), c = g.state("m");
  g.output("param",
           cast(cast(a, DType::F64) * cast(b, DType::F64) + cast(c, DType::F64), DType::F32));
  return g;
}

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

TEST(Fma, KernelGivesTheOnceRoundedMultiplyAdd) {
  auto k = testing::shared_engine().kernel(multiply_add());
  const int64_t n = 4096 + 37;  // vector body and a partial last vector
  std::vector<float> a(n), b(n), c(n);
  for (int64_t i = 0; i < n; ++i) {
    a[i] = static_cast<float>(testing::gen(1, uint64_t(i)) * 4.0);
    b[i] = static_cast<float>(testing::gen(2, uint64_t(i)) * 4.0);
    c[i] = static_cast<float>(testing::gen(3, uint64_t(i)) * 8.0);
  }
  // (1 + 2^-12)(1 + 2^-12 + 2^-23) - (2^-35 + 2^-58) = 1 + 2^-11 + 2^-23 + 2^-24 - 2^-58: just
  // below an f32 tie, which the f64 sum rounds onto (and then up, to even).
  for (int64_t i : {int64_t{5}, n - 1}) {
    a[i] = 1.0f + std::ldexp(1.0f, -12);
    b[i] = 1.0f + std::ldexp(1.0f, -12) + std::ldexp(1.0f, -23);
    c[i] = -(std::ldexp(1.0f, -35) + std::ldexp(1.0f, -58));
  }
  ASSERT_NE(bits(std::fma(a[5], b[5], c[5])),
            bits(static_cast<float>(double(a[5]) * double(b[5]) + double(c[5]))));
  std::vector<float> p = a;
  KernelCall call;
  for (const auto& in : k->signature().inputs)
    call.inputs.push_back(in.name == "param" ? p.data() : in.name == "grad" ? b.data() : c.data());
  call.outputs.push_back(p.data());
  call.n = n;
  k->run(call);
  int64_t bad = 0;
  for (int64_t i = 0; i < n && bad < 10; ++i) {
    const float want = std::fma(a[i], b[i], c[i]);
    if (bits(p[i]) != bits(want)) {
      ++bad;
      ADD_FAILURE() << "element " << i << ": fma(" << a[i] << ", " << b[i] << ", " << c[i]
                    << ") = " << p[i] << ", want " << want;
    }
  }
}

// A multiply-add whose operand is another one: Halide passes the inner call's lanes straight into
// the outer call's, so the LLVM pass must replace the inner calls first (it used to read freed
// calls and crash while compiling).
TEST(Fma, NestedMultiplyAddsCompileAndRoundOnceEach) {
  Graph g("nested_fma");
  Value a = g.param("param"), b = g.grad("grad"), c = g.state("m");
  auto fma = [](Value x, Value y, Value z) {
    return cast(cast(x, DType::F64) * cast(y, DType::F64) + cast(z, DType::F64), DType::F32);
  };
  g.output("param", fma(fma(a, b, c), b, c));
  auto k = testing::shared_engine().kernel(g);
  const int64_t n = 1024 + 5;
  std::vector<float> p(n), b_(n), c_(n), a0(n);
  for (int64_t i = 0; i < n; ++i) {
    a0[i] = p[i] = static_cast<float>(testing::gen(4, uint64_t(i)) * 4.0);
    b_[i] = static_cast<float>(testing::gen(5, uint64_t(i)) * 4.0);
    c_[i] = static_cast<float>(testing::gen(6, uint64_t(i)) * 8.0);
  }
  KernelCall call;
  for (const auto& in : k->signature().inputs)
    call.inputs.push_back(in.name == "param"  ? p.data()
                          : in.name == "grad" ? b_.data()
                                              : c_.data());
  call.outputs.push_back(p.data());
  call.n = n;
  k->run(call);
  for (int64_t i = 0; i < n; ++i) {
    const float want = std::fma(std::fma(a0[i], b_[i], c_[i]), b_[i], c_[i]);
    ASSERT_EQ(bits(p[i]), bits(want)) << "element " << i;
  }
}

TEST(Fma, ObjectCodeHasVectorFmaAndNoF64) {
  const std::string avx2 = "x86-64-linux-avx-avx2-f16c-fma-sse41";
  const Graph g = canonicalize(multiply_add());
  const std::string with = testing::disassemble(
      jit::compile_kernel_object(g, jit::resolve_schedule(Schedule(), avx2), avx2, "k"));
  if (with.empty()) GTEST_SKIP() << "no objdump";
  EXPECT_GE(testing::occurrences(with, "vfmadd"), 1u);
  EXPECT_GE(testing::occurrences(with, "ymm"), 1u);
  EXPECT_EQ(testing::occurrences(with, "vcvtps2pd"), 0u);
  EXPECT_EQ(testing::occurrences(with, "vcvtpd2ps"), 0u);
  // Without FMA the f64 form stays (and still compiles).
  const std::string no_fma = "x86-64-linux-avx-avx2-f16c-sse41";
  const std::string without = testing::disassemble(
      jit::compile_kernel_object(g, jit::resolve_schedule(Schedule(), no_fma), no_fma, "k"));
  EXPECT_GE(testing::occurrences(without, "vcvtps2pd"), 1u);
}

Graph square_root() {
  Graph g("sqrt_f32");
  g.output("param", sqrt(g.param("param")));
  return g;
}

TEST(Fma, SqrtIsIeeeInTheVectorBodyAndTheTail) {
  auto k = testing::shared_engine().kernel(square_root());
  const int64_t n = 4096 + 37;
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> edges = {0.0f,
                                    -0.0f,
                                    inf,
                                    -1.0f,
                                    std::ldexp(1.0f, -149),
                                    std::ldexp(1.0f, -126),
                                    2.0f,
                                    std::ldexp(1.9999999f, 127)};
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i)
    x[i] = i % 5 == 0 ? edges[size_t(i / 5) % edges.size()]
                      : static_cast<float>(std::fabs(testing::gen(4, uint64_t(i))) *
                                           std::ldexp(1.0, int(i % 60) - 30));
  x[n - 1] = std::ldexp(1.0f, -149);  // a subnormal in the tail
  std::vector<float> p = x;
  KernelCall call;
  call.inputs.push_back(p.data());
  call.outputs.push_back(p.data());
  call.n = n;
  k->run(call);
  int64_t bad = 0;
  for (int64_t i = 0; i < n && bad < 10; ++i) {
    const float want = std::sqrt(x[i]);
    const bool ok = std::isnan(want) ? std::isnan(p[i]) : bits(p[i]) == bits(want);
    if (!ok) ++bad, ADD_FAILURE() << "element " << i << ": sqrt(" << x[i] << ") = " << p[i];
  }
}

TEST(Fma, SqrtCompilesToWholeZmmSquareRootsOnAvx512) {
  const std::string avx512 = "x86-64-linux-avx-avx2-avx512-avx512_skylake-f16c-fma-sse41";
  const Graph g = canonicalize(square_root());
  const std::string code = testing::disassemble(
      jit::compile_kernel_object(g, jit::resolve_schedule(Schedule(), avx512), avx512, "k"));
  if (code.empty()) GTEST_SKIP() << "no objdump";
  EXPECT_GE(testing::occurrences(code, "vsqrtps %zmm"), 1u);
  EXPECT_EQ(testing::occurrences(code, "vsqrtps %ymm"), 0u);  // Halide's own: 8 lanes each
}

}  // namespace
}  // namespace optfuse
