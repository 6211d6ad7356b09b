// Reductions and results on CUDA targets, without a GPU: every graph with whole-tensor or per-row
// reductions or results (LAMB, LARS, the clipping / loss-scaling statistics kernel, gradient
// centralization, custom graphs) compiles for CUDA into PTX that ptxas accepts for sm_80 and
// sm_90; the GPU definitions of the reductions (reduce.h: block partials, one combining block)
// give the same numbers as plain double loops when realized on the CPU; what stays unsupported
// is a clear Error. The device runs are in tests/test_cuda_ptx.cpp (they skip without a device).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>

#include "jit/halide_bridge.h"
#include "jit/ptx.h"
#include "lower/reduce.h"
#include "optfuse/optfuse.hpp"
#include "optim/grad_stats.h"
#include "support/ptxas.h"

namespace optfuse {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const std::string kTarget = "host-cuda-cuda_capability_80";

struct Case {
  const char* label;
  Graph graph;
  int kernels;  // .entry count: 2 per whole-tensor reduction, 1 per row reduction, 1 for `out`
};

Graph custom_max() {  // a whole-tensor reduce_max scaling the update (NaN-propagating max)
  Graph g("custom_max");
  Value p = g.param("p"), grad = g.grad("g");
  Value lr = g.scalar("lr");
  g.output("p", p - lr * grad / (reduce_max(abs(grad)) + 1e-12));
  return g;
}

Graph custom_row_mean() {  // per-row: the row mean subtracted, then a plain SGD step
  Graph g("custom_row_mean");
  Value p = g.param("p"), grad = g.grad("g");
  Value lr = g.scalar("lr");
  g.output("p", p - lr * (grad - row_mean(grad)));
  return g;
}

Graph custom_variance() {  // a reduction whose operand reads another one's total
  Graph g("custom_variance");
  Value p = g.param("p"), grad = g.grad("g");
  Value lr = g.scalar("lr");
  Value centered = grad - reduce_mean(grad);
  g.output("p", p - lr * centered / sqrt(reduce_mean(centered * centered) + 1e-8));
  return g;
}

Graph custom_results() {  // an update that also reports statistics (results and outputs)
  Graph g("custom_results");
  Value p = g.param("p"), grad = g.grad("g");
  Value lr = g.scalar("lr");
  g.output("p", p - lr * grad);
  g.result("gmin", reduce_min(grad));
  g.result("pmean", reduce_mean(p));
  return g;
}

std::vector<Case> cases() {
  std::vector<Case> c;
  // LAMB: |p| and |update| per tensor; LARS: |p| and |g|: two whole reductions each.
  c.push_back({"lamb", update_graph({{"type", "lamb"}}), 5});
  c.push_back({"lars", update_graph({{"type", "lars"}}), 5});
  c.push_back({"stats_sumsq", optim::grad_stats_graph(false, false), 2});
  c.push_back({"stats_sumsq_maxabs", optim::grad_stats_graph(false, true), 4});
  c.push_back({"stats_accumulated", optim::grad_stats_graph(true, true), 4});
  for (const char* type : {"sgd", "adam", "adamw"})
    c.push_back(
        {type, update_graph({{"type", type}, {"lr", 0.1}, {"grad_centralization", true}}), 2});
  c.push_back(
      {"sgd_momentum_gc",
       update_graph(
           {{"type", "sgd"}, {"lr", 0.1}, {"momentum", 0.9}, {"grad_centralization", true}}),
       2});
  c.push_back({"custom_max", custom_max(), 3});
  c.push_back({"custom_row_mean", custom_row_mean(), 2});
  c.push_back({"custom_variance", custom_variance(), 5});
  c.push_back({"custom_results", custom_results(), 5});
  return c;
}

std::vector<char> cuda_object(const Graph& g, const std::string& target = kTarget) {
  return testing::cuda_object(g, target, "optfuse_cuda_reduce_test");
}

using testing::find_ptxas;
using testing::kNoPtxas;
using testing::ptxas;

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(CudaReducePtx, EveryReducingGraphCompilesAndAssembles) {
  std::string tool = find_ptxas();
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.label);
    std::vector<std::string> ptx = jit::extract_ptx(cuda_object(c.graph));
    ASSERT_EQ(ptx.size(), 1u);
    const std::string& text = ptx[0];
    EXPECT_THAT(text, HasSubstr(".target sm_80"));
    EXPECT_EQ(count(text, ".entry"), size_t(c.kernels));
    EXPECT_THAT(text, HasSubstr("bar.sync"));  // thread partials complete before thread 0 reads
    EXPECT_THAT(text, HasSubstr(".shared"));   // the thread partials
    EXPECT_THAT(text, HasSubstr(".f64"));      // accumulated in double
    if (tool.empty()) continue;
    EXPECT_EQ(ptxas(tool, text, "sm_80", c.label), "");
    EXPECT_EQ(ptxas(tool, text, "sm_90", c.label), "");
  }
  if (tool.empty()) GTEST_SKIP() << kNoPtxas << ": PTX checked, not assembled";
}

TEST(CudaReducePtx, PlainCudaTargetAssembles) {
  std::string text =
      jit::extract_ptx(cuda_object(update_graph({{"type", "lamb"}}), "host-cuda"))[0];
  EXPECT_THAT(text, HasSubstr(".target sm_20"));
  std::string tool = find_ptxas();
  if (tool.empty()) GTEST_SKIP() << kNoPtxas;
  EXPECT_EQ(ptxas(tool, text, "sm_90", "plain_lamb"), "");
}

// The reduction kernels read f32 tensors with 128-bit loads in their steady state (the first and
// last strides of a block are guarded scalar loads).
TEST(CudaReducePtx, ReductionKernelsLoadVectors) {
  std::string text = jit::extract_ptx(cuda_object(optim::grad_stats_graph(false, true)))[0];
  EXPECT_THAT(text, HasSubstr("ld.global.nc.v4.f32"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr(".local")));  // lane partials stay in registers
}

// The element-wise kernels of the graphs that had them before keep their 128-bit loads.
TEST(CudaReducePtx, UpdateKernelsStayVectorized) {
  for (const char* type : {"lamb", "lars"}) {
    SCOPED_TRACE(type);
    std::string text = jit::extract_ptx(cuda_object(update_graph({{"type", type}})))[0];
    EXPECT_THAT(text, HasSubstr("ld.global.v4.f32"));
  }
}

// Results are computed on the host from the reductions' totals, which Halide copies back from the
// device (8 bytes each); the tensors are never copied to the host. (The copy_to_host of the
// results buffer itself is a no-op: a host buffer without a device allocation.)
TEST(CudaReduceSchedule, ResultsReadTotalsCopiedBackTensorsStayOnTheDevice) {
  EngineOptions o;
  o.target = kTarget;
  o.compile_only = true;
  o.memory_only = true;  // precompile() below must compile, not find a cached object
  Engine e(o);
  std::string stmt = e.lowered_stmt(optim::grad_stats_graph(false, true));
  EXPECT_EQ(count(stmt, "= halide_cuda_run("), 4u);       // two kernels per reduction
  EXPECT_EQ(count(stmt, "halide_copy_to_host(red"), 2u);  // the two totals
  // and the two result buffers (no-ops: host buffers without a device allocation); no tensor
  EXPECT_EQ(count(stmt, "halide_copy_to_host((halide_buffer_t *)results"), 2u) << stmt;
  EXPECT_EQ(count(stmt, "halide_copy_to_host("), 4u);
  EXPECT_THAT(stmt, ::testing::Not(HasSubstr("halide_copy_to_host((halide_buffer_t *)in")));
  EXPECT_FALSE(e.precompile(optim::grad_stats_graph(false, true)));
}

TEST(CudaReduceSchedule, CompileOnlyEnginePrecompilesReducingOptimizers) {
  EngineOptions o;
  o.target = "host-cuda";
  o.compile_only = true;
  o.memory_only = true;  // precompile() below must compile, not find a cached object
  Engine e(o);
  EXPECT_FALSE(e.precompile(update_graph({{"type", "lars"}})));
  EXPECT_FALSE(e.precompile(update_graph({{"type", "adamw"}, {"grad_centralization", true}})));
}

// One kernel cannot do both; the engine compiles the partitioner's two (partition.h).
TEST(CudaReduce, MixedWholeAndRowReductionsCompileAsTwoKernels) {
  EngineOptions o;
  o.target = kTarget;
  o.compile_only = true;
  o.memory_only = true;
  Engine e(o);
  Graph g("mixed");
  Value x = g.grad("x");
  g.output("x", x - row_mean(x) + reduce_sum(x));
  EXPECT_FALSE(e.precompile(g));
  EXPECT_EQ(e.counters().compiles, 2);
}

// ---- The GPU definitions, realized on the CPU -------------------------------------------------
// reduce_whole_gpu / reduce_rows_gpu with their default (CPU, inline / root) schedule: the same
// index arithmetic, bounds and combine order as the kernels, checked against double loops.

using Halide::Buffer;
using Halide::Func;
using Halide::Var;

const double kNan = std::numeric_limits<double>::quiet_NaN();

double reference(Op op, const std::vector<double>& v) {
  double acc = op == Op::ReduceMax || op == Op::RowMax   ? -INFINITY
               : op == Op::ReduceMin || op == Op::RowMin ? INFINITY
                                                         : 0.0;
  for (double x : v) {
    if (op == Op::ReduceSum || op == Op::ReduceMean || op == Op::RowSum || op == Op::RowMean)
      acc += x;
    else if (std::isnan(x) || std::isnan(acc))
      acc = kNan;
    else
      acc = (op == Op::ReduceMax || op == Op::RowMax) ? std::max(acc, x) : std::min(acc, x);
  }
  if ((op == Op::ReduceMean || op == Op::RowMean)) acc /= double(v.size());
  return acc;
}

std::vector<double> data(int64_t n, int nan_at = -1) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = std::sin(0.37 * double(i)) * (1.0 + double(i % 7));
  if (nan_at >= 0 && nan_at < n) v[nan_at] = kNan;
  return v;
}

double whole_gpu(Op op, const std::vector<double>& v, int block) {
  // An empty tensor is a one-element buffer with n = 0, as in Kernel::run's empty calls.
  Buffer<double> in(std::max<int>(1, int(v.size())));
  for (size_t i = 0; i < v.size(); ++i) in(int(i)) = v[i];
  Var x("x");
  Func value("value");
  value(x) = in(x);
  lower::WholeReduction r = lower::reduce_whole_gpu(op, value, int(v.size()), 4, block, "t");
  Func out("out");
  out() = lower::finish(op, r.total(), int(v.size()));
  for (lower::BlockReduce& k : r.gpu) k.out.compute_root();
  Buffer<double> result = out.realize();
  return result();
}

TEST(CudaReduceDefinitions, WholeTensorMatchesDoubleLoops) {
  for (Op op : {Op::ReduceSum, Op::ReduceMean, Op::ReduceMax, Op::ReduceMin}) {
    for (int64_t n : {0, 1, 3, 4, 5, 255, 1024, 1027, 4 * 32 * 40 + 3, 100003}) {
      for (int block : {32, 256}) {
        SCOPED_TRACE(std::string(op_name(op)) + " n=" + std::to_string(n) +
                     " block=" + std::to_string(block));
        std::vector<double> v = data(n);
        if (n == 0) {
          double got = whole_gpu(op, v, block);
          if (op == Op::ReduceSum) EXPECT_EQ(got, 0.0);
          if (op == Op::ReduceMax) EXPECT_EQ(got, -INFINITY);
          if (op == Op::ReduceMin) EXPECT_EQ(got, INFINITY);
          continue;
        }
        double want = reference(op, v);
        EXPECT_NEAR(whole_gpu(op, v, block), want, 1e-12 * (1.0 + std::fabs(want) + double(n)));
      }
    }
  }
}

TEST(CudaReduceDefinitions, MaxAndMinPropagateNan) {
  for (Op op : {Op::ReduceMax, Op::ReduceMin, Op::ReduceSum}) {
    for (int nan_at : {0, 5, 4 * 32 * 40 + 2}) {
      SCOPED_TRACE(std::string(op_name(op)) + " nan at " + std::to_string(nan_at));
      EXPECT_TRUE(std::isnan(whole_gpu(op, data(4 * 32 * 40 + 3, nan_at), 32)));
    }
  }
}

TEST(CudaReduceDefinitions, PerRowMatchesDoubleLoops) {
  for (Op op : {Op::RowSum, Op::RowMean, Op::RowMax, Op::RowMin}) {
    for (int cols : {1, 3, 4, 130, 1029}) {
      const int rows = 5, block = 32;
      SCOPED_TRACE(std::string(op_name(op)) + " cols=" + std::to_string(cols));
      std::vector<double> v = data(int64_t(rows) * cols, op == Op::RowMax ? cols + 1 : -1);
      Buffer<double> in(cols, rows);
      for (int y = 0; y < rows; ++y)
        for (int x = 0; x < cols; ++x) in(x, y) = v[size_t(y) * cols + x];
      Var x("x"), y("y");
      Func value("value");
      value(x, y) = in(x, y);
      lower::RowReduction r = lower::reduce_rows_gpu(op, value, cols, 4, block, "r");
      Func out("out");
      out(y) = lower::finish(op, r.row(y), cols);
      for (lower::BlockReduce& k : r.gpu) k.out.compute_root();
      Buffer<double> got = out.realize({rows});
      for (int row = 0; row < rows; ++row) {
        std::vector<double> part(v.begin() + int64_t(row) * cols,
                                 v.begin() + int64_t(row + 1) * cols);
        double want = reference(op, part);
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(got(row))) << "row " << row;
          continue;
        }
        EXPECT_NEAR(got(row), want, 1e-12 * (1.0 + std::fabs(want) + cols)) << "row " << row;
      }
    }
  }
}

}  // namespace
}  // namespace optfuse
