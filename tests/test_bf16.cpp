// bf16 <-> f32 conversions on CPU targets (src/lower/bf16.h): integer operations on the bits, so
// that a bf16 kernel's f32 arithmetic compiles as the f32 kernel's does, on every x86 target.
//
// Oracle: round to nearest even with 8 significant bits, written here in double from the
// definition (bf16 has f32's exponent range); widening is exact. Bit-exact: nothing to tolerate.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "jit/halide_bridge.h"
#include "optfuse/optfuse.hpp"
#include "support/engine.h"
#include "support/float_bits.h"
#include "support/gen.h"
#include "support/objdump.h"
#include "support/round_trip.h"

namespace optfuse {
namespace {

using testing::bits_of;
using testing::f32_of;

// The bf16 nearest to finite x (ties to even), as bits; +-inf past the largest finite bf16.
uint16_t bf16_nearest(float x) {
  const double max_finite = std::ldexp(2.0 - std::ldexp(1.0, -7), 127);
  double r = x;
  if (x != 0) {
    int e;
    std::frexp(double(x), &e);
    double quantum = std::ldexp(1.0, std::max(e - 1, -126) - 7);  // subnormals: fixed spacing
    r = std::nearbyint(x / quantum) * quantum;
  }
  if (std::fabs(r) > max_finite) r = std::copysign(HUGE_VAL, x);
  return static_cast<uint16_t>(bits_of(static_cast<float>(r)) >> 16);  // exact: r is a bf16
}

// f32 bit patterns whose bf16 rounding is delicate: ties and near-ties (low half 0x7fff, 0x8000,
// 0x8001 with even and odd kept bits), the subnormal range, the largest finite bf16 and what
// overflows, infinities, and NaNs whose payload lies only in the low half (a carry into the
// exponent would make them infinities).
std::vector<uint32_t> edge_bits() {
  std::vector<uint32_t> v = {0x00000000, 0x80000000, 0x00000001, 0x00007fff, 0x00008000,
                             0x00018000, 0x007fffff, 0x00800000, 0x7f7f7fff, 0x7f7f8000,
                             0x7f7fffff, 0x7f800000, 0xff800000, 0x7f800001, 0x7f807fff,
                             0x7f808000, 0xff800001, 0x7fc00000, 0xffc00000, 0x7fffffff};
  for (uint32_t high : {0x3f80u, 0x3f81u, 0x0001u, 0x0080u, 0x4b00u, 0xbf80u, 0xbf81u})
    for (uint32_t low : {0x0000u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu})
      v.push_back(high << 16 | low);
  return v;
}

TEST(Bf16, ConversionsMatchTheDefinitionBitForBit) {
  auto k = testing::shared_engine().kernel(testing::round_trip(DType::BF16));
  // Every bf16 bit pattern, plus a ragged tail, so vector bodies and the tail both run.
  const int64_t n = 65536 + 37;
  std::vector<uint16_t> param(n);
  std::vector<float> x(n);
  const std::vector<uint32_t> edges = edge_bits();
  for (int64_t i = 0; i < n; ++i) {
    param[i] = static_cast<uint16_t>(i & 0xffff);
    const uint32_t random = static_cast<uint32_t>(testing::gen(9, uint64_t(i)) * 4294967296.0);
    x[i] = f32_of(i % 3 == 0 ? edges[size_t(i / 3) % edges.size()] : random);
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
    const bool x_ok = bits_of(x[i]) == uint32_t(param0[i]) << 16;  // the NaNs' bits too
    const uint32_t in = bits_of(x0[i]);
    // A NaN stays a NaN, quiet, with its sign and the high half of its payload.
    const uint16_t want_p = std::isnan(x0[i]) ? uint16_t((in >> 16) | 0x40) : bf16_nearest(x0[i]);
    if (!x_ok || want_p != param[i]) {
      ++bad;
      ADD_FAILURE() << std::hex << "element " << std::dec << i << std::hex << ": f32(bf16 0x"
                    << param0[i] << ") = 0x" << bits_of(x[i]) << "; bf16(f32 0x" << in << ") = 0x"
                    << param[i] << ", want 0x" << want_p << std::dec;
    }
  }
}

bool subnormal(uint32_t bits) { return (bits & 0x7fffffff) - 1 < 0x7fffff; }

// param = bf16(x + y): the narrowed value is computed, as in the update kernels.
Graph narrowing_graph() {
  Graph g("bf16_narrow");
  g.param("param", DType::BF16);
  g.output("param", cast(g.state("x") + g.state("y"), DType::BF16));
  return g;
}

// Runs `k` (narrowing_graph()) on `x` (y = 0) and checks each result against bf16_nearest of the
// f32 sum computed here (x + 0 is x but for -0 and signaling NaNs, which x86 turns into +0 and
// quiet NaNs in both); a NaN must stay a NaN, quiet, with its sign and its payload's high half.
void expect_narrowed_as_defined(const Kernel& k, std::vector<float> x) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> y(x.size(), 0.0f);
  std::vector<uint16_t> param(x.size(), 0);
  const std::map<std::string, void*> buffers = {
      {"param", param.data()}, {"x", x.data()}, {"y", y.data()}};
  KernelCall call;
  for (const auto& in : k.signature().inputs) call.inputs.push_back(buffers.at(in.name));
  for (const auto& out : k.signature().outputs) call.outputs.push_back(buffers.at(out.replaces));
  call.n = n;
  k.run(call);
  int64_t bad = 0;
  for (int64_t i = 0; i < n && bad < 10; ++i) {
    volatile float sum = x[i];
    sum = sum + y[i];
    const uint32_t in = bits_of(sum);
    const uint16_t want = std::isnan(sum) ? uint16_t((in >> 16) | 0x40) : bf16_nearest(sum);
    if (param[i] != want) {
      ++bad;
      ADD_FAILURE() << std::hex << "bf16(f32 0x" << bits_of(x[i]) << " + 0) = 0x" << param[i]
                    << ", want 0x" << want << std::dec << " (element " << i << ")";
    }
  }
}

// On CPUs with AVX512-BF16 (src/lower/bf16.h) a vector without subnormal lanes narrows by
// vcvtne2ps2bf16, one with any by the integer operations. Every edge value but the subnormals
// fills whole vectors, so the instruction rounds ties, NaNs and overflow; each subnormal edge
// value sits alone among normal values in one vector, so the other path runs. On other CPUs
// both run the integer operations, and this checks them once more.
TEST(Bf16, NarrowingWithAndWithoutSubnormalLanes) {
  const Graph g = narrowing_graph();
  std::vector<uint32_t> normal, rare;
  for (uint32_t b : edge_bits()) (subnormal(b) ? rare : normal).push_back(b);
  ASSERT_FALSE(rare.empty());
  std::vector<float> x;
  for (int rep = 0; rep < 64; ++rep)
    for (uint32_t b : normal) x.push_back(f32_of(b ^ (rep & 1 ? 0x80000000u : 0)));
  while (x.size() % 32) x.push_back(1.0f);
  for (uint32_t b : rare)
    for (int lane = 0; lane < 32; ++lane) x.push_back(lane == 7 ? f32_of(b) : 0.5f + lane);
  x.resize(x.size() + 5, 3.0f);  // and a ragged tail
  expect_narrowed_as_defined(*testing::shared_engine().kernel(g), x);
  // Where this machine's kernels use the extension, the kernel just run has the instruction.
  const std::string host = jit::resolve_target("host");
  if (jit::cpu_extras_key(host).find("avx512bf16") == std::string::npos) return;
  const std::string listing = testing::disassemble(jit::compile_kernel_object(
      canonicalize(g), jit::resolve_schedule(Schedule(), host), host, "k"));
  if (listing.empty()) GTEST_SKIP() << "no objdump";
  EXPECT_GT(testing::occurrences(listing, "vcvtne2ps2bf16"), 0u);
  EXPECT_GT(testing::occurrences(listing, "vfpclassps"), 0u);  // the subnormal test
}

// On x86 without AVX-512BW (src/lower/bf16.h) a vector tests for NaNs once (vcmpunordps of its
// halves), and only a vector with a NaN takes the NaN lanes' path. Compiled for AVX2, which every
// x86-64 machine these tests run on executes, so AVX-512 machines check it too: 16-lane vectors
// of the edge values without NaNs, each NaN edge value alone in each lane of a vector, a vector
// of NaNs only, and a ragged tail with one.
TEST(Bf16, Avx2NarrowingTestsForNansOncePerVector) {
  const std::string target = "x86-64-linux-avx-avx2-f16c-fma-sse41";
  ASSERT_EQ(jit::resolve_schedule(Schedule(), target).vector_width, 16);
  std::vector<uint32_t> numbers, nans;
  for (uint32_t b : edge_bits()) (std::isnan(f32_of(b)) ? nans : numbers).push_back(b);
  ASSERT_FALSE(nans.empty());
  std::vector<float> x;
  for (int rep = 0; rep < 16; ++rep)
    for (uint32_t b : numbers) x.push_back(f32_of(b ^ (rep & 1 ? 0x80000000u : 0)));
  x.resize((x.size() + 15) / 16 * 16, 1.0f);
  for (uint32_t b : nans)
    for (int lane = 0; lane < 16; ++lane)
      for (int i = 0; i < 16; ++i)
        x.push_back(i == lane ? f32_of(b) : f32_of(numbers[size_t(i * 7 + lane) % numbers.size()]));
  for (int i = 0; i < 16; ++i) x.push_back(f32_of(nans[size_t(i) % nans.size()]));
  for (int i = 0; i < 5; ++i) x.push_back(i == 3 ? f32_of(nans[0]) : 2.5f);  // the ragged tail
  EngineOptions eo;
  eo.target = target;
  Engine avx2(eo);
  expect_narrowed_as_defined(*avx2.kernel(narrowing_graph()), x);
  const std::string listing = testing::disassemble(jit::compile_kernel_object(
      canonicalize(narrowing_graph()), jit::resolve_schedule(Schedule(), target), target, "k"));
  if (listing.empty()) GTEST_SKIP() << "no objdump";
  EXPECT_GT(testing::occurrences(listing, "vcmpunordps"), 0u);
}

// The f32 arithmetic instructions of an object, FMA forms merged (vfmadd132/213/231ps differ
// only in which operand the result overwrites): e.g. {"vfmadd": 30, "vdivps": 10, ...}.
std::map<std::string, int> float_ops(const std::string& listing) {
  static const std::regex op(
      R"(\s(v?(?:fn?m(?:add|sub)|mul|add|sub|div|sqrt))(?:132|213|231)?(ps|ss)\s)");
  std::map<std::string, int> out;
  for (auto it = std::sregex_iterator(listing.begin(), listing.end(), op);
       it != std::sregex_iterator(); ++it)
    ++out[(*it)[1].str() + (*it)[2].str()];
  return out;
}

// Why AdamW's bf16 master equals the f32 run bit for bit (test_mixed_precision): the bf16
// kernels' float instructions are the f32 kernel's, on every x86 target (compile only, so any
// machine checks them all). With Halide's strict_float conversion the bf16 kernel computed the
// update twice (20 vdivps where the f32 kernel has 10) and contracted it differently (vfnmadd, not
// vfmsub) on every target without avx512_sapphirerapids. Whole objects are compared per copy of
// the update: LLVM may lay out the loops of a kernel a different number of times (on AVX2 the
// bf16 kernel has one copy more than the f32 one), so each count is taken per vsqrtps (AdamW's
// update has one square root). This is meaningful for AdamW; for other optimizers SGD / Adam /
// NAdam / RAdam contract an add of two products the other way (test_mixed_precision's kMaxUlps).
TEST(Bf16, AdamWKernelsCompileTheF32KernelsFloatOps) {
  const std::vector<std::string> targets = {
      "x86-64-linux-avx-avx2-f16c-fma-sse41",
      "x86-64-linux-avx-avx2-avx512-avx512_skylake-f16c-fma-sse41",
      "x86-64-linux-avx-avx2-avx512-avx512_cannonlake-avx512_skylake-f16c-fma-sse41",
      "x86-64-linux-avx-avx2-avx512-avx512_cannonlake-avx512_sapphirerapids-avx512_skylake-f16c-"
      "fma-sse41"};
  // The claim is about the integer conversions, so the objects are compiled as for any machine:
  // "-no_asserts" makes every string differ from this machine's own target, for which AVX512-BF16
  // narrowing could apply (jit::cpu_extras_key), and changes no float instruction. (With that
  // narrowing LLVM duplicates a block of the ragged vector's path into both of its predecessors,
  // so counts per copy do not compare; test_mixed_precision checks those kernels' results bit
  // for bit on such machines.)
  for (std::string target : targets) {
    target += "-no_asserts";
    auto ops = [&](DType param, DType grad) {
      const Graph g = canonicalize(update_graph({{"type", "adamw"}}, {}, param, grad));
      return float_ops(testing::disassemble(
          jit::compile_kernel_object(g, jit::resolve_schedule(Schedule(), target), target, "k")));
    };
    const std::map<std::string, int> f32 = ops(DType::F32, DType::F32);
    if (f32.empty()) GTEST_SKIP() << "no objdump";
    ASSERT_GT(f32.count("vsqrtps"), 0u) << target;
    // `got` has f32's ops in the same proportions: the same instructions per copy.
    auto per_copy_equal = [&](const std::map<std::string, int>& got) {
      if (got.size() != f32.size() || !got.count("vsqrtps")) return false;
      for (const auto& [op, n] : f32)
        if (!got.count(op) ||
            int64_t(got.at(op)) * f32.at("vsqrtps") != int64_t(n) * got.at("vsqrtps"))
          return false;
      return true;
    };
    for (auto [param, grad] : {std::pair{DType::BF16, DType::BF16},
                               {DType::BF16, DType::F32},
                               {DType::F32, DType::BF16}}) {
      const std::map<std::string, int> got = ops(param, grad);
      EXPECT_TRUE(per_copy_equal(got)) << target << ": " << ::testing::PrintToString(got)
                                       << " vs f32 " << ::testing::PrintToString(f32);
    }
  }
}

}  // namespace
}  // namespace optfuse
