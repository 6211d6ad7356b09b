// 8-bit block-quantized state (src/optim/block_state.h) and the row state it is built on
// (Role::RowState, include/optfuse/graph.h).
//
// Oracles: the maps against a decoder and encoder written out here from docs/int8-state.md, in
// double; the quantized AdamW kernel against the graph interpreter (double precision). The
// kernel computes in f32, so a value that lands within f32 rounding of a code boundary may get
// the neighbouring code: codes are checked to within one, and such codes must be rare (they need
// the scaled value within ~1e-5 of a boundary: about 2e-5 of the codes; we allow 1e-3). Scales
// are row maxima of values the kernel computes in f32 and the interpreter in double: AdamW's
// exp_avg_sq' = beta2 v + (1 - beta2) g^2 rounds three times in f32 (each within 2^-24
// relative), after v's decoding rounded twice, so within 2^-20 relative.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "optfuse/engine.h"
#include "optfuse/error.h"
#include "optfuse/optim.h"
#include "optim/block_state.h"
#include "optim/options.h"
#include "optim/precision.h"
#include "optim/rule.h"
#include "support/engine.h"
#include "support/gen.h"

namespace optfuse {
namespace {

using optim::BlockMap;

constexpr int64_t kBlock = 256;

// The maps as docs/int8-state.md states them.
double decode(uint8_t code, double absmax, BlockMap map) {
  if (map == BlockMap::kSignedLinear) return (code - 127.0) * absmax / 127.0;
  double t = code * std::sqrt(absmax) / 255.0;
  return t * t;
}

uint8_t encode(double x, double absmax, BlockMap map) {
  if (absmax == 0) return map == BlockMap::kSignedLinear ? 127 : 0;
  if (map == BlockMap::kSignedLinear) return static_cast<uint8_t>(127.0 * x / absmax + 127.5);
  return static_cast<uint8_t>(255.0 * std::sqrt(std::fabs(x) / absmax) + 0.5);
}

struct Blocks {
  std::vector<uint8_t> codes;
  std::vector<float> absmax;
};

Blocks quantize(const std::vector<double>& x, BlockMap map, int64_t block = kBlock) {
  Blocks b{std::vector<uint8_t>(x.size()), {}};
  for (size_t r = 0; r * block < x.size(); ++r) {
    double m = 0;
    for (int64_t i = 0; i < block; ++i) m = std::max(m, std::fabs(x[r * block + i]));
    b.absmax.push_back(static_cast<float>(m));
    for (int64_t i = 0; i < block; ++i)
      b.codes[r * block + i] = encode(x[r * block + i], b.absmax.back(), map);
  }
  return b;
}

// Checks kernel codes and scales against the expected ones (see the top of this file).
void expect_blocks(const Blocks& got, const Blocks& want, const std::string& what) {
  ASSERT_EQ(got.codes.size(), want.codes.size());
  ASSERT_EQ(got.absmax.size(), want.absmax.size());
  for (size_t r = 0; r < want.absmax.size(); ++r)
    ASSERT_NEAR(got.absmax[r], want.absmax[r], std::ldexp(std::fabs(want.absmax[r]), -20))
        << what << " block " << r;
  size_t off_by_one = 0;
  for (size_t i = 0; i < want.codes.size(); ++i) {
    int d = int(got.codes[i]) - int(want.codes[i]);
    ASSERT_LE(std::abs(d), 1) << what << " element " << i << ": code " << int(got.codes[i])
                              << ", want " << int(want.codes[i]);
    off_by_one += d != 0;
  }
  EXPECT_LE(off_by_one, want.codes.size() / 1000) << what;
}

TEST(RowState, OutputMustBeTheSameWithinARow) {
  Graph g("bad");
  Value x = g.state("x");
  g.row_state("x.scale");
  g.output("x", x + 1.0);
  try {
    g.output("x.scale", x * 2.0);
    FAIL() << "a per-element value replaced row state";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("differs within a row (through state \"x\")"),
              std::string::npos)
        << e.what();
  }
  g.output("x.scale", row_max(abs(x)) * 2.0);  // a row value is fine
  EXPECT_TRUE(uses_rows(g));
}

TEST(RowState, TextAndJsonRoundTrip) {
  Graph g("plus");
  g.output("m", g.state("m") + g.grad("grad"));
  const Graph q = optim::quantize_state(g, {{"m", BlockMap::kSignedLinear}});
  const std::string text = print(canonicalize(q));
  EXPECT_NE(text.find("row_state.f32 \"m.absmax\""), std::string::npos) << text;
  EXPECT_NE(text.find("state.u8 \"m\""), std::string::npos) << text;
  EXPECT_EQ(print(canonicalize(parse(text))), text);
  EXPECT_EQ(structural_hash(parse_json(print_json(q))), structural_hash(q));
}

TEST(BlockState, RejectsWhatItCannotQuantize) {
  Graph g("plus");
  g.output("m", g.state("m") + g.grad("grad"));
  g.state("unused");
  EXPECT_THROW(optim::quantize_state(g, {{"grad", BlockMap::kSqrt}}), Error);
  EXPECT_THROW(optim::quantize_state(g, {{"unused", BlockMap::kSqrt}}), Error);
  Graph r("reducing");
  Value m = r.state("m");
  r.output("m", m - row_mean(m));
  EXPECT_THROW(optim::quantize_state(r, {{"m", BlockMap::kSignedLinear}}), Error);
}

// m' = m + g with m in 8 bits: the kernel decodes, adds and encodes as the maps say, on several
// parallel tasks of blocks (96 blocks; a task is a share of them, and the rows that do not fill
// a task are a call of their own), with blocks of whole vectors and with ragged ones (100).
TEST(BlockState, KernelAppliesTheMaps) {
  for (int64_t block : {kBlock, int64_t{100}})
    for (BlockMap map : {BlockMap::kSignedLinear, BlockMap::kSqrt}) {
      const bool linear = map == BlockMap::kSignedLinear;
      const std::string what =
          std::string(linear ? "signed linear" : "sqrt") + ", blocks of " + std::to_string(block);
      Graph g("plus");
      g.output("m", g.state("m") + g.grad("grad"));
      auto k = testing::shared_engine().kernel(optim::quantize_state(g, {{"m", map}}));
      const int64_t n = 96 * block;
      std::vector<double> m0(n), grad(n);
      for (int64_t i = 0; i < n; ++i) {
        m0[i] = testing::gen(1, uint64_t(i)) * std::ldexp(1.0, int(i / block % 9) - 4);
        grad[i] = testing::gen(2, uint64_t(i)) * 0.1;
        if (!linear) m0[i] = std::fabs(m0[i]), grad[i] = std::fabs(grad[i]);
        if (i / block == 7) m0[i] = grad[i] = 0;  // an all-zero block
      }
      Blocks state = quantize(m0, map, block);
      std::vector<float> g32(grad.begin(), grad.end());
      std::vector<double> want(n);
      for (int64_t i = 0; i < n; ++i)
        want[i] = decode(state.codes[i], state.absmax[i / block], map) + double(g32[i]);
      const Blocks expected = quantize(want, map, block);
      KernelCall call;
      for (const auto& in : k->signature().inputs)
        call.inputs.push_back(in.name == "grad" ? static_cast<void*>(g32.data())
                              : in.name == "m"  ? static_cast<void*>(state.codes.data())
                                                : static_cast<void*>(state.absmax.data()));
      for (const auto& out : k->signature().outputs)
        call.outputs.push_back(out.row_state ? static_cast<void*>(state.absmax.data())
                                             : static_cast<void*>(state.codes.data()));
      call.n = n;
      call.cols = block;
      k->run(call);
      expect_blocks(state, expected, what);
      EXPECT_EQ(state.absmax[7], 0.0f) << what;
      EXPECT_EQ(state.codes[7 * block], linear ? 127 : 0) << what;
    }
}

// A block lives on the stack while it is updated: longer rows are refused, naming the state.
TEST(BlockState, RowsLongerThanTheLimitAreRefused) {
  Graph g("plus");
  g.output("m", g.state("m") + g.grad("grad"));
  auto k =
      testing::shared_engine().kernel(optim::quantize_state(g, {{"m", BlockMap::kSignedLinear}}));
  std::vector<float> grad(2 * kMaxRowStateCols), scale(1);
  std::vector<uint8_t> codes(grad.size());
  KernelCall call;
  for (const auto& in : k->signature().inputs)
    call.inputs.push_back(in.name == "grad" ? static_cast<void*>(grad.data())
                          : in.name == "m"  ? static_cast<void*>(codes.data())
                                            : static_cast<void*>(scale.data()));
  for (const auto& out : k->signature().outputs)
    call.outputs.push_back(out.row_state ? static_cast<void*>(scale.data())
                                         : static_cast<void*>(codes.data()));
  call.n = call.cols = 2 * kMaxRowStateCols;
  try {
    k->run(call);
    FAIL() << "a row of " << call.cols << " elements ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row state (\"m.absmax\")"), std::string::npos)
        << e.what();
  }
}

// AdamW (the registry's rule graph) with both moments in 8 bits: the kernel against the
// interpreter on the same graph, one step from quantized state.
TEST(BlockState, AdamWKernelMatchesTheInterpreter) {
  auto rule = optim::make_rule("adamw");
  Options h = optim::merge(optim::with_precision_defaults(rule->defaults()),
                           {{"lr", 1e-2}, {"weight_decay", 0.1}}, "adamw", "param group");
  const Graph q = optim::quantize_state(
      rule->graph(h), {{"exp_avg", BlockMap::kSignedLinear}, {"exp_avg_sq", BlockMap::kSqrt}});
  auto k = testing::shared_engine().kernel(q);
  const int64_t n = 64 * kBlock;
  std::vector<double> p(n), grad(n), m(n), v(n);
  for (int64_t i = 0; i < n; ++i) {
    p[i] = testing::gen(3, uint64_t(i));
    grad[i] = testing::gen(4, uint64_t(i)) * 1e-2;
    m[i] = grad[i] * 0.5;
    v[i] = grad[i] * grad[i] * 0.7;
  }
  const Blocks m8 = quantize(m, BlockMap::kSignedLinear), v8 = quantize(v, BlockMap::kSqrt);
  std::map<std::string, double> scalars;
  optim::HostState host = rule->initial_host_state(h);
  rule->scalars(h, optim::TensorStep{5, false, &host}, &scalars);
  // Interpreter inputs: every tensor as the kernel stores it.
  std::map<std::string, std::vector<double>> tensors = {
      {"param", std::vector<double>(p.begin(), p.end())},
      {"grad", grad},
      {"exp_avg", std::vector<double>(m8.codes.begin(), m8.codes.end())},
      {"exp_avg_sq", std::vector<double>(v8.codes.begin(), v8.codes.end())},
      {"exp_avg.absmax", std::vector<double>(m8.absmax.begin(), m8.absmax.end())},
      {"exp_avg_sq.absmax", std::vector<double>(v8.absmax.begin(), v8.absmax.end())}};
  std::map<std::string, double> used;
  for (const Node& node : q.nodes())
    if (node.op == Op::Scalar) used[node.name] = scalars.at(node.name);
  auto want = interpret(q, tensors, used, kBlock);

  std::vector<float> p32(p.begin(), p.end()), g32(grad.begin(), grad.end());
  Blocks m_got = m8, v_got = v8;
  std::map<std::string, void*> buffers = {{"param", p32.data()},
                                          {"grad", g32.data()},
                                          {"exp_avg", m_got.codes.data()},
                                          {"exp_avg_sq", v_got.codes.data()},
                                          {"exp_avg.absmax", m_got.absmax.data()},
                                          {"exp_avg_sq.absmax", v_got.absmax.data()}};
  KernelCall call;
  for (const auto& in : k->signature().inputs) call.inputs.push_back(buffers.at(in.name));
  for (const auto& s : k->signature().scalars) call.scalars.push_back(scalars.at(s.name));
  for (const auto& out : k->signature().outputs) call.outputs.push_back(buffers.at(out.replaces));
  call.n = n;
  call.cols = kBlock;
  k->run(call);

  auto as_blocks = [&](const std::string& name) {
    Blocks b;
    for (double c : want.at(name)) b.codes.push_back(static_cast<uint8_t>(c));
    for (double s : want.at(name + ".absmax")) b.absmax.push_back(static_cast<float>(s));
    return b;
  };
  expect_blocks(m_got, as_blocks("exp_avg"), "exp_avg");
  expect_blocks(v_got, as_blocks("exp_avg_sq"), "exp_avg_sq");
  // The params: f32 arithmetic against double, on a step of about lr: within 2 ulps of the
  // param plus 1e-5 of the step.
  for (int64_t i = 0; i < n; ++i)
    ASSERT_NEAR(p32[i], want.at("param")[i], 2 * std::ldexp(std::fabs(p[i]), -23) + 1e-7)
        << "element " << i;
}

}  // namespace
}  // namespace optfuse
