// The rule engine: matcher positives and do-not-match negatives on textual graphs, any-order
// commutative operands, repeated bindings, declining callbacks, the fixed-point driver.
#include <gtest/gtest.h>

#include "graph/rewrite.h"
#include "optfuse/error.h"
#include "optfuse/graph.h"

namespace optfuse {
namespace {

using namespace rewrite;

// The node an output is bound to.
NodeId out_node(const Graph& g, const std::string& name) {
  for (const Output& o : g.outputs())
    if (o.replaces == name) return o.value;
  return -1;
}

// x - w*(x - y): the lerp spelling, with the repeated binding x.
Pattern lerp_spelling() {
  return Pattern(
      Op::Sub,
      {tensor("x"), Pattern(Op::Mul, {uniform("w"), Pattern(Op::Sub, {any("x"), any("y")})})});
}

TEST(Matcher, RepeatedNameBindsTheSameNode) {
  Graph g = parse(R"(graph "t" {
    %0 = param.f32 "m"
    %1 = grad.f32 "g"
    %2 = scalar.f32 "w"
    %3 = sub.f32 %0, %1
    %4 = mul.f32 %3, %2
    %5 = sub.f32 %0, %4
    out "m" = %5
  })");
  Bindings b;
  ASSERT_TRUE(match(g, lerp_spelling(), out_node(g, "m"), &b));
  EXPECT_EQ(b.at("x"), 0);
  EXPECT_EQ(b.at("y"), 1);
  EXPECT_EQ(b.at("w"), 2);
}

TEST(Matcher, RepeatedNameWithDifferentNodesDoesNotMatch) {
  Graph g = parse(R"(graph "t" {
    %0 = param.f32 "m"
    %1 = grad.f32 "g"
    %2 = state.f32 "z"
    %3 = scalar.f32 "w"
    %4 = sub.f32 %2, %1
    %5 = mul.f32 %3, %4
    %6 = sub.f32 %0, %5
    out "m" = %6
  })");
  Bindings b;
  EXPECT_FALSE(match(g, lerp_spelling(), out_node(g, "m"), &b));
  EXPECT_TRUE(b.empty()) << "a failed match leaves no bindings";
}

TEST(Matcher, CommutativeOperandsMatchInAnyOrderNonCommutativeDoNot) {
  Graph g = parse(R"(graph "t" {
    %0 = param.f32 "p"
    %1 = scalar.f32 "u"
    %2 = mul.f32 %0, %1
    %3 = div.f32 %0, %1
    out "p" = %2
  })");
  Pattern mul_u_t(Op::Mul, {uniform("u"), tensor("t")});
  Pattern div_u_t(Op::Div, {uniform("u"), tensor("t")});
  Bindings b;
  EXPECT_TRUE(match(g, mul_u_t, 2, &b));  // written p * u
  EXPECT_EQ(b.at("u"), 1);
  Bindings none;
  EXPECT_FALSE(match(g, div_u_t, 3, &none));  // p / u is not u / p
}

TEST(Matcher, LeafPredicates) {
  Graph g = parse(R"(graph "t" {
    %0 = param.f32 "p"
    %1 = grad.f32 "g"
    %2 = const.f32 1
    %3 = const.f32 -0
    out "p" = %0
  })");
  Bindings b;
  EXPECT_TRUE(match(g, input(Role::Param), 0, &b));
  EXPECT_FALSE(match(g, input(Role::Param), 1, &b));
  EXPECT_TRUE(match(g, constant(1), 2, &b));
  EXPECT_FALSE(match(g, constant(0.0), 3, &b)) << "-0 is not the constant +0";
  EXPECT_FALSE(match(g, uniform(), 0, &b));
  EXPECT_TRUE(match(g, tensor(), 1, &b));
}

RuleSet lerp_rules(bool decline) {
  RuleSet rules;
  rules.add({"lerp", lerp_spelling(), [decline](Graph& g, const Match& m) -> std::optional<NodeId> {
               if (decline) return std::nullopt;
               Value x = g.value(m["x"]), y = g.value(m["y"]), w = g.value(m["w"]);
               return (x + w * (y - x)).id();
             }});
  return rules;
}

const char* kLerpUser = R"(graph "t" {
  %0 = state.f32 "m"
  %1 = grad.f32 "g"
  %2 = scalar.f32 "w"
  %3 = sub.f32 %0, %1
  %4 = mul.f32 %2, %3
  %5 = sub.f32 %0, %4
  out "m" = %5
})";

TEST(Driver, RewritesToTheNormalFormAndReportsTheRule) {
  RewriteResult r = rewrite::rewrite(parse(kLerpUser), lerp_rules(false));
  EXPECT_TRUE(r.converged);
  EXPECT_EQ(r.matched, std::vector<std::string>{"lerp"});
  Graph want = parse(R"(graph "t" {
    %0 = state.f32 "m"
    %1 = grad.f32 "g"
    %2 = scalar.f32 "w"
    %3 = sub.f32 %1, %0
    %4 = mul.f32 %2, %3
    %5 = add.f32 %0, %4
    out "m" = %5
  })");
  EXPECT_EQ(print(canonicalize(r.graph)), print(canonicalize(want)));
  EXPECT_EQ(r.passes, 2);  // one that changed, one that confirmed the fixed point
}

TEST(Driver, DecliningCallbackChangesNothingAndIsNotReported) {
  Graph g = parse(kLerpUser);
  RewriteResult r = rewrite::rewrite(g, lerp_rules(true));
  EXPECT_TRUE(r.matched.empty());
  EXPECT_EQ(print(canonicalize(r.graph)), print(canonicalize(g)));
  EXPECT_EQ(r.passes, 1);
}

TEST(Driver, RulesThatUndoEachOtherAreCaught) {
  RuleSet rules;  // sub(x, y) -> add(x, neg(y)) and back: never a fixed point
  rules.add({"to_add", Pattern(Op::Sub, {any("x"), any("y")}),
             [](Graph& g, const Match& m) -> std::optional<NodeId> {
               return (g.value(m["x"]) + (-g.value(m["y"]))).id();
             }});
  rules.add({"to_sub", Pattern(Op::Add, {any("x"), Pattern(Op::Neg, {any("y")})}),
             [](Graph& g, const Match& m) -> std::optional<NodeId> {
               return (g.value(m["x"]) - g.value(m["y"])).id();
             }});
  try {
    rewrite::rewrite(parse(kLerpUser), rules);
    FAIL() << "expected an internal error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cycle"), std::string::npos) << e.what();
  }
}

TEST(Driver, UnusedLeavesAreKeptDeadNodesDropped) {
  Graph g = parse(R"(graph "t" {
    %0 = param.f32 "p"
    %1 = scalar.f32 "unused"
    %2 = neg.f32 %0
    out "p" = %0
  })");
  RewriteResult r = rewrite::rewrite(g, RuleSet{});
  EXPECT_EQ(r.graph.nodes().size(), 2u);
  EXPECT_GE(r.graph.find_scalar("unused"), 0);
}

}  // namespace
}  // namespace optfuse
