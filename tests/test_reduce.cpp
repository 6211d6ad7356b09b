// Reductions (whole-tensor and per-row), is_finite and graph results: the IR (build errors,
// text round trip, canonical form), the kernels against the interpreter and against plain
// double-precision loops, call errors. (CUDA targets: tests/test_cuda_reduce_ptx.cpp.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "optfuse/engine.h"
#include "optfuse/error.h"
#include "support/engine.h"
#include "support/gen.h"
#include "support/run_kernel.h"

namespace optfuse {
namespace {

using testing::expect_close;
using testing::gen;
using ::testing::HasSubstr;
using testing::run_kernel;
using testing::RunOptions;
using testing::Scalars;
using testing::Tensors;

Engine& engine() { return testing::shared_engine(); }

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::Not(HasSubstr("internal error")));
    return e.what();
  }
  ADD_FAILURE() << "no optfuse::Error thrown";
  return "";
}

std::vector<double> values(uint32_t seed, size_t n, double scale = 1) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = float(scale * gen(seed, i));
  return v;
}

// The statistics pass of global-norm clipping and overflow checks: read-only, results only.
Graph stats_graph() {
  Graph g("stats");
  Value grad = g.grad("g");
  g.result("sumsq", sum_squares(grad));
  g.result("maxabs", max_abs(grad));
  g.result("nonfinite", any_nonfinite(grad));
  return g;
}

// ---- IR --------------------------------------------------------------------------------------

TEST(ReduceIR, ReductionsAreUniformRowReductionsPerElement) {
  Graph g("r");
  Value x = g.grad("x");
  EXPECT_FALSE(reduce_sum(x).node().is_tensor);
  EXPECT_TRUE(row_mean(x).node().is_tensor);
  EXPECT_EQ(is_finite(x).node().dtype, DType::Bool);
  EXPECT_TRUE(uses_rows(g));
  EXPECT_TRUE(has_reductions(g));
  EXPECT_FALSE(uses_rows(stats_graph()));
}

TEST(ReduceIR, BuildErrorsNameTheProblem) {
  Graph g("r");
  Value x = g.grad("x"), s = g.scalar("s");
  EXPECT_THAT(error_of([&] { reduce_sum(s); }), HasSubstr("reduce_sum: operand 1 (%1) is uniform"));
  EXPECT_THAT(error_of([&] { row_mean(s * 2.0); }), HasSubstr("row_mean: operand 1"));
  EXPECT_THAT(error_of([&] { reduce_max(x < x); }), HasSubstr("needs a float dtype"));
  EXPECT_THAT(error_of([&] { g.result("r", x); }),
              HasSubstr("result \"r\": the value is per-element; reduce it first"));
  g.result("r", reduce_sum(x));
  EXPECT_THAT(error_of([&] { g.result("r", reduce_max(x)); }), HasSubstr("already declared"));
  EXPECT_THAT(
      error_of([&] { parse("graph \"t\" {\n %0 = grad.f32 \"g\"\n result \"r\" = %0\n}"); }),
      HasSubstr("line 3: result \"r\": the value is per-element"));
}

TEST(ReduceIR, TextRoundTripAndCanonicalForm) {
  const char* text = R"(graph "stats" {
  %0 = grad.f32 "g"
  %1 = mul.f32 %0, %0
  %2 = reduce_sum.f32 %1
  %3 = abs.f32 %0
  %4 = reduce_max.f32 %3
  %5 = is_finite.bool %0
  %6 = row_mean.f32 %0
  %7 = sub.f32 %0, %6
  out "g" = %7
  result "sumsq" = %2
  result "maxabs" = %4
}
)";
  Graph g = parse(text);
  EXPECT_EQ(print(g), text);
  // Canonical: results sorted by name, the unused is_finite dropped.
  std::string canonical = print(canonicalize(g));
  EXPECT_THAT(canonical, HasSubstr("result \"maxabs\""));
  EXPECT_EQ(canonical.find("is_finite"), std::string::npos);
  EXPECT_LT(canonical.find("result \"maxabs\""), canonical.find("result \"sumsq\""));
  // Results are part of the structure: another result name is another hash.
  Graph other =
      parse(std::string(text).replace(std::string(text).find("\"sumsq\""), 7, "\"sumsr\""));
  EXPECT_NE(structural_hash(g), structural_hash(other));
}

// ---- Whole-tensor reductions ---------------------------------------------------------------

class StatsSizes : public ::testing::TestWithParam<size_t> {};

// Against a plain double loop: sum of squares of f32 values is accumulated in double by the
// kernel and rounded once to f32, so 1e-6 relative (~8 ulp) is generous; the max is exact.
TEST_P(StatsSizes, MatchPlainLoops) {
  size_t n = GetParam();
  Graph g = stats_graph();
  Tensors in{{"g", values(7, n, 3.0)}};
  double sumsq = 0, maxabs = -HUGE_VAL;
  for (double v : in["g"]) {
    sumsq += v * v;
    maxabs = std::max(maxabs, std::fabs(v));
  }
  Scalars got;
  Tensors outs = run_kernel(*engine().kernel(g), in, {}, RunOptions{}, &got);
  EXPECT_TRUE(outs.empty());
  EXPECT_NEAR(got["sumsq"], sumsq, 1e-6 * sumsq);
  EXPECT_EQ(got["maxabs"], float(maxabs));
  EXPECT_EQ(got["nonfinite"], 0.0);
  Scalars want = interpret_results(g, in, {});
  EXPECT_NEAR(got["sumsq"], want["sumsq"], 1e-6 * sumsq);
  EXPECT_EQ(got["maxabs"], want["maxabs"]);
}

INSTANTIATE_TEST_SUITE_P(Reduce, StatsSizes,
                         ::testing::Values(0, 1, 7, 33, 1000, 16384, 16385, 100003,
                                           (1u << 20) + 3));

TEST(Stats, NonFiniteValuesAreSeen) {
  Graph g = stats_graph();
  size_t n = 50000;
  for (double bad : {HUGE_VAL, -HUGE_VAL, std::nan("")}) {
    for (size_t at : {size_t(0), size_t(12345), n - 1}) {
      Tensors in{{"g", values(3, n)}};
      in["g"][at] = bad;
      Scalars got;
      run_kernel(*engine().kernel(g), in, {}, RunOptions{}, &got);
      EXPECT_EQ(got["nonfinite"], 1.0) << bad << " at " << at;
      if (std::isnan(bad)) {
        EXPECT_TRUE(std::isnan(got["maxabs"])) << "max propagates NaN, at " << at;
        EXPECT_TRUE(std::isnan(got["sumsq"]));
      } else {
        EXPECT_EQ(got["maxabs"], HUGE_VAL);
        EXPECT_EQ(got["sumsq"], HUGE_VAL);
      }
    }
  }
}

TEST(Stats, EmptyTensorGivesTheEmptyValues) {
  Graph g("empty");
  Value x = g.grad("x");
  g.result("sum", reduce_sum(x));
  g.result("max", reduce_max(x));
  g.result("min", reduce_min(x));
  g.result("mean", reduce_mean(x));
  Scalars got;
  run_kernel(*engine().kernel(g), {{"x", {}}}, {}, RunOptions{}, &got);
  EXPECT_EQ(got["sum"], 0.0);
  EXPECT_EQ(got["max"], -HUGE_VAL);
  EXPECT_EQ(got["min"], HUGE_VAL);
  EXPECT_TRUE(std::isnan(got["mean"]));
}

// A reduction used by the update of the same tensor (prologue + element-wise stage in one
// kernel), results computed from reductions and scalars, mean/min, and a reduction of a value
// that itself depends on a reduction (variance).
TEST(Prologue, UpdateUsesItsOwnNormInOneKernel) {
  Graph g("normalized");
  Value p = g.param("p"), grad = g.grad("g"), lr = g.scalar("lr");
  Value norm = sqrt(sum_squares(grad));
  g.output("p", p - lr * grad / (norm + 1e-6));
  Value mean = reduce_mean(grad);
  Value centered = grad - mean;
  g.result("norm", norm);
  g.result("scaled_min", reduce_min(grad) * lr);
  g.result("var", reduce_mean(centered * centered));
  auto k = engine().kernel(g);
  for (size_t n : {size_t(1), size_t(1000), size_t(300007)}) {
    Tensors in{{"p", values(1, n)}, {"g", values(2, n)}};
    Scalars sc{{"lr", 0.1}};
    Scalars got;
    // 1e-6: a few f32 roundings on top of double-accumulated, once-rounded reductions.
    expect_close(run_kernel(*k, in, sc, RunOptions{}, &got), interpret(g, in, sc), 1e-6, 1e-7);
    Scalars want = interpret_results(g, in, sc);
    for (const auto& [name, w] : want) EXPECT_NEAR(got[name], w, 1e-6 * std::fabs(w)) << name;
  }
}

// Results whose reductions no output uses still see the inputs as they were before the call,
// although the outputs overwrite those inputs in place (found by tests/test_fuzz.cpp).
TEST(InPlace, ResultsReadTheInputsBeforeOutputsOverwriteThem) {
  Graph g("in_place");
  Value p = g.param("p"), m = g.state("m");
  g.output("p", p * 0.0 + 3.0);
  g.output("m", m * 0.0 - 1.0);
  g.result("max_p", reduce_max(p));
  g.result("mean_m", reduce_mean(m));
  for (size_t n : {size_t(7), size_t(5000), size_t(200003)}) {
    Tensors in{{"p", values(1, n)}, {"m", values(2, n)}};
    Scalars got;
    run_kernel(*engine().kernel(g), in, {}, RunOptions{}, &got);  // in place
    Scalars want = interpret_results(g, in, {});
    EXPECT_EQ(got["max_p"], want["max_p"]) << n;
    EXPECT_NEAR(got["mean_m"], want["mean_m"], 1e-7) << n;
  }
}

// ---- Per-row reductions ----------------------------------------------------------------------

struct RowCase {
  size_t rows, cols;
};

class Rows : public ::testing::TestWithParam<RowCase> {};

// Gradient centralization's shape of computation: each element minus its row's mean, plus the
// other row reductions, against the interpreter.
TEST_P(Rows, MatchInterpreter) {
  RowCase c = GetParam();
  Graph g("rows");
  Value p = g.param("p"), grad = g.grad("g"), lr = g.scalar("lr");
  Value centered = grad - row_mean(grad);
  g.output("p", p - lr * centered);
  g.output("g", row_max(grad) - row_min(grad) + row_sum(centered * centered));
  auto k = engine().kernel(g);
  EXPECT_TRUE(k->signature().per_row);
  size_t n = c.rows * c.cols;
  Tensors in{{"p", values(1, n)}, {"g", values(2, n)}};
  Scalars sc{{"lr", 0.5}};
  RunOptions opt;
  opt.cols = static_cast<int64_t>(c.cols);
  Scalars none;
  // 1e-6 relative plus 1e-6 absolute: f32 updates of values near 1 with row values that are
  // double-accumulated and rounded once; the row sum of squares is up to ~cols/3.
  expect_close(run_kernel(*k, in, sc, opt, &none), interpret(g, in, sc, opt.cols), 1e-6, 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Reduce, Rows,
                         ::testing::Values(RowCase{1, 1}, RowCase{5, 1}, RowCase{3, 7},
                                           RowCase{64, 33}, RowCase{1000, 64}, RowCase{7, 5000},
                                           RowCase{2048, 512}, RowCase{0, 16}),
                         [](const auto& info) {
                           return std::to_string(info.param.rows) + "x" +
                                  std::to_string(info.param.cols);
                         });

// ---- Errors ----------------------------------------------------------------------------------

TEST(ReduceErrors, CallsAreChecked) {
  auto k = engine().kernel(stats_graph());
  std::vector<float> data(10, 1.0f);
  KernelCall call;
  call.inputs = {data.data()};
  call.n = 10;
  EXPECT_THAT(error_of([&] { k->run(call); }),
              HasSubstr("has 3 results (first \"maxabs\"): the call needs KernelCall::results"));

  Graph rows("rows");
  Value x = rows.grad("x");
  rows.output("x", x - row_mean(x));
  auto kr = engine().kernel(rows);
  KernelCall rc;
  rc.inputs = {data.data()};
  rc.outputs = {data.data()};
  rc.n = 10;
  rc.cols = 3;
  EXPECT_THAT(error_of([&] { kr->run(rc); }),
              HasSubstr("KernelCall::cols must be in [1, 2^31) and divide n = 10, got cols = 3"));
  rc.cols = 0;
  EXPECT_THAT(error_of([&] { kr->run(rc); }), HasSubstr("got cols = 0"));
  EXPECT_EQ(data[0], 1.0f);  // a rejected call changes nothing
}

// One kernel cannot do both (lower.cpp refuses), so the engine runs the partitioner's two
// (include/optfuse/partition.h): the sum first, then the update reading it as a scalar.
TEST(Reduce, MixedWholeAndRowReductionsRunAsTwoKernels) {
  Graph g("mixed");
  Value x = g.grad("x");
  g.output("x", x - row_mean(x) + reduce_sum(x));
  auto k = engine().kernel(g);
  Tensors in{{"x", {}}};
  for (int i = 0; i < 12; ++i) in["x"].push_back(testing::gen(3, i));
  RunOptions opt;
  opt.cols = 4;
  Scalars none;
  expect_close(run_kernel(*k, in, {}, opt, &none), interpret(g, in, {}, opt.cols), 1e-6, 1e-6);
}

}  // namespace
}  // namespace optfuse
