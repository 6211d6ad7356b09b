// Lowering: every op against the interpreter, sizes and tails, in-place aliasing, the fast
// sqrt/rsqrt error bound, dtypes, schedules, and where uniform subexpressions are computed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <random>
#include <regex>
#include <sstream>

#include "optfuse/engine.h"
#include "optfuse/error.h"
#include "support/engine.h"
#include "support/float_bits.h"
#include "support/gen.h"
#include "support/run_kernel.h"

namespace optfuse {
namespace {

using testing::Aliasing;
using testing::expect_close;
using testing::gen;
using ::testing::HasSubstr;
using testing::run_kernel;
using testing::Scalars;
using testing::Tensors;

Engine& engine() { return testing::shared_engine(); }

// n values in [lo, hi), f32-exact.
std::vector<double> uniform(uint32_t seed, size_t n, double lo, double hi) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = float(lo + (hi - lo) * (gen(seed, i) + 1) / 2);
  return v;
}

// torch's fused AdamW form: bias corrections and 1-beta folded into host scalars.
Graph adamw(DType t = DType::F32) {
  Graph g("adamw");
  Value p = g.param("p", t), grad = g.grad("g", t), m = g.state("m", t), v = g.state("v", t);
  Value one_minus_b1 = g.scalar("one_minus_b1", t), b2 = g.scalar("b2", t);
  Value one_minus_b2 = g.scalar("one_minus_b2", t), inv_bc2_sqrt = g.scalar("inv_bc2_sqrt", t);
  Value eps = g.scalar("eps", t), step_size = g.scalar("step_size", t),
        decay = g.scalar("decay", t);
  Value m2 = m + one_minus_b1 * (grad - m);
  Value v2 = b2 * v + one_minus_b2 * grad * grad;
  Value denom = sqrt(v2) * inv_bc2_sqrt + eps;
  g.output("p", p * decay - step_size * m2 / denom);
  g.output("m", m2);
  g.output("v", v2);
  return g;
}

Scalars adamw_scalars() {
  double b1 = 0.9, b2 = 0.999, lr = 1e-3, wd = 0.01;
  int step = 3;
  return {{"one_minus_b1", 1 - b1},
          {"b2", b2},
          {"one_minus_b2", 1 - b2},
          {"inv_bc2_sqrt", 1 / std::sqrt(1 - std::pow(b2, step))},
          {"eps", 1e-8},
          {"step_size", lr / (1 - std::pow(b1, step))},
          {"decay", 1 - lr * wd}};
}

Tensors adamw_data(size_t n) {
  Tensors t{{"p", uniform(1, n, -1, 1)},
            {"g", uniform(2, n, -1, 1)},
            {"m", uniform(3, n, -0.1, 0.1)},
            {"v", uniform(4, n, 0, 0.01)}};
  return t;
}

// ---- Every op in ops.def ---------------------------------------------------------------------

struct Domain {
  double lo, hi;    // first operand
  double lo2, hi2;  // second operand (and scalars)
};

// Inputs valid for each op. No default: a new op in ops.def draws a -Wswitch warning here and
// fails the test below, until it has a domain.
bool domain_of(Op op, Domain* d) {
  switch (op) {
    case Op::Input:
    case Op::Scalar:
    case Op::Const:
      return false;
    case Op::Sqrt:
    case Op::Rsqrt:
    case Op::Log:
      *d = {1e-3, 100, 1e-3, 100};
      return true;
    case Op::Exp:
      *d = {-5, 5, -5, 5};
      return true;
    case Op::Pow:
      *d = {0.1, 10, -2, 2};
      return true;
    case Op::Div:
      *d = {-1, 1, 0.5, 2};
      return true;
    case Op::Add:
    case Op::Sub:
    case Op::Mul:
    case Op::Min:
    case Op::Max:
    case Op::Neg:
    case Op::Abs:
    case Op::Sign:
    case Op::Lt:
    case Op::Le:
    case Op::Gt:
    case Op::Ge:
    case Op::Eq:
    case Op::Ne:
    case Op::Select:
    case Op::Cast:
    case Op::Strict:
    case Op::RoundSR:
    case Op::IsFinite:
      *d = {-1, 1, -1, 1};
      return true;
    // Not element-wise: tests/test_reduce.cpp and tests/test_reduce_cols.cpp.
    case Op::ReduceSum:
    case Op::ReduceMean:
    case Op::ReduceMax:
    case Op::ReduceMin:
    case Op::RowSum:
    case Op::RowMean:
    case Op::RowMax:
    case Op::RowMin:
    case Op::ColSum:
    case Op::ColMean:
    case Op::ColMax:
    case Op::ColMin:
    case Op::Opaque:  // never in a kernel: tests/test_partition.cpp
      return false;
  }
  return false;
}

// Applies `op` to operands (result converted back to f32 for bool and cast results).
Value apply(Graph& g, Op op, Value a, Value b) {
  if (op == Op::Select) return select(a < b, a, b);
  if (op == Op::Cast) return cast(cast(a, DType::BF16), DType::F32);  // rounds through bf16
  if (op == Op::RoundSR)  // the same bits as the interpreter's, element by element
    return cast(round_sr(a, g.constant(0x12345678, DType::F64)), DType::F32);
  std::vector<Value> args{a};
  if (op_arity(op) == 2) args.push_back(b);
  Value r = g.make(op, args);
  return r.node().dtype == DType::Bool ? cast(r, DType::F32) : r;
}

// a' = op(a, b) per element; b' = op(a, t) with a scalar operand (op(s) for unary ops: a uniform
// output); c' = c + op(s, t), all uniform operands (computed once in the uniforms Func, exact).
Graph op_graph(Op op) {
  Graph g(std::string(op_name(op)));
  Value a = g.param("a"), b = g.grad("b"), c = g.state("c"), s = g.scalar("s"), t = g.scalar("t");
  g.output("a", apply(g, op, a, b));
  g.output("b", apply(g, op, op_arity(op) == 1 ? s : a, t));
  g.output("c", c + apply(g, op, s, t));
  return g;
}

// Every element-wise op, generated from the X-macro: an op added to ops.def is tested here
// (reductions in tests/test_reduce.cpp and test_reduce_cols.cpp, opaque ops in
// tests/test_partition.cpp).
std::vector<Op> operations() {
  std::vector<Op> ops;
#define OPTFUSE_OP(e, text, arity, flags) \
  if (!op_has(Op::e, kLeaf | kReduce | kRowReduce | kColReduce | kOpaque)) ops.push_back(Op::e);
#include "optfuse/ops.def"
#undef OPTFUSE_OP
  return ops;
}

class EveryOp : public ::testing::TestWithParam<Op> {};

TEST_P(EveryOp, MatchesInterpreterOnF32) {
  Op op = GetParam();
  Domain d;
  ASSERT_TRUE(domain_of(op, &d)) << "no test domain for op " << op_name(op);
  Graph g = op_graph(op);
  size_t n = 1000 + 13;
  Tensors in{{"a", uniform(1, n, d.lo, d.hi)},
             {"b", uniform(2, n, d.lo2, d.hi2)},
             {"c", uniform(3, n, -1, 1)}};
  for (size_t i = 0; i < n; i += 7) in["b"][i] = in["a"][i];  // ties for comparisons, min, max
  // s from the first operand's domain, t from the second's.
  Scalars sc{{"s", float(d.lo + 0.7 * (d.hi - d.lo))}, {"t", float(d.lo2 + 0.3 * (d.hi2 - d.lo2))}};
  // 2e-6: a few f32 roundings, the fast sqrt/rsqrt bound (~4 ulp), libm's exp/log/pow.
  expect_close(run_kernel(*engine().kernel(g), in, sc), interpret(g, in, sc), 2e-6, 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Ops, EveryOp, ::testing::ValuesIn(operations()),
                         [](const auto& info) { return std::string(op_name(info.param)); });

// ---- Sizes, tails, aliasing ------------------------------------------------------------------

class Sizes : public ::testing::TestWithParam<size_t> {};

TEST_P(Sizes, AdamWMatchesInterpreterInPlaceAndNot) {
  size_t n = GetParam();
  Graph g = adamw();
  auto k = engine().kernel(g);
  Tensors in = adamw_data(n);
  Tensors want = interpret(g, in, adamw_scalars());
  expect_close(run_kernel(*k, in, adamw_scalars(), Aliasing::InPlace), want, 1e-5, 1e-6);
  expect_close(run_kernel(*k, in, adamw_scalars(), Aliasing::OutOfPlace), want, 1e-5, 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Lower, Sizes, ::testing::Values(0, 1, 7, 1000, (1u << 20) + 3));

// Outputs stored before another output reads the input they overwrite: a' = a + b is stored
// first (outputs are sorted by name), then b' and c' read a. In place must still see the old a.
TEST(InPlace, OutputsNeverReadAStoredValue) {
  Graph g("cross");
  Value a = g.param("a"), b = g.grad("b"), c = g.state("c");
  g.output("a", a + b);
  g.output("b", b * a);
  g.output("c", a - c);
  auto k = engine().kernel(g);
  for (size_t n : {size_t(5), size_t(1000), size_t(1 << 20) + 3}) {
    Tensors in{
        {"a", uniform(1, n, -1, 1)}, {"b", uniform(2, n, -1, 1)}, {"c", uniform(3, n, -1, 1)}};
    expect_close(run_kernel(*k, in, {}, Aliasing::InPlace), interpret(g, in, {}), 1e-7);
  }
}

// The guarantee behind in-place correctness is structural, not LLVM's alias analysis (which
// happens to hide the hazard in the test above): in the per-element loop, inputs are read only
// into the `load` Func, which is produced before any output of the vector is stored.
TEST(InPlace, InputsAreReadOnlyByTheLoadFunc) {
  std::string stmt = engine().lowered_stmt(adamw());
  size_t body = stmt.find("_par_for_"), main = stmt.find("external_plus_metadata func");
  ASSERT_LT(body, main);
  std::istringstream loop(stmt.substr(body, main - body));
  std::regex input_read(R"(in\d+_\w+\[)");
  std::regex into_load(R"(^\s*load(\$\d+)?\.\d+\[)");  // Halide may suffix reused Func names
  int reads = 0;
  for (std::string line; std::getline(loop, line);) {
    if (!std::regex_search(line, input_read)) continue;
    ++reads;
    EXPECT_TRUE(std::regex_search(line, into_load)) << line;
  }
  EXPECT_GE(reads, 4);
}

TEST(Schedules, VectorWidthsAndTaskCountsAgree) {
  Graph g = adamw();
  size_t n = (1 << 16) + 5;
  Tensors in = adamw_data(n);
  Tensors want = interpret(g, in, adamw_scalars());
  for (int vw : {8, 16, 32}) {
    for (int tasks : {1, 4}) {
      Schedule s;
      s.vector_width = vw;
      s.tasks_per_thread = tasks;
      s.min_task = 1024;
      expect_close(run_kernel(*engine().kernel(g, s), in, adamw_scalars()), want, 1e-5, 1e-6);
    }
  }
}

// ---- Precision -------------------------------------------------------------------------------

using testing::bits_of;
using testing::f32_of;

// Distance in units in the last place between two finite floats of the same sign.
int64_t ulps(float a, float b) { return std::llabs(int64_t(bits_of(a)) - int64_t(bits_of(b))); }

TEST(Precision, SqrtExactAndRsqrtWithinFourUlp) {
  Graph g("roots");
  Value a = g.param("a"), b = g.grad("b");
  g.output("a", sqrt(a));
  g.output("b", rsqrt(b));
  auto k = engine().kernel(g);

  std::vector<double> x;
  std::mt19937 rng(7);
  for (int i = 0; i < (1 << 20); ++i)
    x.push_back(f32_of(rng() % 0x7f800000u));  // every finite >= 0
  for (float v : {FLT_MIN, FLT_MIN / 2, FLT_TRUE_MIN, 1e-40f, 1.0f, 2.0f, 4.0f, FLT_MAX, 3e38f})
    x.push_back(v);
  Tensors out = run_kernel(*k, {{"a", x}, {"b", x}}, {});
  int64_t worst_sqrt = 0, worst_rsqrt = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    worst_sqrt = std::max(worst_sqrt, ulps(float(out["a"][i]), float(std::sqrt(x[i]))));
    worst_rsqrt = std::max(worst_rsqrt, ulps(float(out["b"][i]), float(1 / std::sqrt(x[i]))));
  }
  EXPECT_EQ(worst_sqrt, 0);  // exact
  EXPECT_LE(worst_rsqrt, 4);
  RecordProperty("worst_sqrt_ulp", int(worst_sqrt));
  RecordProperty("worst_rsqrt_ulp", int(worst_rsqrt));
}

TEST(Precision, SqrtAndRsqrtSpecialValues) {
  Graph g("roots");
  Value a = g.param("a"), b = g.grad("b");
  g.output("a", sqrt(a));
  g.output("b", rsqrt(b));
  auto k = engine().kernel(g);
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  std::vector<double> x{0.0, -0.0, inf, -1.0, -inf, nan, 1e-45, 4.0};
  Tensors out = run_kernel(*k, {{"a", x}, {"b", x}}, {});
  const std::vector<double>& s = out["a"];
  const std::vector<double>& r = out["b"];
  EXPECT_EQ(s[0], 0.0);
  EXPECT_EQ(s[1], 0.0);
  EXPECT_TRUE(std::signbit(s[1]));
  EXPECT_EQ(s[2], inf);
  EXPECT_TRUE(std::isnan(s[3]));
  EXPECT_TRUE(std::isnan(s[4]));
  EXPECT_TRUE(std::isnan(s[5]));
  EXPECT_LE(ulps(float(s[6]), float(std::sqrt(double(1e-45f)))), 4);
  EXPECT_LE(ulps(float(s[7]), 2.0f), 4);
  EXPECT_EQ(r[0], inf);
  EXPECT_EQ(r[1], -inf);  // 1/sqrt(-0) = 1/-0
  EXPECT_EQ(r[2], 0.0);
  EXPECT_TRUE(std::isnan(r[3]));
  EXPECT_TRUE(std::isnan(r[4]));
  EXPECT_TRUE(std::isnan(r[5]));
  EXPECT_LE(ulps(float(r[6]), float(1 / std::sqrt(double(1e-45f)))), 4) << r[6];
  EXPECT_LE(ulps(float(r[7]), 0.5f), 4);
}

// f32 division is the IEEE divide (lower_ops.cpp): the correctly rounded quotient whatever the
// operands' exponents (subnormal, huge and ordinary divisors alike), so a later fast path that
// loses accuracy anywhere fails here. Subnormal quotients are compared absolutely.
TEST(Precision, DivisionIsExact) {
  Graph g("quotient");
  Value a = g.param("a"), b = g.grad("b");
  g.output("a", a / b);
  auto k = engine().kernel(g);

  std::vector<double> num, den;
  std::mt19937 rng(11);
  for (int i = 0; i < (1 << 20); ++i) {
    float x = f32_of(rng() % 0x7f800000u), y = f32_of(rng() % 0x7f800000u);
    num.push_back((rng() & 1) ? -x : x);
    den.push_back((rng() & 1) ? -y : y);
  }
  for (float y : {FLT_MIN, FLT_MIN / 2, FLT_TRUE_MIN, 1e-40f, 1.0f, 3.0f, 1e30f, FLT_MAX, 3e38f})
    for (float x : {1.0f, 1e-40f, 1e30f, FLT_MAX, FLT_TRUE_MIN}) {
      num.push_back(x);
      den.push_back(y);
    }
  Tensors out = run_kernel(*k, {{"a", num}, {"b", den}}, {});
  int64_t worst = 0;
  for (size_t i = 0; i < num.size(); ++i) {
    float want = float(num[i] / den[i]);
    if (std::isinf(want)) {
      EXPECT_EQ(out["a"][i], want) << num[i] << " / " << den[i];
      continue;
    }
    if (std::fabs(want) < FLT_MIN) {
      EXPECT_NEAR(out["a"][i], want, FLT_MIN) << num[i] << " / " << den[i];
      continue;
    }
    worst = std::max(worst, ulps(float(out["a"][i]), want));
  }
  EXPECT_EQ(worst, 0);
  RecordProperty("worst_div_ulp", int(worst));
}

TEST(Precision, DivisionSpecialValues) {
  Graph g("quotient");
  Value a = g.param("a"), b = g.grad("b");
  g.output("a", a / b);
  auto k = engine().kernel(g);
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  std::vector<double> x{1.0, -1.0, 0.0, 2.0, inf, 3.0, nan, 1.0, 6.0};
  std::vector<double> y{0.0, 0.0, 0.0, inf, inf, -inf, 1.0, nan, 3.0};
  Tensors out = run_kernel(*k, {{"a", x}, {"b", y}}, {});
  const std::vector<double>& q = out["a"];
  EXPECT_EQ(q[0], inf);
  EXPECT_EQ(q[1], -inf);
  EXPECT_TRUE(std::isnan(q[2]));
  EXPECT_EQ(q[3], 0.0);
  EXPECT_TRUE(std::isnan(q[4]));
  EXPECT_EQ(q[5], 0.0);
  EXPECT_TRUE(std::signbit(q[5]));
  EXPECT_TRUE(std::isnan(q[6]));
  EXPECT_TRUE(std::isnan(q[7]));
  EXPECT_EQ(q[8], 2.0);
}

TEST(Precision, MinMaxPropagateNaN) {
  Graph g("minmax");
  Value a = g.param("a"), b = g.grad("b");
  g.output("a", max(a, b));
  g.output("b", min(a, b));
  auto k = engine().kernel(g);
  const double nan = std::nan("");
  Tensors out = run_kernel(*k, {{"a", {nan, 1, 2, 3}}, {"b", {1, nan, 3, 2}}}, {});
  EXPECT_TRUE(std::isnan(out["a"][0]));
  EXPECT_TRUE(std::isnan(out["a"][1]));
  EXPECT_TRUE(std::isnan(out["b"][0]));
  EXPECT_TRUE(std::isnan(out["b"][1]));
  EXPECT_EQ(out["a"][2], 3);
  EXPECT_EQ(out["b"][3], 2);
}

// ---- Dtypes ----------------------------------------------------------------------------------

TEST(Dtypes, F64AdamWIsExactToDoubleRounding) {
  Graph g = adamw(DType::F64);
  Tensors in = adamw_data(1003);
  expect_close(run_kernel(*engine().kernel(g), in, adamw_scalars()),
               interpret(g, in, adamw_scalars()), 1e-12, 1e-15);
}

TEST(Dtypes, Bf16AndF16RoundPerOp) {
  for (DType t : {DType::BF16, DType::F16}) {
    Graph g("sgd16");
    Value p = g.param("p", t), grad = g.grad("g", t), lr = g.scalar("lr", t);
    g.output("p", p - lr * grad);
    Tensors in{{"p", uniform(1, 1000, -1, 1)}, {"g", uniform(2, 1000, -1, 1)}};
    double eps = t == DType::BF16 ? std::ldexp(1, -8) : std::ldexp(1, -11);
    // Two roundings in the kernel (lr*g, then p - .) against one in the interpreter's cast-free
    // double evaluation: within 2 ulp of the result's magnitude (1).
    expect_close(run_kernel(*engine().kernel(g), in, {{"lr", 0.3}}),
                 interpret(g, in, {{"lr", 0.3}}), 2 * eps, 2 * eps);
  }
}

// ---- Where uniform subexpressions are computed ----------------------------------------------

// lr*wd and 1 - lr*wd depend only on scalars: they must be computed once per call in the
// root-computed `uniforms` Func, and the per-element loop must only read its result.
TEST(Uniforms, ComputedOncePerCallOutsideTheLoop) {
  Graph g("decay");
  Value p = g.param("p"), grad = g.grad("g"), lr = g.scalar("lr"), wd = g.scalar("wd");
  g.output("p", p * (1.0 - lr * wd) - lr * grad);
  std::string stmt = engine().lowered_stmt(g);

  // Halide outlines the parallel loop body into its own function, "..._par_for_...".
  size_t body = stmt.find("_par_for_");
  size_t main = stmt.find("external_plus_metadata func");
  ASSERT_NE(body, std::string::npos) << stmt;
  ASSERT_NE(main, std::string::npos) << stmt;
  ASSERT_LT(body, main) << stmt;
  std::string loop = stmt.substr(body, main - body);
  EXPECT_THAT(loop, HasSubstr("uniforms"));
  EXPECT_THAT(loop, ::testing::Not(HasSubstr("s1_wd"))) << loop;  // the scalar wd stays outside

  size_t produce = stmt.find("produce uniforms", main);
  size_t par_for = stmt.find("halide_do_par_for", main);
  ASSERT_NE(produce, std::string::npos) << stmt;
  ASSERT_NE(par_for, std::string::npos) << stmt;
  EXPECT_LT(produce, par_for);  // computed before the parallel loop starts
  std::string uniforms = stmt.substr(produce, par_for - produce);
  EXPECT_THAT(uniforms, HasSubstr("s0_lr"));
  EXPECT_THAT(uniforms, HasSubstr("s1_wd"));
}

TEST(Lower, GraphWithoutOutputsIsAnError) {
  Graph g("empty");
  g.param("p");
  EXPECT_THAT([&] { engine().kernel(g); },
              ::testing::ThrowsMessage<Error>(HasSubstr("no outputs")));
}

}  // namespace
}  // namespace optfuse
