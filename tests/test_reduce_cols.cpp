// Column reductions and column state (staged kernels, src/lower/staged.h): the IR (build errors,
// text round trip, the interpreter's batches), the kernels against the interpreter over shapes
// and batches, in place, with whole-tensor and row reductions in the same kernel, and call errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "optfuse/engine.h"
#include "optfuse/error.h"
#include "support/engine.h"
#include "support/gen.h"
#include "support/optim_util.h"
#include "support/run_kernel.h"

namespace optfuse {
namespace {

using testing::error_of;
using testing::expect_close;
using testing::gen;
using ::testing::HasSubstr;
using testing::run_kernel;
using testing::RunOptions;
using testing::Scalars;
using testing::Tensors;

Engine& engine() { return testing::shared_engine(); }

std::vector<double> values(uint32_t seed, size_t n, double scale = 1) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = float(scale * gen(seed, i));
  return v;
}

std::vector<double> positive(uint32_t seed, size_t n) {
  std::vector<double> v = values(seed, n);
  for (double& x : v) x = float(std::fabs(x) + 0.25);
  return v;
}

// Adafactor's factored second moment, in the shape of torch's (one kernel): the row and column
// means of g^2 lerped into row and column state, their outer product over the mean of the new
// row state, the update's RMS (a whole-tensor reduction of values that need every column mean
// first) and the param's RMS.
Graph factored_graph() {
  Graph g("factored");
  Value p = g.param("p"), grad = g.grad("g");
  Value rv = g.row_state("row_var"), cv = g.col_state("col_var");
  Value w = g.scalar("w"), eps = g.scalar("eps");
  Value sq = grad * grad;
  Value rv1 = rv + w * (row_mean(sq) - rv);
  Value cv1 = cv + w * (col_mean(sq) - cv);
  Value estimate = rv1 * cv1 / max(col_mean(rv1), eps);
  Value u = rsqrt(max(estimate, eps * eps)) * grad;
  Value denom = max(g.constant(1.0), sqrt(reduce_mean(u * u)));
  Value alpha = max(eps, sqrt(reduce_mean(p * p)));
  g.output("p", p - alpha / denom * u);
  g.output("row_var", rv1);
  g.output("col_var", cv1);
  return g;
}

// ---- IR --------------------------------------------------------------------------------------

TEST(ColIR, ColumnReductionsArePerElementAndStagedGraphsUseCols) {
  Graph g = factored_graph();
  EXPECT_TRUE(uses_cols(g));
  EXPECT_TRUE(uses_rows(g));
  Graph plain("plain");
  Value p = plain.param("p");
  plain.output("p", p - row_mean(p));
  EXPECT_FALSE(uses_cols(plain));
  Graph h("cols");
  Value q = h.param("q");
  Value c = col_sum(q);
  EXPECT_TRUE(c.node().is_tensor);
  EXPECT_EQ(c.node().op, Op::ColSum);
  EXPECT_TRUE(op_has(Op::ColMean, kColReduce));
  EXPECT_FALSE(op_has(Op::ColMean, kRowReduce));
}

TEST(ColIR, BuildErrorsNameTheProblem) {
  Graph g("bad");
  Value p = g.param("p"), lr = g.scalar("lr");
  Value cv = g.col_state("cv"), rv = g.row_state("rv");
  EXPECT_THAT(error_of([&] { col_mean(lr); }), HasSubstr("col_mean: operand 1"));
  EXPECT_THAT(error_of([&] { g.output("cv", cv + p); }),
              HasSubstr("the input is column state, and the value differs within a column "
                        "(through param \"p\")"));
  EXPECT_THAT(error_of([&] { g.output("cv", cv + row_sum(p)); }),
              HasSubstr("differs within a column (through param \"p\")"));
  EXPECT_THAT(error_of([&] { g.output("rv", rv + cv); }),
              HasSubstr("the input is row state, and the value differs within a row (through "
                        "col_state \"cv\")"));
  // A row reduction of column-level values is the same for the whole batch, and the reverse.
  g.output("cv", cv + row_mean(cv) * lr);
  g.output("rv", rv + col_mean(rv));
}

TEST(ColIR, TextAndJsonRoundTrip) {
  Graph g = factored_graph();
  const std::string text = print(g);
  EXPECT_THAT(text, HasSubstr("col_state.f32 \"col_var\""));
  EXPECT_THAT(text, HasSubstr("col_mean.f32"));
  EXPECT_EQ(print(parse(text)), text);
  EXPECT_EQ(structural_hash(parse(text)), structural_hash(g));
  EXPECT_EQ(structural_hash(parse_json(print_json(g))), structural_hash(g));
  EXPECT_THAT(error_of([] { parse_json(R"({"inputs": [{"name": "c", "role": "col"}]})"); }),
              HasSubstr("expected param, grad, state, row_state or col_state"));
}

// Two batches of 2 x 3: column sums within each batch, column state one value per column of
// each batch.
TEST(ColIR, InterpreterReducesColumnsWithinBatches) {
  Graph g("b");
  Value x = g.param("x"), cv = g.col_state("cv");
  g.output("x", x + col_sum(x));
  g.output("cv", cv + col_max(x));
  Tensors in{{"x", {1, 2, 3, 4, 5, 6, 10, 20, 30, 40, 50, 60}}, {"cv", {0, 0, 0, 1, 1, 1}}};
  Tensors out = interpret(g, in, {}, 3, 2);
  EXPECT_EQ(out["x"], (std::vector<double>{6, 9, 12, 9, 12, 15, 60, 90, 120, 90, 120, 150}));
  EXPECT_EQ(out["cv"], (std::vector<double>{4, 5, 6, 41, 51, 61}));
  Tensors one = interpret(g, {{"x", in["x"]}, {"cv", {0, 0, 0}}}, {}, 3, 0);  // one batch of 4
  EXPECT_EQ(one["cv"], (std::vector<double>{40, 50, 60}));
  EXPECT_THAT(error_of([&] { interpret(g, in, {}, 3, 3); }),
              HasSubstr("batch_rows >= 0 dividing the row count 4, got batch_rows = 3"));
  EXPECT_THAT(error_of([&] {
                interpret(g, {{"x", in["x"]}, {"cv", {0}}}, {}, 3, 2);
              }),
              HasSubstr("col_state \"cv\" has 1 values but the tensors have 6 columns"));
}

// ---- Kernels against the interpreter --------------------------------------------------------

struct Shape {
  size_t batches, rows, cols;
};

class Factored : public ::testing::TestWithParam<Shape> {};

TEST_P(Factored, MatchesInterpreterInPlace) {
  const Shape c = GetParam();
  Graph g = factored_graph();
  auto k = engine().kernel(g);
  EXPECT_TRUE(k->signature().per_col);
  EXPECT_TRUE(k->signature().reduces);
  const size_t n = c.batches * c.rows * c.cols;
  Tensors in{{"p", values(1, n)},
             {"g", values(2, n, 0.1)},
             {"row_var", positive(3, c.batches * c.rows)},
             {"col_var", positive(4, c.batches * c.cols)}};
  Scalars sc{{"w", 0.3}, {"eps", 1e-3}};
  RunOptions opt;
  opt.cols = static_cast<int64_t>(c.cols);
  opt.batch_rows = static_cast<int64_t>(c.rows);
  Scalars none;
  // f32 element math on double-accumulated means, each rounded once; rsqrt within 4 ulp: 2e-6
  // relative, plus 1e-7 absolute for updates that cancel to near zero.
  expect_close(run_kernel(*k, in, sc, opt, &none), interpret(g, in, sc, opt.cols, opt.batch_rows),
               2e-6, 1e-7);
}

INSTANTIATE_TEST_SUITE_P(Reduce, Factored,
                         ::testing::Values(Shape{1, 1, 1}, Shape{1, 3, 7}, Shape{1, 64, 33},
                                           Shape{1, 1000, 64}, Shape{1, 7, 5000},
                                           Shape{1, 2048, 512}, Shape{4, 3, 5}, Shape{3, 100, 17},
                                           Shape{4096, 3, 3}, Shape{2, 1, 40}, Shape{5, 40, 1}),
                         [](const auto& info) {
                           return std::to_string(info.param.batches) + "x" +
                                  std::to_string(info.param.rows) + "x" +
                                  std::to_string(info.param.cols);
                         });

// Every column reduction and a row reduction of column values, out of place (fresh output
// buffers) and serial (one task on the calling thread).
TEST(Staged, EveryColumnReductionSerialAndOutOfPlace) {
  Graph g("cols");
  Value x = g.param("x"), cv = g.col_state("cv"), rv = g.row_state("rv");
  Value scaled = x * g.scalar("s");
  g.output("x", scaled - col_mean(scaled) + col_min(x) * col_max(x));
  g.output("cv", cv + col_sum(x * x) + row_mean(cv));
  g.output("rv", rv * col_mean(rv));
  auto k = engine().kernel(g);
  for (const Shape c : {Shape{1, 33, 45}, Shape{6, 20, 9}}) {
    const size_t n = c.batches * c.rows * c.cols;
    Tensors in{{"x", values(5, n)},
               {"cv", values(6, c.batches * c.cols)},
               {"rv", values(7, c.batches * c.rows)}};
    Scalars sc{{"s", 1.5}};
    RunOptions opt{testing::Aliasing::OutOfPlace, static_cast<int64_t>(c.cols),
                   static_cast<int64_t>(c.rows)};
    Scalars none;
    // Sums of up to 45 squares near 1, each rounded once: 1e-6 relative.
    expect_close(run_kernel(*k, in, sc, opt, &none), interpret(g, in, sc, opt.cols, opt.batch_rows),
                 1e-6, 1e-6);
  }
}

// A graph with results only: the statistics of a matrix, column maxima and the whole sum.
TEST(Staged, ResultsOfColumnValues) {
  Graph g("colstats");
  Value x = g.grad("x");
  g.result("max_col_mean", reduce_max(col_mean(x * x)));
  g.result("sum", reduce_sum(x));
  auto k = engine().kernel(g);
  Tensors in{{"x", values(8, 12 * 30)}};
  RunOptions opt;
  opt.cols = 30;
  Scalars got;
  run_kernel(*k, in, {}, opt, &got);
  Scalars want = interpret_results(g, in, {}, 30, 0);
  // Both sides accumulate in double, in different orders. A column mean of 12 squares, rounded
  // to f32 as the op's dtype: 1e-6 relative. The sum of 360 values of magnitude <= 1 stays a
  // double: 360 additions each within 2^-53 of a partial sum <= 360 differ by < 2e-11; 1e-9 is
  // far above that, and below what a dropped or doubled element changes (unless it is < 1e-9).
  EXPECT_NEAR(got["max_col_mean"], want["max_col_mean"], 1e-6 * std::fabs(want["max_col_mean"]));
  EXPECT_NEAR(got["sum"], want["sum"], 1e-9);
}

// ---- Errors ----------------------------------------------------------------------------------

TEST(StagedErrors, CallsAreChecked) {
  auto k = engine().kernel(factored_graph());
  std::vector<float> p(12), gr(12), rv(4), cv(3);
  KernelCall call;
  call.inputs = {gr.data(), p.data(), cv.data(), rv.data()};
  const KernelSignature& sig = k->signature();
  for (size_t i = 0; i < sig.inputs.size(); ++i)
    call.inputs[i] = sig.inputs[i].name == "p"         ? static_cast<void*>(p.data())
                     : sig.inputs[i].name == "g"       ? static_cast<void*>(gr.data())
                     : sig.inputs[i].name == "row_var" ? static_cast<void*>(rv.data())
                                                       : static_cast<void*>(cv.data());
  call.scalars = {0.5, 1e-3};
  for (const auto& o : sig.outputs)
    call.outputs.push_back(call.inputs[sig.input_index(o.replaces)]);
  call.n = 12;
  call.cols = 3;
  call.batch_rows = 3;
  EXPECT_THAT(error_of([&] { k->run(call); }),
              HasSubstr("KernelCall::batch_rows must be 0 or divide the 4 rows, got 3"));
  call.batch_rows = 2;
  k->run(call);
  call.cols = 5;
  EXPECT_THAT(error_of([&] { k->run(call); }), HasSubstr("got cols = 5"));
}

TEST(StagedErrors, CudaTargetsRefuseColumnReductions) {
  EngineOptions o;
  o.target = "host-cuda-cuda_capability_80";
  o.compile_only = true;
  o.memory_only = true;
  Engine cuda(o);
  EXPECT_THAT(error_of([&] { cuda.precompile(factored_graph()); }),
              HasSubstr("column reductions and column state (col_mean, Role::ColState) are not "
                        "supported on CUDA targets yet"));
}

}  // namespace
}  // namespace optfuse
