// The partitioner drives compilation: Engine::kernel(g) runs the clusters partition(g) prints.
// IR in / clusters out (with do-not-fuse negatives), then each cut graph run end to end by the
// engine against interpret() (the double-precision reference), and every built-in optimizer's
// update graph shown to be one cluster that compiles to the same single kernel, by the same key,
// as before the partitioner chose kernels.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>

#include "engine/composite.h"
#include "engine/kernel_impl.h"
#include "optfuse/engine.h"
#include "optfuse/error.h"
#include "optfuse/optim.h"
#include "optfuse/partition.h"
#include "support/engine.h"
#include "support/gen.h"
#include "support/run_kernel.h"

namespace optfuse {
namespace {

using ::testing::HasSubstr;
using Verdict = FusionDecision::Verdict;
using Why = FusionDecision::Why;
constexpr auto K = Cluster::Kind::Kernel;
constexpr auto O = Cluster::Kind::Opaque;

std::vector<Cluster::Kind> kinds(const Partition& p) {
  std::vector<Cluster::Kind> k;
  for (const Cluster& c : p.clusters) k.push_back(c.kind);
  return k;
}

// The reasons of the decisions with verdict `v`, in edge order.
std::vector<Why> whys(const Partition& p, Verdict v) {
  std::vector<Why> out;
  for (const FusionDecision& d : p.decisions)
    if (d.verdict == v) out.push_back(d.why);
  return out;
}

// An opaque op that returns its operand: what interpret() evaluates every opaque op as.
void identity(const OpaqueCall& c) {
  const size_t bytes = static_cast<size_t>(c.n) * dtype_size(c.dtype);
  std::memcpy(c.out, c.in, bytes);
}

// Whole-tensor and per-row reductions feeding one update (a norm and gradient centralization).
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
  result "sumsq" = %4
})";

// The same cut, with a state the statistics kernel already writes in place (m' needs no
// reduction) and that the update kernel reads again (it recomputes m' from m).
const char* kEarlyOutput = R"(graph "early_output" {
  %0 = param.f32 "p"
  %1 = grad.f32 "g"
  %2 = state.f32 "m"
  %3 = scalar.f32 "lr"
  %4 = scalar.f32 "beta"
  %5 = mul.f32 %2, %4
  %6 = add.f32 %5, %1
  %7 = mul.f32 %6, %6
  %8 = reduce_sum.f32 %7
  %9 = rsqrt.f32 %8
  %10 = row_mean.f32 %6
  %11 = sub.f32 %6, %10
  %12 = mul.f32 %11, %9
  %13 = mul.f32 %3, %12
  %14 = sub.f32 %0, %13
  out "m" = %6
  out "p" = %14
})";

// An all-reduce of a scaled gradient, then a normalized step (a reduction after the cut).
const char* kOpaque = R"(graph "allreduced" {
  %0 = param.f32 "p"
  %1 = grad.f32 "g"
  %2 = scalar.f32 "lr"
  %3 = scalar.f32 "scale"
  %4 = mul.f32 %1, %3
  %5 = opaque.f32 "allreduce", %4
  %6 = mul.f32 %5, %5
  %7 = reduce_sum.f32 %6
  %8 = rsqrt.f32 %7
  %9 = mul.f32 %5, %8
  %10 = mul.f32 %2, %9
  %11 = sub.f32 %0, %10
  out "p" = %11
})";

// A norm computed before an opaque op and needed after it, and an opaque op on a uniform value.
const char* kAcross = R"(graph "across" {
  %0 = param.f32 "p"
  %1 = grad.f32 "g"
  %2 = scalar.f32 "lr"
  %3 = mul.f32 %1, %1
  %4 = reduce_sum.f32 %3
  %5 = opaque.f32 "allreduce_scalar", %4
  %6 = rsqrt.f32 %5
  %7 = opaque.f32 "allreduce", %1
  %8 = mul.f32 %7, %6
  %9 = mul.f32 %2, %8
  %10 = sub.f32 %0, %9
  out "p" = %10
  result "local_sumsq" = %4
})";

// ---- IR in, clusters out ------------------------------------------------------------------------

TEST(Clusters, MixedReductionsAreAStatisticsKernelThenTheUpdate) {
  Partition p = partition(parse(kMixed));
  ASSERT_EQ(kinds(p), (std::vector<Cluster::Kind>{K, K}));
  // The statistics kernel reads the gradient only and returns the sum twice: as the caller's
  // result and as "%6", which the update kernel reads as a scalar.
  EXPECT_EQ(print(p.clusters[0].graph), R"(graph "mixed.k0" {
  %0 = grad.f32 "g"
  %1 = mul.f32 %0, %0
  %2 = reduce_sum.f32 %1
  result "sumsq" = %2
  result "%6" = %2
}
)");
  EXPECT_EQ(print(p.clusters[1].graph), R"(graph "mixed.k1" {
  %0 = param.f32 "p"
  %1 = grad.f32 "g"
  %2 = row_mean.f32 %1
  %3 = sub.f32 %1, %2
  %4 = scalar.f32 "%6"
  %5 = rsqrt.f32 %4
  %6 = mul.f32 %3, %5
  %7 = scalar.f32 "lr"
  %8 = mul.f32 %6, %7
  %9 = sub.f32 %0, %8
  out "p" = %9
}
)");
  EXPECT_EQ(whys(p, Verdict::Cut), std::vector<Why>{Why::ReductionCut});
  EXPECT_TRUE(whys(p, Verdict::Recompute).empty());
}

// An output's input is declared in the cluster when the output is; a later root that reads that
// input must find it, not declare it again (test_bf16's and test_fuzz's graphs hit this).
TEST(Clusters, OutputsReadingEachOthersInputsAreOneKernel) {
  Graph g = parse(R"(graph "swap" {
  %0 = state.f32 "a"
  %1 = state.f32 "b"
  %2 = const.f32 2
  %3 = mul.f32 %1, %2
  %4 = const.f32 3
  %5 = mul.f32 %0, %4
  out "a" = %3
  out "b" = %5
})");
  Partition p = partition(g);
  ASSERT_EQ(kinds(p), std::vector<Cluster::Kind>{K});
  EXPECT_EQ(structural_hash(p.clusters[0].graph), structural_hash(g));
}

TEST(Clusters, AnOutputWrittenBeforeTheCutIsRecomputedAfterIt) {
  Partition p = partition(parse(kEarlyOutput));
  ASSERT_EQ(kinds(p), (std::vector<Cluster::Kind>{K, K}));
  const Graph& stats = p.clusters[0].graph;
  ASSERT_EQ(stats.outputs().size(), 1u);
  EXPECT_EQ(stats.outputs()[0].replaces, "m");        // written in place by the first kernel...
  EXPECT_GE(p.clusters[1].graph.find_input("m"), 0);  // ...and read again by the second
  EXPECT_EQ(whys(p, Verdict::Cut), std::vector<Why>{Why::ReductionCut});
  // m' (and what reads it) is computed in both kernels: recomputed, never passed in memory.
  const std::vector<Why> recomputed = whys(p, Verdict::Recompute);
  EXPECT_FALSE(recomputed.empty());
  for (Why w : recomputed) EXPECT_EQ(w, Why::Duplicated);
}

TEST(Clusters, OpaqueOpSplitsTheGraphAroundIt) {
  Partition p = partition(parse(kOpaque));
  ASSERT_EQ(kinds(p), (std::vector<Cluster::Kind>{K, O, K}));
  EXPECT_EQ(whys(p, Verdict::Cut),
            (std::vector<Why>{Why::OpaqueConsumer, Why::OpaqueProducer, Why::OpaqueProducer}));
  // Do not fuse across it; the reduction after it is the last kernel's prologue.
  EXPECT_THAT(explain(p), HasSubstr("fuse  %7 reduce_sum -> %8 rsqrt: whole-tensor reduction"));
  EXPECT_EQ(p.clusters[0].graph.outputs()[0].replaces, "%4");
  EXPECT_GE(p.clusters[2].graph.find_input("%5"), 0);
}

TEST(Clusters, ReductionNeededAfterAnOpaqueOpCrossesAsAScalar) {
  Partition p = partition(parse(kAcross));
  ASSERT_EQ(kinds(p), (std::vector<Cluster::Kind>{K, O, O, K}));
  const Graph& last = p.clusters[3].graph;
  EXPECT_GE(last.find_scalar("%5"), 0);                 // the uniform opaque result
  EXPECT_GE(last.find_input("%7"), 0);                  // the tensor opaque result
  EXPECT_EQ(p.clusters[0].graph.results().size(), 2u);  // "%4" for the opaque op, and local_sumsq
}

// ---- The engine runs the clusters -------------------------------------------------------------

struct Data {
  testing::Tensors tensors;
  testing::Scalars scalars;
};

Data data(const Graph& g, size_t n) {
  Data d;
  int seed = 1;
  const Graph c = canonicalize(g);
  for (const Node& node : c.nodes()) {
    if (node.op == Op::Input) {
      auto& v = d.tensors[node.name];
      for (size_t i = 0; i < n; ++i) v.push_back(float(testing::gen(seed, i)));
    }
    if (node.op == Op::Scalar) d.scalars[node.name] = 0.25 * seed;
    ++seed;
  }
  return d;
}

// Runs `g` through engine.kernel(g) in place and checks outputs and results against interpret().
void expect_runs_like_interpreter(Engine& engine, const Graph& g, int64_t rows, int64_t cols) {
  const size_t n = static_cast<size_t>(rows * cols);
  Data d = data(g, n);
  auto k = engine.kernel(g);
  testing::RunOptions opt;
  opt.cols = cols;
  testing::Scalars results;
  auto got = testing::run_kernel(*k, d.tensors, d.scalars, opt, &results);
  // 2e-6 relative: f32 arithmetic with the fast rsqrt (<= 4 ulp, src/lower/README.md) on values
  // of a few ulp each; reductions are accumulated in double and rounded once to f32.
  testing::expect_close(got, interpret(g, d.tensors, d.scalars, cols), 2e-6, 1e-7);
  auto want = interpret_results(g, d.tensors, d.scalars, cols);
  ASSERT_EQ(results.size(), want.size());
  for (const auto& [name, v] : want) EXPECT_NEAR(results[name], v, 1e-6 * std::abs(v)) << name;
}

TEST(ClustersRun, MixedReductions) {
  Engine engine(testing::memory_only());
  Graph g = parse(kMixed);
  auto k = engine.kernel(g);
  auto* composite = dynamic_cast<const engine_detail::CompositeKernel*>(k.get());
  ASSERT_NE(composite, nullptr);
  EXPECT_EQ(composite->steps().size(), 2u);
  EXPECT_EQ(engine.counters().compiles, 2);
  // The caller sees the whole graph: its key, name and signature.
  EXPECT_EQ(k->key(), engine.kernel_key(g));
  EXPECT_EQ(k->name(), "mixed");
  const KernelSignature& sig = k->signature();
  ASSERT_EQ(sig.inputs.size(), 2u);
  EXPECT_EQ(sig.inputs[0].name, "p");
  EXPECT_EQ(sig.inputs[1].name, "g");
  ASSERT_EQ(sig.scalars.size(), 1u);
  EXPECT_EQ(sig.scalars[0].name, "lr");
  ASSERT_EQ(sig.results.size(), 1u);
  EXPECT_EQ(sig.results[0].name, "sumsq");
  EXPECT_TRUE(sig.per_row);
  EXPECT_EQ(engine.kernel(g), k);  // kept: a second lookup compiles nothing
  EXPECT_EQ(engine.counters().compiles, 2);
  expect_runs_like_interpreter(engine, g, 37, 29);
  expect_runs_like_interpreter(engine, g, 1, 1);
}

TEST(ClustersRun, InputReadAfterItIsWrittenInPlace) {
  Engine& engine = testing::shared_engine();
  expect_runs_like_interpreter(engine, parse(kEarlyOutput), 41, 17);
}

TEST(ClustersRun, OpaqueOpsRunTheirImplementations) {
  Engine engine(testing::memory_only());
  engine.register_opaque("allreduce", identity);
  engine.register_opaque("allreduce_scalar", identity);
  expect_runs_like_interpreter(engine, parse(kOpaque), 1, 1000);
  expect_runs_like_interpreter(engine, parse(kAcross), 1, 1000);
  expect_runs_like_interpreter(engine, parse(kAcross), 1, 0);
}

// The implementation's result, not its operand, is what the next kernel reads: a negating
// callee gives the graph with `neg` in place of the opaque op.
TEST(ClustersRun, OpaqueResultReachesTheNextKernel) {
  Engine engine(testing::memory_only());
  int calls = 0;
  engine.register_opaque("allreduce", [&](const OpaqueCall& c) {
    ++calls;
    EXPECT_EQ(c.callee, "allreduce");
    ASSERT_EQ(c.dtype, DType::F32);
    EXPECT_NE(c.in, c.out);
    for (int64_t i = 0; i < c.n; ++i)
      static_cast<float*>(c.out)[i] = -static_cast<const float*>(c.in)[i];
  });
  std::string text = kOpaque;
  text.replace(text.find("opaque.f32 \"allreduce\","), 23, "neg.f32");
  const Graph g = parse(kOpaque), negated = parse(text);
  const size_t n = 777;
  Data d = data(g, n);
  auto got = testing::run_kernel(*engine.kernel(g), d.tensors, d.scalars);
  EXPECT_EQ(calls, 1);
  testing::expect_close(got, interpret(negated, d.tensors, d.scalars), 2e-6, 1e-7);
}

// A custom type this file registers (OneCluster below leaves it out: it is no built-in).
constexpr const char* kHalvedSgd = "sgd_halved_grad";

// The Optimizer calls a cut graph's Kernel as it calls any other: an SGD whose gradient goes
// through an opaque op that halves it steps like plain SGD at half the learning rate, for a small
// tensor (one call) and a large one (slices on several threads, each with its opaque call).
TEST(ClustersRun, OptimizerRunsACutGraphLikeAnyKernel) {
  Engine engine(testing::memory_only());
  std::atomic<int64_t> halved_elements{0};
  engine.register_opaque("halve", [&](const OpaqueCall& c) {
    halved_elements += c.n;
    for (int64_t i = 0; i < c.n; ++i)
      static_cast<float*>(c.out)[i] = 0.5f * static_cast<const float*>(c.in)[i];
  });
  CustomOptimizer def;
  def.type = kHalvedSgd;
  def.defaults = {{"lr", 0.1}};
  def.graph = [](const Options&) {
    Graph g("sgd_halved_grad");
    Value p = g.param("p"), grad = g.grad("g"), lr = g.scalar("lr");
    g.output("p", p - lr * opaque("halve", grad));
    return g;
  };
  register_optimizer(def);
  for (size_t n : {size_t(1000), (size_t(1) << 22) + 3}) {
    SCOPED_TRACE(n);
    std::vector<float> pa(n), ga(n), pb(n), gb(n);
    for (size_t i = 0; i < n; ++i) pa[i] = pb[i] = float(testing::gen(5, i));
    auto halved = Optimizer::create(engine, {{"type", kHalvedSgd}, {"lr", 0.1}});
    auto plain = Optimizer::create(engine, {{"type", "sgd"}, {"lr", 0.05}});
    halved->add_param_group({{{pa.data(), int64_t(n), {}}, {ga.data(), int64_t(n), {}}, "w"}});
    plain->add_param_group({{{pb.data(), int64_t(n), {}}, {gb.data(), int64_t(n), {}}, "w"}});
    halved_elements = 0;
    for (int step = 0; step < 3; ++step) {
      for (size_t i = 0; i < n; ++i) ga[i] = gb[i] = float(testing::gen(100 + step, i));
      halved->step();
      plain->step();
    }
    EXPECT_EQ(halved_elements.load(), int64_t(3 * n));  // every element, once a step
    // Halving is exact in binary, so 0.1f * (g / 2) and 0.05f * g are the same product; 2.5e-7
    // (2 ulp at |p| < 2) allows for a contraction into an FMA in one kernel and not the other.
    for (size_t i = 0; i < n; ++i) ASSERT_NEAR(pa[i], pb[i], 2.5e-7) << i;
    EXPECT_NE(pa[0], float(testing::gen(5, 0)));  // it stepped
  }
}

// ---- Errors -----------------------------------------------------------------------------------

TEST(ClustersErrors, OpaqueOpWithoutAnImplementation) {
  Engine engine(testing::memory_only());
  try {
    engine.kernel(parse(kOpaque));
    ADD_FAILURE() << "no Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("graph \"allreduced\": opaque op \"allreduce\" has no "
                                    "implementation in this engine: register one with "
                                    "Engine::register_opaque(\"allreduce\", fn)"));
  }
  EXPECT_EQ(engine.counters().compiles, 0);  // refused before compiling anything
  // Compiling needs no implementation: the clusters' kernels.
  EXPECT_FALSE(engine.precompile(parse(kOpaque)));
  EXPECT_EQ(engine.counters().compiles, 2);
}

// Not cut yet: the statistics kernel itself would need the row reduction.
TEST(ClustersErrors, ReductionOfARowReducedValue) {
  Graph g("norm_of_centralized");
  Value p = g.param("p"), x = g.grad("g");
  Value c = x - row_mean(x);
  g.output("p", p - c * rsqrt(reduce_sum(c * c)));
  Engine engine(testing::memory_only());
  try {
    engine.kernel(g);
    ADD_FAILURE() << "no Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("graph \"norm_of_centralized\": a whole-tensor reduction "
                                    "(reduce_sum) of a value that needs a per-row reduction "
                                    "(row_mean)"));
  }
  EXPECT_EQ(engine.counters().compiles, 0);
}

TEST(ClustersErrors, RegisteringTwiceOrNothing) {
  Engine engine(testing::memory_only());
  engine.register_opaque("allreduce", identity);
  try {
    engine.register_opaque("allreduce", identity);
    ADD_FAILURE() << "no Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("opaque op \"allreduce\" already has an implementation"));
  }
  EXPECT_THROW(engine.register_opaque("other", OpaqueFn()), Error);
}

TEST(ClustersErrors, CallMistakesNameTheWholeGraph) {
  Engine& engine = testing::shared_engine();
  auto k = engine.kernel(parse(kMixed));
  std::vector<float> p(6), g(6);
  double result = 0;
  KernelCall call;
  call.inputs = {p.data(), g.data()};
  call.scalars = {0.1};
  call.outputs = {p.data()};
  call.n = 6;
  call.cols = 4;
  call.results = &result;
  try {
    k->run(call);
    ADD_FAILURE() << "no Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("kernel \"mixed\" reduces per row: KernelCall::cols"));
  }
  call.cols = 3;
  call.device = true;
  try {
    k->run(call);
    ADD_FAILURE() << "no Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("kernel \"mixed\" runs as 2 clusters"));
  }
}

// ---- Today's graphs: one cluster, the same kernel ---------------------------------------------

// Every built-in optimizer with its step features and precisions: a graph the partitioner keeps
// whole is compiled as it is, so its one cluster is the canonical graph and has its key.
TEST(OneCluster, EveryBuiltInUpdateGraph) {
  Engine& engine = testing::shared_engine();
  struct Variant {
    Options extra;
    DType param = DType::F32, grad = DType::F32;
  };
  const std::vector<Variant> variants = {
      {Options::object()},
      {Options{{"grad_centralization", true}}},
      {Options{{"max_grad_norm", 1.0}}},
      {Options{{"loss_scale", "dynamic"}, {"accumulation_steps", 4}}},
      {Options{{"state_dtype", "bf16"}}},
      {Options::object(), DType::BF16, DType::BF16},
  };
  int checked = 0;
  int types = 0;
  for (const std::string& type : optimizer_types()) {
    // (Muon's update calls its orthogonalization between two kernels: tests/test_optim_muon.cpp.)
    if (type == kHalvedSgd || type == "muon") continue;
    ++types;
    for (const Variant& v : variants) {
      Options config = v.extra;
      config["type"] = type;
      Graph g;
      try {
        g = update_graph(config, {}, v.param, v.grad);
      } catch (const Error&) {
        continue;  // an option this type does not take (e.g. GC outside the SGD / Adam family)
      }
      SCOPED_TRACE(config.dump() + " " + g.name());
      Partition p = partition(g);
      ASSERT_EQ(kinds(p), std::vector<Cluster::Kind>{K}) << explain(p);
      EXPECT_EQ(structural_hash(p.clusters[0].graph), structural_hash(canonicalize(g)));
      EXPECT_EQ(engine.kernel_key(p.clusters[0].graph), engine.kernel_key(g));
      ++checked;
    }
    // The kernel itself: today's single compiled kernel, not a composite around it.
    Graph g = update_graph({{"type", type}});
    auto k = engine.kernel(g);
    EXPECT_NE(dynamic_cast<const engine_detail::KernelImpl*>(k.get()), nullptr) << type;
    EXPECT_EQ(k->key(), engine.kernel_key(g)) << type;
  }
  EXPECT_GE(types, 11);  // sgd, adam, adamw, adagrad, rmsprop, adamax, nadam, radam, lion, ...
  EXPECT_GE(checked, types * 4);
}

TEST(OneCluster, GradientCentralizedAdamWIsItsOwnKernel) {
  Engine& engine = testing::shared_engine();
  Graph g = update_graph({{"type", "adamw"}, {"grad_centralization", true}});
  auto k = engine.kernel(g);
  EXPECT_NE(dynamic_cast<const engine_detail::KernelImpl*>(k.get()), nullptr);
  EXPECT_EQ(k->key(), engine.kernel_key(g));
  EXPECT_TRUE(k->signature().per_row);
}

}  // namespace
}  // namespace optfuse
