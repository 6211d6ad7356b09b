// Graph building: leaves, type rules, hash-consing, outputs, error messages, op tables, and the
// reference interpreter on hand-computed values.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "optfuse/error.h"
#include "optfuse/graph.h"

namespace optfuse {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// Runs `f`, expects an optfuse::Error (not an internal one) and returns its message.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::Not(StartsWith("internal error")));
    return e.what();
  }
  ADD_FAILURE() << "no optfuse::Error thrown";
  return "";
}

TEST(OpTables, NamesRoundTripForEveryOp) {
  const Op all[] = {
#define OPTFUSE_OP(e, text, arity, flags) Op::e,
#include "optfuse/ops.def"
#undef OPTFUSE_OP
  };
  for (Op op : all) {
    Op back;
    ASSERT_TRUE(parse_op(op_name(op), &back)) << op_name(op);
    EXPECT_EQ(back, op);
    EXPECT_EQ(op_has(op, kLeaf), op_arity(op) == 0) << op_name(op);
  }
  Op ignored;
  EXPECT_FALSE(parse_op("frobnicate", &ignored));
  EXPECT_EQ(op_name(Op::Add), "add");
  EXPECT_EQ(op_arity(Op::Select), 3);
  EXPECT_TRUE(op_has(Op::Mul, kCommutative));
  EXPECT_FALSE(op_has(Op::Sub, kCommutative));
  EXPECT_TRUE(op_has(Op::Lt, kCompare));
}

TEST(OpTables, DTypesAndRoles) {
  for (DType t : {DType::F32, DType::F64, DType::F16, DType::BF16, DType::Bool}) {
    DType back;
    ASSERT_TRUE(parse_dtype(dtype_name(t), &back));
    EXPECT_EQ(back, t);
  }
  DType ignored;
  EXPECT_FALSE(parse_dtype("f8", &ignored));
  EXPECT_EQ(dtype_size(DType::F32), 4u);
  EXPECT_EQ(dtype_size(DType::F64), 8u);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::F16), 2u);
  EXPECT_EQ(dtype_size(DType::Bool), 1u);
  EXPECT_EQ(role_name(Role::Param), "param");
  EXPECT_EQ(role_name(Role::Grad), "grad");
  EXPECT_EQ(role_name(Role::State), "state");
}

TEST(InternalError, IsMarked) {
  EXPECT_THAT(
      [] {
        try {
          internal_error("broken invariant");
        } catch (const Error& e) {
          return std::string(e.what());
        }
      }(),
      "internal error: broken invariant");
}

TEST(Build, LeavesCarryRoleDtypeAndUniformity) {
  Graph g;
  Value p = g.param("p"), m = g.state("exp_avg", DType::BF16), lr = g.scalar("lr");
  EXPECT_EQ(p.node().op, Op::Input);
  EXPECT_EQ(p.node().role, Role::Param);
  EXPECT_TRUE(p.node().is_tensor);
  EXPECT_EQ(m.node().role, Role::State);
  EXPECT_EQ(m.node().dtype, DType::BF16);
  EXPECT_EQ(g.grad("g").node().role, Role::Grad);
  EXPECT_FALSE(lr.node().is_tensor);
  EXPECT_FALSE(g.constant(2).node().is_tensor);
  EXPECT_FALSE((lr * 2.0).node().is_tensor);
  EXPECT_TRUE((lr * p).node().is_tensor);
  EXPECT_EQ(g.find_input("exp_avg"), m.id());
  EXPECT_EQ(g.find_scalar("lr"), lr.id());
  EXPECT_EQ(g.find_input("lr"), -1);
  EXPECT_EQ(g.find_scalar("p"), -1);
}

TEST(Build, SameNodeTwiceIsOneNode) {
  Graph g;
  Value p = g.param("p"), lr = g.scalar("lr");
  EXPECT_EQ((p * lr).id(), (p * lr).id());
  EXPECT_EQ(g.constant(0.5).id(), g.constant(0.5).id());
  EXPECT_NE(g.constant(0.5).id(), g.constant(0.5, DType::F64).id());
  EXPECT_NE(g.constant(0.0).id(), g.constant(-0.0).id());  // bits, not ==
  EXPECT_NE((p * lr).id(), (lr * p).id());  // building is literal; canonicalize orders operands
  size_t before = g.nodes().size();
  NodeId again = g.add_node(Node{Op::Mul, DType::F32, true, {p.id(), lr.id()}, 0, "", Role::Param});
  EXPECT_EQ(again, (p * lr).id());
  EXPECT_EQ(g.nodes().size(), before);
}

TEST(Build, ConstantsAreRoundedToTheirDtype) {
  Graph g;
  EXPECT_EQ(g.constant(0.1).node().value, double(0.1f));
  EXPECT_EQ(g.constant(0.1, DType::F64).node().value, 0.1);
  EXPECT_EQ(g.constant(1.00390625, DType::BF16).node().value, 1.0);       // tie -> even
  EXPECT_EQ(g.constant(1.01171875, DType::BF16).node().value, 1.015625);  // tie -> even (up)
  EXPECT_EQ(g.constant(65520, DType::F16).node().value, HUGE_VAL);        // rounds past f16 max
  EXPECT_EQ(g.constant(65519, DType::F16).node().value, 65504);
  EXPECT_EQ(g.constant(1e40).node().value, HUGE_VAL);
  EXPECT_EQ(g.constant(-3, DType::Bool).node().value, 1);
  EXPECT_EQ(g.constant(std::nan("7")).id(), g.constant(-std::nan("")).id());  // one NaN
}

TEST(Build, ConstantOperandAdoptsTheOtherDtype) {
  Graph g;
  Value v = g.param("v", DType::F64);
  Value half = v * 0.5;
  const Node& c = g.node(half.node().args[1]);
  EXPECT_EQ(c.op, Op::Const);
  EXPECT_EQ(c.dtype, DType::F64);
  EXPECT_EQ(c.value, 0.5);
  EXPECT_EQ(g.node((0.1 - v).node().args[0]).value, 0.1);  // never rounded through f32
  Value f32_const = g.constant(0.25);
  EXPECT_EQ(g.node((f32_const + v).node().args[0]).dtype, DType::F64);
  EXPECT_EQ((v + f32_const).node().dtype, DType::F64);
}

TEST(Build, ResultDtypes) {
  Graph g;
  Value a = g.param("a"), b = g.grad("b");
  for (Value c : {a<b, a <= b, a> b, a >= b, g.make(Op::Eq, {a, b}), g.make(Op::Ne, {a, b})})
    EXPECT_EQ(c.node().dtype, DType::Bool) << op_name(c.node().op);
  Value s = select(a < b, a, b * 2.0);
  EXPECT_EQ(s.node().op, Op::Select);
  EXPECT_EQ(s.node().dtype, DType::F32);
  Value h = cast(a, DType::BF16);
  EXPECT_EQ(h.node().dtype, DType::BF16);
  EXPECT_EQ(cast(h, DType::F32).node().dtype, DType::F32);
  EXPECT_EQ(select(a < b, 1.0 * a, 0.0 * a).node().is_tensor, true);
  for (Value u : {abs(a), sign(a), sqrt(a), rsqrt(a), exp(a), log(a), -a, min(a, b), max(a, b),
                  pow(a, b), a / b, a - b})
    EXPECT_EQ(u.node().dtype, DType::F32) << op_name(u.node().op);
}

TEST(BuildErrors, OperandDtypesMustMatch) {
  Graph g;
  Value a = g.param("a"), b = g.grad("b", DType::F64);
  EXPECT_EQ(error_of([&] { a + b; }), "add: operand 2 has dtype f64 but operand 1 has f32");
  EXPECT_EQ(error_of([&] { b < a; }), "lt: operand 2 has dtype f32 but operand 1 has f64");
}

TEST(BuildErrors, SelectNeedsBoolConditionAndMatchingBranches) {
  Graph g;
  Value a = g.param("a"), b = g.grad("b", DType::BF16);
  EXPECT_EQ(error_of([&] { select(a, a, a); }),
            "select: operand 1 (the condition) has dtype f32; expected bool");
  EXPECT_EQ(error_of([&] { select(a < a, a, b); }),
            "select: operand 3 has dtype bf16 but operand 2 has f32");
}

TEST(BuildErrors, ArithmeticNeedsFloats) {
  Graph g;
  Value c = g.param("a") < g.grad("b");
  EXPECT_EQ(error_of([&] { sqrt(c); }), "sqrt: operand 1 has dtype bool; sqrt needs a float dtype");
  EXPECT_THAT(error_of([&] { c + c; }), HasSubstr("add needs a float dtype"));
  EXPECT_NO_THROW(g.make(Op::Eq, {c, c}));  // bools compare
  EXPECT_NO_THROW(cast(c, DType::F32));
}

TEST(BuildErrors, MakeChecksOpArityAndOwnership) {
  Graph g, other;
  Value a = g.param("a"), x = other.param("x");
  EXPECT_EQ(error_of([&] { g.make(Op::Add, {a}); }), "add: expects 2 operands, got 1");
  EXPECT_EQ(error_of([&] { g.make(Op::Const, {}); }),
            "make: const is a leaf; use input, scalar or constant");
  EXPECT_EQ(error_of([&] { a* x; }), "mul: operand 2 belongs to another graph");
  EXPECT_EQ(error_of([&] { a* Value(); }), "mul: operand 2 is not a built value");
  EXPECT_EQ(error_of([&] { Value() * a; }), "mul: operand 1 is not a built value");
  EXPECT_EQ(error_of([&] { sqrt(Value()); }), "sqrt: operand 1 is not a built value");
  EXPECT_EQ(error_of([&] { 2.0 - Value(); }), "sub: operand 2 is not a built value");
  EXPECT_EQ(error_of([&] { Value() / 2.0; }), "div: operand 1 is not a built value");
  EXPECT_EQ(error_of([&] { a - Value(&g, 42); }),
            "sub: operand 2 refers to %42, which does not exist");
  EXPECT_EQ(error_of([&] {
              g.add_node(Node{Op::Neg, DType::F32, true, {7}, 0, "", Role::Param});
            }),
            "neg: operand 1 refers to %7, which does not exist");
  EXPECT_EQ(error_of([&] {
              g.add_node(Node{Op::Neg, DType::F64, true, {a.id()}, 0, "", Role::Param});
            }),
            "neg: result dtype f64 should be f32");
}

TEST(BuildErrors, NamesAreUniqueAndNonEmpty) {
  Graph g;
  g.param("p");
  g.scalar("lr");
  EXPECT_EQ(error_of([&] { g.state("p"); }), "state: the name \"p\" is already declared");
  EXPECT_EQ(error_of([&] { g.param("p"); }), "param: the name \"p\" is already declared");
  EXPECT_EQ(error_of([&] { g.scalar("p"); }), "scalar: the name \"p\" is already declared");
  EXPECT_EQ(error_of([&] { g.grad("lr"); }), "grad: the name \"lr\" is already declared");
  EXPECT_EQ(error_of([&] { g.scalar(""); }), "scalar: the name must not be empty");
}

// Names are UTF-8 text without NUL (graph.h); the message names the name and its bad byte.
TEST(BuildErrors, NamesAreUtf8WithoutNul) {
  EXPECT_EQ(error_of([] { Graph g("ok\xff"); }),
            "graph name \"ok\\xff\" is not valid UTF-8: byte 0xff at offset 2 is never valid in "
            "UTF-8");
  Graph g;
  Value p = g.param("p");
  EXPECT_EQ(error_of([&] { g.set_name("\xfe"); }),
            "graph name \"\\xfe\" is not valid UTF-8: byte 0xfe at offset 0 is never valid in "
            "UTF-8");
  EXPECT_EQ(g.name(), "graph");
  EXPECT_EQ(error_of([&] { g.grad("g\xc3"); }),
            "grad name \"g\\xc3\" is not valid UTF-8: byte 0xc3 at offset 1 starts a character "
            "that is cut short");
  EXPECT_EQ(error_of([&] { g.state("\xe2\x82m"); }),
            "state name \"\\xe2\\x82m\" is not valid UTF-8: byte 0xe2 at offset 0 starts a "
            "character that is cut short");
  EXPECT_EQ(error_of([&] { g.scalar("lr\xe0\x80\x80"); }),
            "scalar name \"lr\\xe0\\x80\\x80\" is not valid UTF-8: byte 0xe0 at offset 2 starts "
            "an overlong encoding");
  EXPECT_EQ(error_of([&] { g.scalar("\xf0\x8f\xbf\xbf"); }),
            "scalar name \"\\xf0\\x8f\\xbf\\xbf\" is not valid UTF-8: byte 0xf0 at offset 0 "
            "starts an overlong encoding");
  EXPECT_EQ(error_of([&] { g.scalar(std::string("a\0b", 3)); }),
            "scalar name \"a\\x00b\" contains NUL at byte offset 1 (names are UTF-8 text without "
            "NUL)");
  EXPECT_EQ(error_of([&] { opaque("f\xff", p); }),
            "opaque name \"f\\xff\" is not valid UTF-8: byte 0xff at offset 1 is never valid in "
            "UTF-8");
  EXPECT_EQ(error_of([&] { g.output("p\x80", p); }),
            "output name \"p\\x80\" is not valid UTF-8: byte 0x80 at offset 1 is a continuation "
            "byte without a lead byte");
  EXPECT_EQ(error_of([&] { g.result("\"\xff", reduce_sum(p)); }),
            "result name \"\\\"\\xff\" is not valid UTF-8: byte 0xff at offset 1 is never valid "
            "in UTF-8");
  EXPECT_EQ(g.nodes().size(), 2u);  // p and the reduce_sum: no rejected leaf was added
  EXPECT_TRUE(g.outputs().empty());
  EXPECT_TRUE(g.results().empty());
  // Valid: 2-, 3- and 4-byte characters, U+10FFFF, control characters other than NUL.
  Value u = g.state("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf\t\x7f");
  g.output("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf\t\x7f", u * 0.5);
  g.result("\xe6\x97\xa5", reduce_sum(p));
  EXPECT_NO_THROW(Graph("\xe6\x97\xa5\n"));
}

TEST(BuildErrors, Outputs) {
  Graph g, other;
  Value p = g.param("p"), h = g.state("h", DType::BF16), lr = g.scalar("lr");
  Value x = other.param("x");
  EXPECT_EQ(error_of([&] { g.output("q", p); }), "output \"q\": no tensor input has that name");
  EXPECT_EQ(error_of([&] { g.output("lr", lr); }),
            "output \"lr\": it is a scalar, not a tensor input");
  EXPECT_EQ(error_of([&] { g.output("h", p); }),
            "output \"h\": the value has dtype f32 but the input has bf16");
  EXPECT_EQ(error_of([&] { g.output("p", x); }),
            "output \"p\": the value belongs to another graph");
  EXPECT_EQ(error_of([&] { g.output("p", Value()); }), "output \"p\": not a built value");
  g.output("p", p - lr * p);
  EXPECT_EQ(error_of([&] { g.output("p", p); }), "output \"p\": the input is already replaced");
  g.output("h", cast(cast(h, DType::F32) * 0.9, DType::BF16));
  ASSERT_EQ(g.outputs().size(), 2u);
  EXPECT_EQ(g.outputs()[0].replaces, "p");
}

TEST(Interpret, SgdWithMomentumByHand) {
  Graph g;
  Value p = g.param("p"), gr = g.grad("g"), buf = g.state("buf");
  Value lr = g.scalar("lr"), mu = g.scalar("mu");
  Value b = mu * buf + gr;
  g.output("buf", b);
  g.output("p", p - lr * b);
  auto out = interpret(g, {{"p", {1.0, -2.0}}, {"g", {0.5, 0.25}}, {"buf", {1.0, 2.0}}},
                       {{"lr", 0.5}, {"mu", 0.75}});
  // buf' = 0.75*buf + g = {1.25, 1.75}; p' = p - 0.5*buf' = {0.375, -2.875}
  EXPECT_EQ(out.at("buf"), (std::vector<double>{1.25, 1.75}));
  EXPECT_EQ(out.at("p"), (std::vector<double>{0.375, -2.875}));
}

TEST(Interpret, OpSemantics) {
  Graph g;
  Value x = g.param("x", DType::F64), y = g.grad("y", DType::F64);
  Value bits = g.state("bits", DType::F64);
  g.output("x", select(x < y, sign(x), rsqrt(y)));
  g.output("y", cast(cast(y, DType::BF16), DType::F64));
  g.output("bits", cast(cast(bits, DType::F16), DType::F64));
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto out = interpret(g,
                       {{"x", {-3, 0, -0.0, nan, 5}},
                        {"y", {4, 1, 1, 1, 4}},
                        {"bits", {1 + 1.0 / 2048, 1 + 3.0 / 2048, 70000, 1e-7, -0.0}}},
                       {});
  EXPECT_EQ(out["x"][0], -1);
  EXPECT_EQ(out["x"][1], 0);
  EXPECT_EQ(out["x"][2], 0);
  EXPECT_EQ(out["x"][3], 1);  // NaN < 1 is false -> rsqrt(1)
  EXPECT_EQ(out["x"][4], 0.5);
  EXPECT_EQ(out["bits"][0], 1);                   // tie -> even
  EXPECT_EQ(out["bits"][1], 1 + 4.0 / 2048);      // tie -> even (up)
  EXPECT_EQ(out["bits"][2], HUGE_VAL);            // past f16 max
  EXPECT_EQ(out["bits"][3], std::ldexp(2, -24));  // subnormal: 1e-7 is 1.68 * 2^-24
  EXPECT_TRUE(std::signbit(out["bits"][4]));
}

TEST(Interpret, UniformOutputIsBroadcastAndLeavesAreRounded) {
  Graph g;
  Value p = g.param("p"), lr = g.scalar("lr");
  g.output("p", lr * 2.0);
  auto out = interpret(g, {{"p", {0, 0, 0}}}, {{"lr", 0.1}});
  EXPECT_EQ(out["p"], std::vector<double>(3, 2 * double(0.1f)));
  EXPECT_EQ(interpret(g, {{"p", {}}}, {{"lr", 1}})["p"].size(), 0u);
  (void)p;
}

TEST(InterpretErrors, NameWhatIsWrong) {
  Graph g;
  Value p = g.param("p"), m = g.state("m"), lr = g.scalar("lr");
  g.output("p", p - lr * m);
  EXPECT_EQ(error_of([&] {
              interpret(g, {{"p", {1}}}, {{"lr", 1}});
            }),
            "interpret: tensor input \"m\" is missing");
  EXPECT_EQ(error_of([&] {
              interpret(g, {{"p", {1, 2}}, {"m", {1}}}, {{"lr", 1}});
            }),
            "interpret: tensor \"m\" has 1 elements but \"p\" has 2");
  EXPECT_EQ(error_of([&] {
              interpret(g, {{"p", {1}}, {"m", {1}}}, {});
            }),
            "interpret: scalar \"lr\" is missing");
  EXPECT_EQ(error_of([&] {
              interpret(g, {{"p", {1}}, {"m", {1}}, {"q", {1}}}, {{"lr", 1}});
            }),
            "interpret: the graph has no tensor input \"q\"");
  EXPECT_EQ(error_of([&] {
              interpret(g, {{"p", {1}}, {"m", {1}}}, {{"lr", 1}, {"wd", 0}});
            }),
            "interpret: the graph has no scalar \"wd\"");
}

}  // namespace
}  // namespace optfuse
