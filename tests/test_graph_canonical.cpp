// canonicalize() and structural_hash(): folding, exact identities, CSE, dead nodes, canonical
// order independent of construction order, semantics preserved, and the committed golden key.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "optfuse/error.h"
#include "optfuse/graph.h"
#include "support/gen.h"

namespace optfuse {
namespace {

// Canonical text of a graph given as text (tests read as IR in, IR out).
std::string canonical(const std::string& text) { return print(canonicalize(parse(text))); }

// AdamW in torch's fused form, written plainly.
Graph adamw_plain() {
  Graph g("adamw");
  Value p = g.param("p"), gr = g.grad("g");
  Value m = g.state("exp_avg"), v = g.state("exp_avg_sq");
  Value lr = g.scalar("lr"), b1 = g.scalar("beta1"), b2 = g.scalar("beta2");
  Value eps = g.scalar("eps"), wd = g.scalar("weight_decay");
  Value bc1 = g.scalar("bias_correction1"), bc2 = g.scalar("bias_correction2");
  Value m2 = b1 * m + (1.0 - b1) * gr;
  Value v2 = b2 * v + (1.0 - b2) * gr * gr;
  Value decayed = p - lr * wd * p;
  Value denom = sqrt(v2) / sqrt(bc2) + eps;
  g.output("p", decayed - lr / bc1 * (m2 / denom));
  g.output("exp_avg", m2);
  g.output("exp_avg_sq", v2);
  return g;
}

// The same update: leaves declared in another order, commutative operands swapped, the second
// moment built first, outputs declared in another order, and a 1 spelt as 0.5 * 2 and x * 1.
Graph adamw_shuffled() {
  Graph g("adamw, other way round");
  Value bc2 = g.scalar("bias_correction2"), eps = g.scalar("eps");
  Value v = g.state("exp_avg_sq"), gr = g.grad("g");
  Value b2 = g.scalar("beta2"), b1 = g.scalar("beta1"), lr = g.scalar("lr");
  Value m = g.state("exp_avg"), p = g.param("p");
  Value wd = g.scalar("weight_decay"), bc1 = g.scalar("bias_correction1");
  Value one = g.constant(0.5) * g.constant(2.0);
  Value v2 = gr * (gr * (one - b2)) + v * b2;
  g.output("exp_avg_sq", v2);
  Value m2 = gr * (one - b1) + m * b1;
  g.output("exp_avg", m2 * 1.0);
  Value denom = eps + sqrt(v2) / sqrt(bc2);
  Value decayed = p - p * (wd * lr);
  decayed = p - (lr * wd) * p;
  g.output("p", decayed - (m2 / denom) * (lr / bc1));
  return g;
}

// SGD with weight decay: p' = p - lr * (g + wd * p).
Graph sgd() {
  Graph g("sgd");
  Value p = g.param("p"), gr = g.grad("g");
  Value lr = g.scalar("lr"), wd = g.scalar("weight_decay");
  g.output("p", p - lr * (gr + wd * p));
  return g;
}

TEST(Fold, AllConstantOperandsBecomeOneConstant) {
  EXPECT_EQ(canonical(R"(graph "g" {
    %0 = param.f32 "p"
    %1 = const.f32 2
    %2 = const.f32 3
    %3 = mul.f32 %1, %2
    %4 = sqrt.f32 %3
    %5 = add.f32 %0, %4
    %6 = lt.bool %1, %2
    %7 = select.f32 %6, %5, %0
    out "p" = %7
  })"),
            R"(graph "g" {
  %0 = param.f32 "p"
  %1 = const.f32 2.4494898319244385
  %2 = add.f32 %1, %0
  out "p" = %2
}
)");
}

// The Const operand of the binary op an output is bound to.
const Node& constant_operand(const Graph& g, const Output& o) {
  for (NodeId a : g.node(o.value).args)
    if (g.node(a).op == Op::Const) return g.node(a);
  ADD_FAILURE() << "no constant operand in\n" << print(g);
  return g.node(o.value);
}

TEST(Fold, ResultIsRoundedOnceToTheNodeDtype) {
  Graph g;
  Value p = g.param("p"), h = g.state("h", DType::BF16);
  g.output("p", p + g.constant(1) / g.constant(3));
  g.output("h", h + cast(g.constant(1.00390625, DType::F64), DType::BF16));
  Graph c = canonicalize(g);
  ASSERT_EQ(c.outputs()[1].replaces, "p");  // outputs are sorted: "h", "p"
  const Node& third = constant_operand(c, c.outputs()[1]);
  EXPECT_EQ(third.value, double(float(1.0 / 3)));
  const Node& bf16_one = constant_operand(c, c.outputs()[0]);
  EXPECT_EQ(bf16_one.dtype, DType::BF16);
  EXPECT_EQ(bf16_one.value, 1.0);  // 1 + 2^-8 ties to even in bf16
}

TEST(Identities, ExactOnesAreRemoved) {
  EXPECT_EQ(canonical(R"(graph "g" {
    %0 = param.f32 "p"
    %1 = const.f32 1
    %2 = const.f32 0
    %3 = mul.f32 %0, %1     # x * 1
    %4 = mul.f32 %1, %3     # 1 * x
    %5 = sub.f32 %4, %2     # x - 0
    %6 = div.f32 %5, %1     # x / 1
    %7 = neg.f32 %6
    %8 = neg.f32 %7         # --x
    %9 = cast.f32 %8        # to its own dtype
    %10 = lt.bool %2, %1
    %11 = select.f32 %10, %9, %0  # constant condition
    %12 = sqrt.f32 %11
    out "p" = %12
  })"),
            R"(graph "g" {
  %0 = param.f32 "p"
  %1 = sqrt.f32 %0
  out "p" = %1
}
)");
}

TEST(Identities, InexactOnesAreKept) {
  // x + 0 (-0 + 0 is +0), x - (-0) (likewise), 0 * x (0 * inf is NaN), x * -1 and x / x.
  const std::string text = R"(graph "g" {
  %0 = param.f32 "p"
  %1 = const.f32 0
  %2 = add.f32 %0, %1
  %3 = const.f32 -0
  %4 = sub.f32 %2, %3
  %5 = mul.f32 %4, %1
  %6 = const.f32 -1
  %7 = mul.f32 %5, %6
  %8 = div.f32 %7, %7
  out "p" = %8
}
)";
  EXPECT_EQ(print(canonicalize(parse(text))).size(), text.size());
}

TEST(Cse, OperandsInEitherOrderAreOneNode) {
  EXPECT_EQ(canonical(R"(graph "g" {
    %0 = param.f32 "a"
    %1 = grad.f32 "b"
    %2 = add.f32 %0, %1
    %3 = add.f32 %1, %0
    %4 = mul.f32 %2, %3
    out "a" = %4
  })"),
            R"(graph "g" {
  %0 = param.f32 "a"
  %1 = grad.f32 "b"
  %2 = add.f32 %0, %1
  %3 = mul.f32 %2, %2
  out "a" = %3
}
)");
}

TEST(Order, LeavesSortedAndKeptDeadNodesDropped) {
  EXPECT_EQ(canonical(R"(graph "g" {
    %0 = state.f32 "a"
    %1 = scalar.f32 "z"
    %2 = grad.f32 "z_grad"
    %3 = param.f32 "w"
    %4 = scalar.f32 "lr"
    %5 = param.f32 "b"
    %6 = exp.f32 %2          # dead
    %7 = mul.f32 %3, %4
    %8 = neg.f32 %5
    out "w" = %7
    out "b" = %8
  })"),
            R"(graph "g" {
  %0 = param.f32 "b"
  %1 = param.f32 "w"
  %2 = grad.f32 "z_grad"
  %3 = state.f32 "a"
  %4 = scalar.f32 "lr"
  %5 = scalar.f32 "z"
  %6 = neg.f32 %0
  %7 = mul.f32 %4, %1
  out "b" = %6
  out "w" = %7
}
)");
}

TEST(Canonical, AdamWBuiltTwoWaysIsOneGraph) {
  Graph a = canonicalize(adamw_plain()), b = canonicalize(adamw_shuffled());
  b.set_name(a.name());
  EXPECT_EQ(print(a), print(b));
  EXPECT_EQ(structural_hash(adamw_plain()), structural_hash(adamw_shuffled()));
}

TEST(Canonical, IsIdempotent) {
  std::string once = print(canonicalize(adamw_shuffled()));
  EXPECT_EQ(print(canonicalize(parse(once))), once);
}

// Re-adds the nodes of `g` in a random topological order with commutative operands randomly
// swapped: the same update, built in another order.
Graph rebuilt_at_random(const Graph& g, std::mt19937& rng) {
  const size_t n = g.nodes().size();
  std::vector<NodeId> order(n), to_new(n, -1);
  for (size_t i = 0; i < n; ++i) order[i] = static_cast<NodeId>(i);
  std::shuffle(order.begin(), order.end(), rng);
  Graph out(g.name());
  while (out.nodes().size() < n) {
    for (NodeId id : order) {
      Node node = g.node(id);
      bool ready = to_new[id] < 0 && std::all_of(node.args.begin(), node.args.end(),
                                                 [&](NodeId a) { return to_new[a] >= 0; });
      if (!ready) continue;
      for (NodeId& a : node.args) a = to_new[a];
      if (op_has(node.op, kCommutative) && rng() % 2) std::swap(node.args[0], node.args[1]);
      to_new[id] = out.add_node(node);
      break;
    }
  }
  std::vector<Output> outputs = g.outputs();
  std::shuffle(outputs.begin(), outputs.end(), rng);
  for (const Output& o : outputs) out.output(o.replaces, out.value(to_new[o.value]));
  return out;
}

TEST(Canonical, ConstructionOrderNeverMatters) {
  const std::string want = print(canonicalize(adamw_plain()));
  std::mt19937 rng(42);
  for (int trial = 0; trial < 50; ++trial) {
    Graph g = rebuilt_at_random(adamw_plain(), rng);
    ASSERT_EQ(print(canonicalize(g)), want) << "built as:\n" << print(g);
  }
}

TEST(Canonical, PreservesTheUpdate) {
  const size_t n = 64;
  std::map<std::string, std::vector<double>> tensors;
  uint32_t seed = 1;
  for (const char* name : {"p", "g", "exp_avg", "exp_avg_sq"}) {
    std::vector<double>& t = tensors[name];
    for (size_t i = 0; i < n; ++i) t.push_back(testing::gen(seed, i));
    ++seed;
  }
  for (double& x : tensors["exp_avg_sq"]) x = x * x;
  const std::map<std::string, double> scalars = {{"lr", 1e-3},
                                                 {"beta1", 0.9},
                                                 {"beta2", 0.999},
                                                 {"eps", 1e-8},
                                                 {"weight_decay", 0.01},
                                                 {"bias_correction1", 0.1},
                                                 {"bias_correction2", 0.001}};
  for (const Graph& g : {adamw_plain(), adamw_shuffled()})
    EXPECT_EQ(interpret(canonicalize(g), tensors, scalars), interpret(g, tensors, scalars));
}

TEST(Hash, DifferentStructureDifferentHash) {
  const Hash128 base = structural_hash(sgd());
  auto variant = [](auto&& build_update) {
    Graph g("sgd");
    Value p = g.param("p"), gr = g.grad("g");
    Value lr = g.scalar("lr"), wd = g.scalar("weight_decay");
    g.output("p", build_update(p, gr, lr, wd));
    return structural_hash(g);
  };
  EXPECT_EQ(variant([](Value p, Value gr, Value lr, Value wd) { return p - lr * (gr + wd * p); }),
            base);
  EXPECT_NE(variant([](Value p, Value gr, Value lr, Value wd) { return p + lr * (gr + wd * p); }),
            base);
  EXPECT_NE(variant([](Value p, Value gr, Value lr, Value wd) { return p - lr * (gr - wd * p); }),
            base);
  EXPECT_NE(variant([](Value p, Value gr, Value lr, Value) { return p - lr * gr; }), base);
  EXPECT_NE(variant([](Value p, Value gr, Value lr, Value wd) { return p - wd * (gr + lr * p); }),
            base);

  Graph f64("sgd");
  Value p = f64.param("p", DType::F64), gr = f64.grad("g", DType::F64);
  Value lr = f64.scalar("lr", DType::F64), wd = f64.scalar("weight_decay", DType::F64);
  f64.output("p", p - lr * (gr + wd * p));
  EXPECT_NE(structural_hash(f64), base);

  Graph renamed("sgd");
  Value p2 = renamed.param("w"), g2 = renamed.grad("g");
  Value lr2 = renamed.scalar("lr"), wd2 = renamed.scalar("weight_decay");
  renamed.output("w", p2 - lr2 * (g2 + wd2 * p2));
  EXPECT_NE(structural_hash(renamed), base);  // names are the kernel's signature
}

TEST(Hash, GraphNameIsNotPartOfTheHash) {
  Graph a = sgd(), b = sgd();
  b.set_name("something else entirely");
  EXPECT_EQ(structural_hash(a), structural_hash(b));
}

TEST(Hash, HexIs32LowercaseDigits) {
  EXPECT_EQ((Hash128{0x0123456789abcdefull, 0xfedcba9876543210ull}.hex()),
            "0123456789abcdeffedcba9876543210");
  EXPECT_EQ(xxh3_128("").hex(), "99aa06d3014798d86001c324468d497f");  // XXH3-128 test vector
}

// GOLDEN KEY. This pins the canonical text format, the canonical order and XXH3-128 across
// processes, machines and versions: kernel caches on disk are keyed by it. If this test fails,
// a change altered the cache format; change the value only deliberately, as a cache-format change
// (old cache entries then simply miss).
TEST(Hash, GoldenKeyForSgd) {
  EXPECT_EQ(print(canonicalize(sgd())), R"(graph "sgd" {
  %0 = param.f32 "p"
  %1 = grad.f32 "g"
  %2 = scalar.f32 "lr"
  %3 = scalar.f32 "weight_decay"
  %4 = mul.f32 %0, %3
  %5 = add.f32 %4, %1
  %6 = mul.f32 %2, %5
  %7 = sub.f32 %0, %6
  out "p" = %7
}
)");
  EXPECT_EQ(structural_hash(sgd()).hex(), "095af0e282acf071cd692f01dac61624");
}

}  // namespace
}  // namespace optfuse
