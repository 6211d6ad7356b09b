// bf16 loops in even/odd lane order (src/lower/even_odd.h): which loops the pass rewrites, on
// Halide IR built here; that a rewritten kernel's results are element for element those of the
// arithmetic done here in f32 and rounded to nearest even; and that every element-wise
// optimizer's bf16 results move with its elements. Bit-exact: the pass moves lanes, never values,
// so nothing is tolerated.
#include <Halide.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "jit/halide_bridge.h"
#include "lower/bf16.h"
#include "lower/even_odd.h"
#include "optfuse/optfuse.hpp"
#include "optfuse/optim.h"
#include "support/float_bits.h"
#include "support/gen.h"
#include "support/objdump.h"

namespace optfuse {
namespace {

using namespace Halide::Internal;
using Halide::Expr;

// ---- Which loops: Halide IR ----

const Expr kLoop = Variable::make(Halide::Int(32), "x");

Expr dense(int lanes) { return Ramp::make(kLoop * lanes, 1, lanes); }

Expr load(Halide::Type t, const std::string& buffer) {
  return Load::make(t, buffer, dense(t.lanes()), Halide::Buffer<>(), Parameter(),
                    const_true(t.lanes()), ModulusRemainder());
}

Stmt store(const std::string& buffer, const Expr& value) {
  const int lanes = value.type().lanes();
  return Store::make(buffer, value, lanes == 1 ? kLoop : dense(lanes), Parameter(),
                     const_true(lanes), ModulusRemainder());
}

Expr widened(const std::string& buffer, int lanes = 16) {
  return Cast::make(Halide::Float(32, lanes), load(Halide::BFloat(16, lanes), buffer));
}

Stmt narrowed_store(const std::string& buffer, const Expr& f32) {
  return store(buffer, Cast::make(Halide::BFloat(16, f32.type().lanes()), f32));
}

Stmt loop(const Stmt& body) {
  return For::make("x", 0, 64, ForType::Serial, Halide::DeviceAPI::Host, body);
}

// Whether `s` narrows in even/odd order anywhere (the call the rewritten stores make).
bool rewritten(const Stmt& s) {
  class Finds : public IRVisitor {
   public:
    bool found = false;

   private:
    using IRVisitor::visit;
    void visit(const Call* op) override {
      found = found || op->name == lower::kF32ToBf16RoundedNanBranch;
      IRVisitor::visit(op);
    }
  } finds;
  s.accept(&finds);
  return finds.found;
}

Expr two(int lanes = 16) { return Broadcast::make(2.0f, lanes); }

TEST(EvenOdd, AnAllBf16LoopIsRewritten) {
  const Stmt body = Block::make(narrowed_store("p", widened("p") + widened("g") * two()),
                                narrowed_store("m", widened("g") * widened("g")));
  const Stmt s = lower::even_odd_lanes(loop(body));
  EXPECT_TRUE(rewritten(s)) << s;
  // A scalar store beside them does not stop it.
  EXPECT_TRUE(rewritten(lower::even_odd_lanes(
      loop(Block::make(narrowed_store("p", widened("p") * two()), store("count", Expr(1)))))));
}

TEST(EvenOdd, VectorVariablesCarryTheirOrder) {
  // t = widened p, bound in the loop: rewritten with it.
  const Stmt in_loop = loop(LetStmt::make(
      "t", widened("p"), narrowed_store("p", Variable::make(Halide::Float(32, 16), "t") * two())));
  EXPECT_TRUE(rewritten(lower::even_odd_lanes(in_loop)));
  // Bound outside the loop, nothing rewrites its value: it stays in memory order, and meeting a
  // value widened in the loop leaves the loop as it is.
  const Stmt outside = LetStmt::make(
      "t", widened("q"),
      loop(narrowed_store("p", Variable::make(Halide::Float(32, 16), "t") + widened("p"))));
  EXPECT_FALSE(rewritten(lower::even_odd_lanes(outside)));
  // A broadcast bound outside is the same in every lane.
  const Stmt uniform = LetStmt::make(
      "c", two(),
      loop(narrowed_store("p", Variable::make(Halide::Float(32, 16), "c") * widened("p"))));
  EXPECT_TRUE(rewritten(lower::even_odd_lanes(uniform)));
}

TEST(EvenOdd, AGatherAtWidenedValuesIsInTheirOrder) {
  // table[int(widened p)]: the indices are in even/odd order, so the loaded values are too and
  // their store must put the halves back (left in memory order, the rewritten widening inside
  // the index would store them permuted).
  const Expr at = Cast::make(Halide::Int(32, 16), widened("p"));
  const Expr gathered = Load::make(Halide::Float(32, 16), "table", at, Halide::Buffer<>(),
                                   Parameter(), const_true(16), ModulusRemainder());
  EXPECT_TRUE(rewritten(lower::even_odd_lanes(loop(narrowed_store("p", gathered)))));
  // A gather at indices in memory order is in memory order.
  const Expr at_memory = Cast::make(Halide::Int(32, 16), load(Halide::Float(32, 16), "f"));
  const Expr gathered_memory =
      Load::make(Halide::Float(32, 16), "table", at_memory, Halide::Buffer<>(), Parameter(),
                 const_true(16), ModulusRemainder());
  EXPECT_FALSE(
      rewritten(lower::even_odd_lanes(loop(narrowed_store("p", widened("p") + gathered_memory)))));
}

TEST(EvenOdd, LoopsWithValuesInMemoryOrderAreLeftAsTheyAre) {
  const std::map<std::string, Stmt> left = {
      {"an f32 vector read from memory",
       narrowed_store("p", widened("p") + load(Halide::Float(32, 16), "master"))},
      {"a lane index",
       narrowed_store("p", widened("p") + Cast::make(Halide::Float(32, 16), dense(16)))},
      {"a widened value stored as f32", store("master", widened("p") * two())},
      {"a shuffle", narrowed_store("p", Shuffle::make_concat({widened("p", 8), widened("g", 8)}))},
      {"one lane taken out",
       store("first", Shuffle::make_extract_element(widened("p") * two(), 0))},
      {"4 lanes", narrowed_store("p", widened("p", 4) * two(4))},
      {"a reduction across lanes",
       store("sum", VectorReduce::make(VectorReduce::Add, widened("p"), 1))},
      {"a dynamic shuffle (lane 3 of each vector)",
       narrowed_store(
           "p", Call::make(Halide::Float(32, 16), Call::dynamic_shuffle,
                           {widened("p"), Broadcast::make(3, 16), 0, 15}, Call::PureIntrinsic))},
  };
  for (const auto& [why, body] : left) {
    const Stmt s = loop(Block::make(narrowed_store("m", widened("m") * two()), body));
    EXPECT_FALSE(rewritten(lower::even_odd_lanes(s))) << why;
  }
}

TEST(EvenOdd, OnlyInnermostLoopsAreRewritten) {
  const Stmt inner = loop(narrowed_store("p", widened("p") * two()));
  const Stmt outer = For::make("y", 0, 4, ForType::Serial, Halide::DeviceAPI::Host,
                               Block::make(narrowed_store("q", widened("q") * two()), inner));
  const Stmt s = lower::even_odd_lanes(outer);
  ASSERT_TRUE(rewritten(s));
  const For* y = s.as<For>();
  ASSERT_NE(y, nullptr);
  const Block* b = y->body.as<Block>();
  ASSERT_NE(b, nullptr);
  EXPECT_FALSE(rewritten(b->first));  // the outer loop's own store
  EXPECT_TRUE(rewritten(b->rest));
}

// ---- Results: kernels compiled for AVX2 and SSE4.1 ----

using testing::bits_of;
using testing::f32_of;
float widen(uint16_t b) { return f32_of(uint32_t(b) << 16); }

// The bf16 nearest to x (ties to even); a NaN becomes its quiet NaN (optim::to_bf16_bits).
uint16_t bf16_of(float x) {
  const uint32_t u = bits_of(x);
  if (std::isnan(x)) return uint16_t((u >> 16) | 0x40);
  return uint16_t((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

// param = bf16(param + a), a = bf16(a * g): one f32 operation each, so that no multiply-add
// can form and the f32 result here is the kernel's.
Graph all_bf16_graph() {
  Graph gr("bf16_even_odd");
  Value p = cast(gr.param("param", DType::BF16), DType::F32);
  Value a = cast(gr.state("a", DType::BF16), DType::F32);
  Value g = cast(gr.grad("g", DType::BF16), DType::F32);
  gr.output("param", cast(p + a, DType::BF16));
  gr.output("a", cast(a * g, DType::BF16));
  return gr;
}

// bf16 values whose sums and products round at ties, overflow, go subnormal or are NaNs.
std::vector<uint16_t> edge_bf16() {
  return {0x0000, 0x8000, 0x0001, 0x8001, 0x007f, 0x0080, 0x3f80, 0x3f81, 0xbf80, 0x3b80,
          0x4b00, 0x7f7f, 0xff7f, 0x7f80, 0xff80, 0x7f81, 0x7fc0, 0xffc1, 0x0100, 0x3380};
}

// x86 targets the pass runs on: AVX2, and AVX-512 without AVX512-BF16.
const char* const kAvx2 = "x86-64-linux-avx-avx2-f16c-fma-sse41";
const char* const kAvx512 = "x86-64-linux-avx-avx2-avx512-avx512_skylake-f16c-fma-sse41";

// Whether this machine runs kAvx512's kernels.
bool host_runs_avx512() {
  return Halide::get_host_target().has_feature(Halide::Target::AVX512_Skylake);
}

// Runs all_bf16_graph() compiled for `target` (one every machine these tests run on has) on element
// counts with ragged and odd tails and checks every element against the arithmetic done here.
void expect_as_computed(const std::string& target) {
  EngineOptions eo;
  eo.target = target;
  Engine engine(eo);
  auto k = engine.kernel(all_bf16_graph());
  const std::vector<uint16_t> edges = edge_bf16();
  // Odd counts and a count below one vector: the ragged tails run too.
  for (int64_t n : {int64_t{4096 + 37}, int64_t{4099}, int64_t{5}, int64_t{64}}) {
    std::vector<uint16_t> p(n), a(n), g(n);
    for (int64_t i = 0; i < n; ++i) {  // every element its own value: a moved lane shows
      const auto random = [&](int stream) {
        return uint16_t(testing::gen(stream, uint64_t(i)) * 65536.0);
      };
      p[i] = i % 5 == 0 ? edges[size_t(i / 5) % edges.size()] : random(1);
      a[i] = i % 7 == 0 ? edges[size_t(i / 7) % edges.size()] : random(2);
      g[i] = i % 3 == 0 ? edges[size_t(i / 3 + 1) % edges.size()] : random(3);
    }
    const std::vector<uint16_t> p0 = p, a0 = a;
    const std::map<std::string, void*> buffers = {
        {"param", p.data()}, {"a", a.data()}, {"g", g.data()}};
    KernelCall call;
    for (const auto& in : k->signature().inputs) call.inputs.push_back(buffers.at(in.name));
    for (const auto& out : k->signature().outputs) call.outputs.push_back(buffers.at(out.replaces));
    call.n = n;
    k->run(call);
    // With NaNs in both operands x86 returns the first one's, and which operand LLVM makes
    // first is its choice: either quiet NaN is the operation's result.
    const auto as_computed = [](uint16_t got, uint16_t x, uint16_t y, float result) {
      const bool both_nan = std::isnan(widen(x)) && std::isnan(widen(y));
      return got == bf16_of(result) || (both_nan && (got == (x | 0x40) || got == (y | 0x40)));
    };
    int bad = 0;
    for (int64_t i = 0; i < n && bad < 10; ++i) {
      volatile float sum = widen(p0[i]), product = widen(a0[i]);
      sum = sum + widen(a0[i]);
      product = product * widen(g[i]);
      if (!as_computed(p[i], p0[i], a0[i], sum) || !as_computed(a[i], a0[i], g[i], product)) {
        ++bad;
        ADD_FAILURE() << std::hex << "n " << std::dec << n << ", element " << i << std::hex
                      << ": param 0x" << p0[i] << " + a 0x" << a0[i] << " = 0x" << p[i]
                      << ", want 0x" << bf16_of(sum) << "; a 0x" << a0[i] << " * g 0x" << g[i]
                      << " = 0x" << a[i] << ", want 0x" << bf16_of(product) << std::dec;
      }
    }
  }
}

// all_bf16_graph()'s object for `target`, disassembled ("" without objdump).
std::string listing_for(const std::string& target) {
  return testing::disassemble(jit::compile_kernel_object(
      canonicalize(all_bf16_graph()), jit::resolve_schedule(Schedule(), target), target, "k"));
}

TEST(EvenOdd, Avx2KernelEqualsTheArithmeticElementForElement) {
  expect_as_computed(kAvx2);
  const std::string listing = listing_for(kAvx2);
  if (listing.empty()) GTEST_SKIP() << "no objdump";
  EXPECT_GT(testing::occurrences(listing, "vpblendw"), 0u);  // the rewritten stores' blends
}

// The same for AVX-512 without AVX512-BF16 (AVX-512BW: the packing narrowing, lower/bf16.h),
// where this machine runs it.
TEST(EvenOdd, Avx512KernelEqualsTheArithmeticElementForElement) {
  if (!host_runs_avx512()) GTEST_SKIP() << "this CPU has no AVX-512BW";
  expect_as_computed(kAvx512);
  const std::string listing = listing_for(kAvx512);
  if (listing.empty()) GTEST_SKIP() << "no objdump";
  EXPECT_GT(testing::occurrences(listing, "zmm"), 0u);
  EXPECT_EQ(testing::occurrences(listing, "vpmovzxwd"), 0u);  // no widening in memory order
}

// The same on 128-bit vectors (x86 without AVX), which the pass takes too.
TEST(EvenOdd, Sse41KernelEqualsTheArithmeticElementForElement) {
  const std::string target = "x86-64-linux-sse41";
  expect_as_computed(target);
  const std::string listing = listing_for(target);
  if (listing.empty()) GTEST_SKIP() << "no objdump";
  EXPECT_GT(testing::occurrences(listing, "pblendw"), 0u);
}

// ---- Every element-wise optimizer: moving the elements moves the results ----

// An element-wise update computes each element from that element alone, so a run over the
// elements rotated by one gives the first run's results rotated, bit for bit. Rotating moves
// every element between the even and odd halves of the words and into or out of the ragged tail:
// a lane the pass mixed up shows. (LAMB, LARS, Adafactor and Muon reduce over the tensor, and a
// sum in another order may round differently: not here.)
// On AVX2, and (the parameter's bool) on AVX-512 without AVX512-BF16 where this machine runs it.
class ElementWise : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(ElementWise, RotatingTheElementsRotatesTheBf16Results) {
  const auto& [type, avx512] = GetParam();
  if (avx512 && !host_runs_avx512()) GTEST_SKIP() << "this CPU has no AVX-512BW";
  EngineOptions eo;
  eo.target = avx512 ? kAvx512 : kAvx2;
  Engine engine(eo);
  const int64_t n = 1000 + 3;
  auto run = [&](int64_t shift) {
    Options config = {{"type", type}, {"lr", 1e-2}, {"master_weights", false}};
    if (type == "sgd") config["momentum"] = 0.9;
    auto opt = Optimizer::create(engine, config);
    std::vector<uint16_t> p(n), g(n);
    auto moved = [&](int64_t i) { return size_t((i + shift) % n); };
    for (int64_t i = 0; i < n; ++i)
      p[moved(i)] = bf16_of(float(2 * testing::gen(11, uint64_t(i)) - 1));
    opt->add_param_group(
        {{TensorRef{p.data(), n, {}, DType::BF16}, TensorRef{g.data(), n, {}, DType::BF16}, "w"}},
        {});
    for (int step = 1; step <= 3; ++step) {
      for (int64_t i = 0; i < n; ++i)
        g[moved(i)] = bf16_of(float(2 * testing::gen(20 + step, uint64_t(i)) - 1));
      opt->step();
    }
    return p;
  };
  const std::vector<uint16_t> a = run(0), b = run(1);
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 10; ++i)
    if (b[size_t((i + 1) % n)] != a[size_t(i)]) {
      ++bad;
      ADD_FAILURE() << "element " << i << ": 0x" << std::hex << a[size_t(i)] << " in place, 0x"
                    << b[size_t((i + 1) % n)] << " moved by one" << std::dec;
    }
}

INSTANTIATE_TEST_SUITE_P(
    EveryOne, ElementWise,
    ::testing::Combine(::testing::Values("adadelta", "adagrad", "adam", "adamax", "adamw", "asgd",
                                         "lion", "nadam", "radam", "rmsprop", "rprop", "sgd"),
                       ::testing::Bool()),
    [](const auto& info) {
      return std::get<0>(info.param) + (std::get<1>(info.param) ? "_avx512" : "_avx2");
    });

}  // namespace
}  // namespace optfuse
