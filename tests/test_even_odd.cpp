// bf16 loops in even/odd lane order (src/lower/even_odd.h): which loops the pass rewrites, on
// Halide IR built here; that a rewritten kernel's results are element for element those of the
// arithmetic done here in f32 and rounded to nearest even; and that every element-wise
// optimizer's bf16 results move with its elements. Bit-exact: the pass moves lanes, never values,
// so nothing is tolerated.
#include <Halide.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
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

// The pass, as add_bf16_pass runs it on x86 without AVX512-BF16.
Stmt even_odd(const Stmt& s) { return lower::even_odd_lanes(s); }

// Whether `s` narrows in even/odd order anywhere (the call the rewritten stores make).
bool rewritten(const Stmt& s) {
  class Finds : public IRVisitor {
   public:
    bool found = false;

   private:
    using IRVisitor::visit;
    void visit(const Call* op) override {
      found = found || op->name == lower::kF32PairToBf16NanBranch;
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
  const Stmt s = even_odd(loop(body));
  EXPECT_TRUE(rewritten(s)) << s;
  // A scalar store beside them does not stop it.
  EXPECT_TRUE(rewritten(even_odd(
      loop(Block::make(narrowed_store("p", widened("p") * two()), store("count", Expr(1)))))));
}

TEST(EvenOdd, VectorVariablesCarryTheirOrder) {
  // t = widened p, bound in the loop: rewritten with it.
  const Stmt in_loop = loop(LetStmt::make(
      "t", widened("p"), narrowed_store("p", Variable::make(Halide::Float(32, 16), "t") * two())));
  EXPECT_TRUE(rewritten(even_odd(in_loop)));
  // Bound outside the loop, nothing rewrites its value: it stays in memory order, and meeting a
  // value widened in the loop leaves the loop as it is.
  const Stmt outside = LetStmt::make(
      "t", widened("q"),
      loop(narrowed_store("p", Variable::make(Halide::Float(32, 16), "t") + widened("p"))));
  EXPECT_FALSE(rewritten(even_odd(outside)));
  // A broadcast bound outside is the same in every lane.
  const Stmt uniform = LetStmt::make(
      "c", two(),
      loop(narrowed_store("p", Variable::make(Halide::Float(32, 16), "c") * widened("p"))));
  EXPECT_TRUE(rewritten(even_odd(uniform)));
}

TEST(EvenOdd, AGatherAtWidenedValuesIsInTheirOrder) {
  // table[int(widened p)]: the indices are in even/odd order, so the loaded values are too and
  // their store must put the halves back (left in memory order, the rewritten widening inside
  // the index would store them permuted).
  const Expr at = Cast::make(Halide::Int(32, 16), widened("p"));
  const Expr gathered = Load::make(Halide::Float(32, 16), "table", at, Halide::Buffer<>(),
                                   Parameter(), const_true(16), ModulusRemainder());
  EXPECT_TRUE(rewritten(even_odd(loop(narrowed_store("p", gathered)))));
  // A gather at indices in memory order is in memory order.
  const Expr at_memory = Cast::make(Halide::Int(32, 16), load(Halide::Float(32, 16), "f"));
  const Expr gathered_memory =
      Load::make(Halide::Float(32, 16), "table", at_memory, Halide::Buffer<>(), Parameter(),
                 const_true(16), ModulusRemainder());
  EXPECT_FALSE(rewritten(even_odd(loop(narrowed_store("p", widened("p") + gathered_memory)))));
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
    EXPECT_FALSE(rewritten(even_odd(s))) << why;
  }
}

TEST(EvenOdd, OnlyInnermostLoopsAreRewritten) {
  const Stmt inner = loop(narrowed_store("p", widened("p") * two()));
  const Stmt outer = For::make("y", 0, 4, ForType::Serial, Halide::DeviceAPI::Host,
                               Block::make(narrowed_store("q", widened("q") * two()), inner));
  const Stmt s = even_odd(outer);
  ASSERT_TRUE(rewritten(s));
  const For* y = s.as<For>();
  ASSERT_NE(y, nullptr);
  const Block* b = y->body.as<Block>();
  ASSERT_NE(b, nullptr);
  EXPECT_FALSE(rewritten(b->first));  // the outer loop's own store
  EXPECT_TRUE(rewritten(b->rest));
}

// ---- One NaN test for stores whose NaNs reach another's (src/lower/one_nan_test.h) ----

// How many calls of each narrowing (and of the NaN test) `s` makes.
std::map<std::string, int> narrowing_calls(const Stmt& s) {
  class Counts : public IRVisitor {
   public:
    std::map<std::string, int> n;

   private:
    using IRVisitor::visit;
    void visit(const Call* op) override {
      for (const char* name :
           {lower::kF32PairToBf16, lower::kF32PairToBf16NanBranch, lower::kUnordered})
        n[name] += op->name == name;
      IRVisitor::visit(op);
    }
  } counts;
  s.accept(&counts);
  return counts.n;
}

// The widened p, a and g bound before the stores (as the load stage reads every input before
// the first write), then `stores` of their values.
Stmt with_widened_inputs(const Stmt& stores) {
  return LetStmt::make(
      "wp", widened("p"),
      LetStmt::make("wa", widened("a"), LetStmt::make("wg", widened("g"), stores)));
}
Expr w(const std::string& name) { return Variable::make(Halide::Float(32, 16), name); }

TEST(EvenOdd, AStoreWhoseNaNsReachAnothersSharesItsTest) {
  // a' = a + g, p' = p * a': a NaN lane of a' is one of p'. Both stores narrow untested; p' is
  // tested once, and where it has a NaN both are written again, exactly.
  const Stmt chained = with_widened_inputs(LetStmt::make(
      "an", w("wa") + w("wg"),
      Block::make(narrowed_store("a", w("an")), narrowed_store("p", w("wp") * w("an")))));
  std::map<std::string, int> n = narrowing_calls(even_odd(loop(chained)));
  EXPECT_EQ(n[lower::kF32PairToBf16], 2);
  EXPECT_EQ(n[lower::kF32PairToBf16NanBranch], 0);  // (the second writes narrow by vector ops)
  EXPECT_EQ(n[lower::kUnordered], 1);
  // Neither value reaches the other: each store keeps its own test.
  const Stmt apart = with_widened_inputs(
      Block::make(narrowed_store("a", w("wa") + w("wg")), narrowed_store("p", w("wp") * w("wg"))));
  n = narrowing_calls(even_odd(loop(apart)));
  EXPECT_EQ(n[lower::kF32PairToBf16], 0);
  EXPECT_EQ(n[lower::kF32PairToBf16NanBranch], 2);
  // Through a max (no NaN for a NaN operand on x86) a NaN need not reach p'.
  const Stmt through_max = with_widened_inputs(
      LetStmt::make("an", w("wa") + w("wg"),
                    Block::make(narrowed_store("a", w("an")),
                                narrowed_store("p", Halide::max(w("wp"), w("an"))))));
  EXPECT_EQ(narrowing_calls(even_odd(loop(through_max)))[lower::kF32PairToBf16], 0);
  // A load after the first store (it could read what the store wrote): left as it is.
  const Stmt read_after = with_widened_inputs(LetStmt::make(
      "an", w("wa") + w("wg"),
      Block::make(narrowed_store("a", w("an")), narrowed_store("p", widened("q") * w("an")))));
  EXPECT_EQ(narrowing_calls(even_odd(loop(read_after)))[lower::kF32PairToBf16], 0);
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

// a = bf16(a + g + s), param = bf16(param * (a + g + s)), s a scalar: a NaN in the new a is one
// in the new param, so the kernel tests the param alone and writes both again where it has a
// NaN (src/lower/one_nan_test.h). No multiply-add can form here either.
Graph chained_bf16_graph() {
  Graph gr("bf16_even_odd_chained");
  Value p = cast(gr.param("param", DType::BF16), DType::F32);
  Value a = cast(gr.state("a", DType::BF16), DType::F32);
  Value g = cast(gr.grad("g", DType::BF16), DType::F32);
  Value a_new = (a + g) + gr.scalar("s");
  gr.output("a", cast(a_new, DType::BF16));
  gr.output("param", cast(p * a_new, DType::BF16));
  return gr;
}

// A graph's arithmetic done here in f32 for one element: each output's f32 result and the
// inputs it computes from (a NaN result may carry any of their NaNs: which operand x86 takes
// the NaN of is LLVM's choice of operand order).
struct Computed {
  float param, a;
  std::vector<uint16_t> param_from, a_from;
};
using Arithmetic = std::function<Computed(uint16_t p, uint16_t a, uint16_t g)>;

Computed all_bf16_arithmetic(uint16_t p, uint16_t a, uint16_t g) {
  volatile float sum = widen(p), product = widen(a);
  sum = sum + widen(a);
  product = product * widen(g);
  return {sum, product, {p, a}, {a, g}};
}

// chained_bf16_graph()'s, for the scalar `s`.
Arithmetic chained_arithmetic(float s) {
  return [s](uint16_t p, uint16_t a, uint16_t g) {
    volatile float a_new = widen(a), product = widen(p);
    a_new = a_new + widen(g);
    a_new = a_new + s;
    product = product * a_new;
    const uint16_t s_bits = bf16_of(s);  // (a NaN's quiet NaN, as the inputs')
    return Computed{product, a_new, {p, a, g, s_bits}, {a, g, s_bits}};
  };
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

// How many of the results checked were f32 values exactly halfway between two bf16 values, by
// the parity of the one below: nearest-even rounds the even ones down and the odd ones up.
struct Ties {
  int even = 0, odd = 0;
};

// Runs `graph` compiled for `target` (one every machine these tests run on has) on element
// counts with ragged and odd tails and checks every element against `arithmetic`.
Ties expect_as_computed(const std::string& target, const Graph& graph, const Arithmetic& arithmetic,
                        const std::vector<double>& scalars = {}) {
  Ties ties;
  EngineOptions eo;
  eo.target = target;
  Engine engine(eo);
  auto k = engine.kernel(graph);
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
    call.scalars = scalars;
    call.n = n;
    k->run(call);
    // The bf16 of `result`, or with NaNs in two or more inputs the quiet NaN of any of them.
    const auto as_computed = [](uint16_t got, float result, const std::vector<uint16_t>& from) {
      int nans = 0;
      for (uint16_t x : from) nans += std::isnan(widen(x));
      bool ok = got == bf16_of(result);
      for (uint16_t x : from) ok = ok || (nans > 1 && std::isnan(widen(x)) && got == (x | 0x40));
      return ok;
    };
    int bad = 0;
    for (int64_t i = 0; i < n && bad < 10; ++i) {
      const Computed want = arithmetic(p0[i], a0[i], g[i]);
      for (float x : {want.param, want.a})
        if (!std::isnan(x) && (bits_of(x) & 0xffff) == 0x8000)
          ++((bits_of(x) >> 16) & 1 ? ties.odd : ties.even);
      if (!as_computed(p[i], want.param, want.param_from) ||
          !as_computed(a[i], want.a, want.a_from)) {
        ++bad;
        ADD_FAILURE() << std::hex << "n " << std::dec << n << ", element " << i << std::hex
                      << ": param 0x" << p0[i] << ", a 0x" << a0[i] << ", g 0x" << g[i]
                      << " gave param 0x" << p[i] << " (want 0x" << bf16_of(want.param) << "), a 0x"
                      << a[i] << " (want 0x" << bf16_of(want.a) << ")" << std::dec;
      }
    }
  }
  return ties;
}

// Both kinds of tie were among the results checked: the narrowing's carry (lower/bf16.h) decides
// them by the lower value's last bit.
void expect_both_ties(const Ties& ties) {
  EXPECT_GT(ties.even, 0);
  EXPECT_GT(ties.odd, 0);
}

// all_bf16_graph()'s object for `target`, disassembled ("" without objdump).
std::string listing_for(const std::string& target) {
  return testing::disassemble(jit::compile_kernel_object(
      canonicalize(all_bf16_graph()), jit::resolve_schedule(Schedule(), target), target, "k"));
}

TEST(EvenOdd, Avx2KernelEqualsTheArithmeticElementForElement) {
  expect_both_ties(expect_as_computed(kAvx2, all_bf16_graph(), all_bf16_arithmetic));
  const std::string listing = listing_for(kAvx2);
  if (listing.empty()) GTEST_SKIP() << "no objdump";
  EXPECT_GT(testing::occurrences(listing, "vpblendw"), 0u);  // the rewritten stores' blends
  EXPECT_GT(testing::occurrences(listing, "vpsubusw"), 0u);  // their carry (lowering 19)
}

// The same for AVX-512 without AVX512-BF16 (AVX-512BW: the packing narrowing, lower/bf16.h),
// where this machine runs it.
TEST(EvenOdd, Avx512KernelEqualsTheArithmeticElementForElement) {
  if (!host_runs_avx512()) GTEST_SKIP() << "this CPU has no AVX-512BW";
  expect_both_ties(expect_as_computed(kAvx512, all_bf16_graph(), all_bf16_arithmetic));
  const std::string listing = listing_for(kAvx512);
  if (listing.empty()) GTEST_SKIP() << "no objdump";
  EXPECT_GT(testing::occurrences(listing, "zmm"), 0u);
  EXPECT_EQ(testing::occurrences(listing, "vpmovzxwd"), 0u);  // no widening in memory order
  EXPECT_GT(testing::occurrences(listing, "vpsubusw"), 0u);   // the pairs' carry (lowering 20)
}

// The same on 128-bit vectors (x86 without AVX), which the pass takes too.
TEST(EvenOdd, Sse41KernelEqualsTheArithmeticElementForElement) {
  const std::string target = "x86-64-linux-sse41";
  expect_both_ties(expect_as_computed(target, all_bf16_graph(), all_bf16_arithmetic));
  const std::string listing = listing_for(target);
  if (listing.empty()) GTEST_SKIP() << "no objdump";
  EXPECT_GT(testing::occurrences(listing, "pblendw"), 0u);
}

// A stored value whose NaNs reach another's (one NaN test for both; where it finds one, both are
// written again), on AVX2, SSE4.1 and AVX-512 without AVX512-BF16 where this machine runs it.
// With s = 0 the edge values' NaN lanes take that path; with s a NaN whose payload has bit 15
// set (0x7fc08001 as f32) every lane does, and only the second writes store its quiet NaN
// 0x7fc0: the first ones round it up to 0x7fc1.
TEST(EvenOdd, ChainedKernelEqualsTheArithmeticElementForElement) {
  const float nan_payload = testing::f32_of(0x7fc08001u);
  std::vector<std::string> targets = {kAvx2, "x86-64-linux-sse41"};
  if (host_runs_avx512()) targets.push_back(kAvx512);
  for (const std::string& target : targets) {
    SCOPED_TRACE(target);
    EngineOptions eo;
    eo.target = target;
    eo.compile_only = true;
    const std::string stmt = Engine(eo).lowered_stmt(chained_bf16_graph());
    EXPECT_NE(stmt.find(lower::kUnordered), std::string::npos) << "no shared NaN test";
    expect_as_computed(target, chained_bf16_graph(), chained_arithmetic(0.0f), {0.0});
    expect_as_computed(target, chained_bf16_graph(), chained_arithmetic(nan_payload),
                       {double(nan_payload)});
  }
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
