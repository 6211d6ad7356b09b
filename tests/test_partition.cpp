// The partitioner: fusion clusters and the reason for every decision, on textual graphs.
// Positives (one kernel) and do-not-fuse negatives (cuts at opaque ops and at reductions that
// cannot share a kernel), and an end-to-end run of a cut graph's clusters, one by one, against the
// interpreter (tests/test_clusters.cpp: the engine running them as one Kernel).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "optfuse/engine.h"
#include "optfuse/error.h"
#include "optfuse/partition.h"
#include "support/engine.h"
#include "support/gen.h"
#include "support/run_kernel.h"

namespace optfuse {
namespace {

using ::testing::HasSubstr;
using Verdict = FusionDecision::Verdict;
using Why = FusionDecision::Why;

// The decision on the edge whose producer and consumer have these ops (the first such edge).
const FusionDecision& decision(const Partition& p, Op producer, Op consumer) {
  for (const FusionDecision& d : p.decisions)
    if (p.canonical.node(d.producer).op == producer && p.canonical.node(d.consumer).op == consumer)
      return d;
  ADD_FAILURE() << "no edge " << op_name(producer) << " -> " << op_name(consumer) << "\n"
                << explain(p);
  static FusionDecision none{};
  return none;
}

std::vector<Cluster::Kind> kinds(const Partition& p) {
  std::vector<Cluster::Kind> k;
  for (const Cluster& c : p.clusters) k.push_back(c.kind);
  return k;
}

constexpr auto K = Cluster::Kind::Kernel;
constexpr auto O = Cluster::Kind::Opaque;

// ---- Positives: one kernel ---------------------------------------------------------------------

TEST(Fuse, ElementwiseUpdateIsOneKernelWithTheSameKey) {
  Graph g = parse(R"(graph "sgd_momentum" {
    %0 = param.f32 "p"
    %1 = grad.f32 "g"
    %2 = state.f32 "b"
    %3 = scalar.f32 "lr"
    %4 = scalar.f32 "mu"
    %5 = mul.f32 %2, %4
    %6 = add.f32 %5, %1
    %7 = mul.f32 %6, %3
    %8 = sub.f32 %0, %7
    out "b" = %6
    out "p" = %8
  })");
  Partition p = partition(g);
  ASSERT_EQ(kinds(p), std::vector<Cluster::Kind>{K});
  EXPECT_EQ(structural_hash(p.clusters[0].graph), structural_hash(g));
  for (const FusionDecision& d : p.decisions) {
    EXPECT_EQ(d.verdict, Verdict::Fuse) << d.reason;
    EXPECT_EQ(d.why, Why::ElementwiseChain) << d.reason;
  }
  EXPECT_THAT(explain(p), HasSubstr("fuse  %5 mul -> %6 add: element-wise: same loop"));
}

TEST(Fuse, ReductionIsAPrologueOfItsConsumer) {
  Graph g = parse(R"(graph "normalized" {
    %0 = param.f32 "p"
    %1 = grad.f32 "g"
    %2 = scalar.f32 "lr"
    %3 = mul.f32 %1, %1
    %4 = reduce_sum.f32 %3
    %5 = sqrt.f32 %4
    %6 = div.f32 %1, %5
    %7 = mul.f32 %2, %6
    %8 = sub.f32 %0, %7
    out "p" = %8
    result "norm" = %5
  })");
  Partition p = partition(g);
  ASSERT_EQ(kinds(p), std::vector<Cluster::Kind>{K});
  const FusionDecision& d = decision(p, Op::ReduceSum, Op::Sqrt);
  EXPECT_EQ(d.verdict, Verdict::Fuse);
  EXPECT_EQ(d.why, Why::ReductionPrologue);
  EXPECT_THAT(d.reason, HasSubstr("a root stage computed before the element-wise loop"));
  EXPECT_EQ(structural_hash(p.clusters[0].graph), structural_hash(g));
}

TEST(Fuse, GradientCentralizationIsOneKernel) {
  Graph g = parse(R"(graph "gc" {
    %0 = param.f32 "p"
    %1 = grad.f32 "g"
    %2 = scalar.f32 "lr"
    %3 = row_mean.f32 %1
    %4 = sub.f32 %1, %3
    %5 = mul.f32 %2, %4
    %6 = sub.f32 %0, %5
    out "p" = %6
  })");
  Partition p = partition(g);
  ASSERT_EQ(kinds(p), std::vector<Cluster::Kind>{K});
  EXPECT_EQ(decision(p, Op::RowMean, Op::Sub).why, Why::RowPrologue);
}

// Adafactor's factored update: row and column means of g^2 into row and column state, a column
// mean of the new row state, and a whole-tensor RMS of values that need every column mean. The
// region is staged (column reductions): every reduction a stage of ONE kernel, no cut, where a
// graph with row reductions and no column ones cuts the RMS into a statistics kernel.
TEST(Fuse, ColumnReductionsMakeOneStagedKernel) {
  Graph g = parse(R"(graph "factored" {
    %0 = param.f32 "p"
    %1 = grad.f32 "g"
    %2 = row_state.f32 "rv"
    %3 = col_state.f32 "cv"
    %4 = scalar.f32 "w"
    %5 = mul.f32 %1, %1
    %6 = row_mean.f32 %5
    %7 = sub.f32 %6, %2
    %8 = mul.f32 %4, %7
    %9 = add.f32 %2, %8
    %10 = col_mean.f32 %5
    %11 = sub.f32 %10, %3
    %12 = mul.f32 %4, %11
    %13 = add.f32 %3, %12
    %14 = col_mean.f32 %9
    %15 = mul.f32 %9, %13
    %16 = div.f32 %15, %14
    %17 = rsqrt.f32 %16
    %18 = mul.f32 %1, %17
    %19 = mul.f32 %18, %18
    %20 = reduce_mean.f32 %19
    %21 = sqrt.f32 %20
    %22 = div.f32 %18, %21
    %23 = sub.f32 %0, %22
    out "p" = %23
    out "rv" = %9
    out "cv" = %13
  })");
  Partition p = partition(g);
  ASSERT_EQ(kinds(p), std::vector<Cluster::Kind>{K}) << explain(p);
  EXPECT_EQ(structural_hash(p.clusters[0].graph), structural_hash(g));
  const FusionDecision& col = decision(p, Op::ColMean, Op::Sub);
  EXPECT_EQ(col.verdict, Verdict::Fuse);
  EXPECT_EQ(col.why, Why::ColumnPrologue);
  EXPECT_THAT(col.reason, HasSubstr("per-column reduction: a stage over the whole tensor"));
  EXPECT_EQ(decision(p, Op::ColMean, Op::Div).why, Why::ColumnPrologue);  // of the row state
  EXPECT_THAT(decision(p, Op::RowMean, Op::Sub).reason,
              HasSubstr("in the loop over rows of a column reduction of the same value"));
  EXPECT_EQ(decision(p, Op::ReduceMean, Op::Sqrt).why, Why::ReductionPrologue);
  EXPECT_THAT(p.clusters[0].summary,
              HasSubstr("1 per-row reduction(s) computed as stages, 2 per-column reduction(s)"));
  for (const FusionDecision& d : p.decisions) EXPECT_NE(d.verdict, Verdict::Cut) << d.reason;
}

// ---- Negatives: cuts ---------------------------------------------------------------------------

TEST(DoNotFuse, OpaqueResultStartsTheNextKernel) {
  Graph g = parse(R"(graph "allreduced" {
    %0 = param.f32 "p"
    %1 = grad.f32 "g"
    %2 = scalar.f32 "lr"
    %3 = opaque.f32 "allreduce", %1
    %4 = mul.f32 %2, %3
    %5 = sub.f32 %0, %4
    out "p" = %5
  })");
  Partition p = partition(g);
  ASSERT_EQ(kinds(p), (std::vector<Cluster::Kind>{O, K}));
  const FusionDecision& d = decision(p, Op::Opaque, Op::Mul);
  EXPECT_EQ(d.verdict, Verdict::Cut);
  EXPECT_EQ(d.why, Why::OpaqueProducer);
  EXPECT_THAT(d.reason, HasSubstr("opaque \"allreduce\" is never fused"));
  // The kernel reads the opaque op's result as a tensor input named after its node.
  EXPECT_GE(p.clusters[1].graph.find_input("%3"), 0);
}

TEST(DoNotFuse, OpaqueOperandIsWrittenByTheKernelBeforeIt) {
  Graph g = parse(R"(graph "scaled_then_reduced" {
    %0 = param.f32 "p"
    %1 = grad.f32 "g"
    %2 = scalar.f32 "scale"
    %3 = scalar.f32 "lr"
    %4 = mul.f32 %1, %2
    %5 = opaque.f32 "allreduce", %4
    %6 = mul.f32 %3, %5
    %7 = sub.f32 %0, %6
    out "p" = %7
  })");
  Partition p = partition(g);
  ASSERT_EQ(kinds(p), (std::vector<Cluster::Kind>{K, O, K}));
  const FusionDecision& d = decision(p, Op::Mul, Op::Opaque);
  EXPECT_EQ(d.verdict, Verdict::Cut);
  EXPECT_EQ(d.why, Why::OpaqueConsumer);
  EXPECT_THAT(d.reason, HasSubstr("written to memory by the kernel before it"));
  // The first kernel writes the scaled gradient over a buffer of its own.
  const Graph& first = p.clusters[0].graph;
  ASSERT_EQ(first.outputs().size(), 1u);
  EXPECT_EQ(first.outputs()[0].replaces, "%4");
}

TEST(DoNotFuse, ElementwiseValueOnBothSidesOfACutIsRecomputed) {
  Graph g = parse(R"(graph "recompute" {
    %0 = param.f32 "p"
    %1 = grad.f32 "g"
    %2 = mul.f32 %1, %1
    %3 = opaque.f32 "callback", %2
    %4 = mul.f32 %3, %2
    %5 = sub.f32 %0, %4
    out "p" = %5
  })");
  Partition p = partition(g);
  ASSERT_EQ(kinds(p), (std::vector<Cluster::Kind>{K, O, K}));
  const FusionDecision& d = decision(p, Op::Mul, Op::Mul);  // %2 g*g -> %4
  EXPECT_EQ(d.verdict, Verdict::Recompute);
  EXPECT_EQ(d.why, Why::Duplicated);
}

const char* kMixed = R"(graph "mixed" {
    %0 = param.f32 "p"
    %1 = grad.f32 "g"
    %2 = scalar.f32 "lr"
    %3 = mul.f32 %1, %1
    %4 = reduce_sum.f32 %3
    %5 = rsqrt.f32 %4
    %6 = row_mean.f32 %1
    %7 = sub.f32 %1, %6
    %8 = mul.f32 %7, %5
    %9 = mul.f32 %2, %8
    %10 = sub.f32 %0, %9
    out "p" = %10
  })";

TEST(DoNotFuse, WholeAndRowReductionsGoToTwoKernels) {
  Partition p = partition(parse(kMixed));
  ASSERT_EQ(kinds(p), (std::vector<Cluster::Kind>{K, K}));
  const FusionDecision& d = decision(p, Op::ReduceSum, Op::Rsqrt);
  EXPECT_EQ(d.verdict, Verdict::Cut);
  EXPECT_EQ(d.why, Why::ReductionCut);
  EXPECT_THAT(d.reason, HasSubstr("a statistics kernel computes it first"));
  EXPECT_EQ(decision(p, Op::RowMean, Op::Sub).why, Why::RowPrologue);
  // The statistics kernel only reads: a result and no outputs.
  EXPECT_TRUE(p.clusters[0].graph.outputs().empty());
  ASSERT_EQ(p.clusters[0].graph.results().size(), 1u);
}

// Running the clusters in order, passing the statistics kernel's result as the scalar of the
// same name, gives the interpreter's values for the whole graph.
TEST(DoNotFuse, CutGraphRunsLikeTheWholeGraph) {
  Graph g = parse(kMixed);
  Partition p = partition(g);
  ASSERT_EQ(p.clusters.size(), 2u);
  Engine& engine = testing::shared_engine();
  const size_t rows = 37, cols = 29, n = rows * cols;
  testing::Tensors in{{"p", {}}, {"g", {}}};
  for (size_t i = 0; i < n; ++i) {
    in["p"].push_back(float(testing::gen(1, i)));
    in["g"].push_back(float(testing::gen(2, i)));
  }
  testing::Scalars scalars{{"lr", 0.25}}, results;
  const Graph& stats = p.clusters[0].graph;
  testing::Tensors stats_in{{"g", in["g"]}};
  testing::run_kernel(*engine.kernel(stats), stats_in, {}, testing::RunOptions{}, &results);
  for (const auto& [name, v] : results) scalars[name] = v;
  testing::RunOptions opt;
  opt.cols = cols;
  testing::Scalars none;
  auto got = testing::run_kernel(*engine.kernel(p.clusters[1].graph), in, scalars, opt, &none);
  // 2e-6: f32 updates with the fast rsqrt (<= 4 ulp) and once-rounded reductions.
  testing::expect_close(got, interpret(g, in, {{"lr", 0.25}}, cols), 2e-6, 1e-7);
}

TEST(Opaque, TextRoundTripAndNoImplementation) {
  const char* text = R"(graph "o" {
  %0 = grad.f32 "g"
  %1 = opaque.f32 "all\"reduce", %0
  out "g" = %1
}
)";
  Graph g = parse(text);
  EXPECT_EQ(print(g), text);
  EXPECT_EQ(print(canonicalize(g)), text);
  try {
    testing::shared_engine().kernel(g);
    ADD_FAILURE() << "no Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("opaque op \"all\"reduce\" has no implementation in this "
                                    "engine: register one with Engine::register_opaque"));
  }
  // The interpreter stands in for the external call with the identity.
  auto out = interpret(g, {{"g", {1.5, -2}}}, {});
  EXPECT_EQ(out["g"], (std::vector<double>{1.5, -2}));
}

}  // namespace
}  // namespace optfuse
