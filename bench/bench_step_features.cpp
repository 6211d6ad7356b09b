// Step-level features through Optimizer::step() (AdamW, one tensor of 2^22 fp32 elements):
// what clipping, loss scaling and accumulation cost on top of the plain fused update, and the
// unfused way (torch's clip_grad_norm_: a norm pass, then a pass scaling the grads in place,
// then the update). Bytes per element (counted, not measured; the "B/elt" counter):
//   plain AdamW update                      p, g, m, v read; p, m, v written         28
//   + clipping or loss scaling (fused)      + statistics pass reading g              32
//   + clipping, unfused                     + statistics (4) + scale pass g *= c (8) 40
//   accumulation k = 4, per cycle           init (8) + 2 adds (12 each) + update with
//                                           grad_accum (32)                          64
// With gradient centralization too (issue 4's figure; a [2048, 2048] tensor):
//   clipping + GC fused                     statistics (4) + the update kernel with
//                                           the row mean as its prologue (28; +4 if a
//                                           row left the cache)                      32
//   clipping + GC unfused (torch's order)   statistics (4) + scale (8) + GC (mean 4,
//                                           subtract 8) + update (28)                52
// GB/s = these bytes / time; compare each row to the plain row of the same run.
#include <benchmark/benchmark.h>

#include <memory>
#include <vector>

#include "bench/support.h"
#include "optfuse/optim.h"
#include "optim/grad_stats.h"

namespace optfuse::bench {
namespace {

// The threads a step's statistics pass runs on (Optimizer::step keeps one such pool).
optim::WorkerPool& stats_pool() {
  static optim::WorkerPool pool(engine().num_threads());
  return pool;
}
optim::StatsRound stats_scratch;

constexpr int64_t kN = int64_t{1} << 22;

struct Setup {
  std::vector<float> p = std::vector<float>(kN, 0.5f), g = std::vector<float>(kN, 0.01f);
  std::unique_ptr<Optimizer> opt;
  explicit Setup(const Options& config) {
    opt = Optimizer::create(engine(), config);
    opt->add_param_group({{{p.data(), kN, {}}, {g.data(), kN, {}}, ""}});
  }
};

void report(benchmark::State& state, double bytes_per_element, int calls_per_iteration) {
  state.SetBytesProcessed(int64_t(double(state.iterations()) * bytes_per_element * double(kN)));
  state.counters["B/elt"] = bytes_per_element;
  state.counters["step_calls"] = calls_per_iteration;
}

void run_fused(benchmark::State& state, const Options& config, double bytes, int calls) {
  Setup s(config);
  for (int i = 0; i < 2 * calls; ++i) s.opt->step();  // compile, create state, warm up
  for (auto _ : state)
    for (int c = 0; c < calls; ++c) s.opt->step();
  report(state, bytes, calls);
}

void BM_AdamW_Plain(benchmark::State& state) { run_fused(state, {{"type", "adamw"}}, 28, 1); }
void BM_AdamW_ClipFused(benchmark::State& state) {
  run_fused(state, {{"type", "adamw"}, {"max_grad_norm", 1.0}}, 32, 1);
}
void BM_AdamW_ClipScalerFused(benchmark::State& state) {
  run_fused(state, {{"type", "adamw"}, {"max_grad_norm", 1.0}, {"loss_scale", 1.0}}, 32, 1);
}
void BM_AdamW_Accumulate4(benchmark::State& state) {
  run_fused(state, {{"type", "adamw"}, {"accumulation_steps", 4}}, 64, 4);
}

// torch's order of work: the same statistics kernel, a separate in-place scaling pass (c = 1:
// the same traffic, and the values stay put over many iterations), then the plain update.
void BM_AdamW_ClipUnfused(benchmark::State& state) {
  Setup s(Options{{"type", "adamw"}});
  auto stats = engine().kernel(optim::grad_stats_graph(false, false));
  Graph scale_graph("scale_grads");
  scale_graph.output("x", scale_graph.state("x") * scale_graph.scalar("c"));
  auto scale = engine().kernel(scale_graph);
  KernelCall scale_call = make_call(*scale, {{"x", s.g.data()}}, {{"c", 1.0}}, kN);
  auto step = [&] {
    optim::GradStats st =
        optim::grad_stats({{stats.get(), s.g.data(), nullptr, kN}}, &stats_pool(), &stats_scratch);
    benchmark::DoNotOptimize(st.sumsq);
    scale->run(scale_call);
    s.opt->step();
  };
  for (int i = 0; i < 2; ++i) step();
  for (auto _ : state) step();
  report(state, 40, 1);
}

// Clipping and gradient centralization on one [kRows, kCols] tensor: fused (the statistics
// kernel, then ONE update kernel applying the clip factor and the row mean inside) vs torch's
// order (statistics, scale g in place, centralize g in place, then the plain update).
constexpr int64_t kRows = 2048, kCols = kN / kRows;

struct ShapedSetup {
  std::vector<float> p = std::vector<float>(kN, 0.5f), g = std::vector<float>(kN, 0.01f);
  std::unique_ptr<Optimizer> opt;
  ShapedSetup(const Options& config, const Options& overrides) {
    opt = Optimizer::create(engine(), config);
    opt->add_param_group({{{p.data(), kN, {kRows, kCols}}, {g.data(), kN, {kRows, kCols}}, ""}},
                         overrides);
  }
};

void BM_AdamW_ClipGC_Fused(benchmark::State& state) {
  ShapedSetup s({{"type", "adamw"}, {"max_grad_norm", 1.0}}, {{"grad_centralization", true}});
  for (int i = 0; i < 2; ++i) s.opt->step();
  for (auto _ : state) s.opt->step();
  report(state, 32, 1);
}

void BM_AdamW_ClipGC_Unfused(benchmark::State& state) {
  ShapedSetup s({{"type", "adamw"}}, Options::object());
  auto stats = engine().kernel(optim::grad_stats_graph(false, false));
  Graph scale_graph("scale_grads");
  scale_graph.output("x", scale_graph.state("x") * scale_graph.scalar("c"));
  auto scale = engine().kernel(scale_graph);
  KernelCall scale_call = make_call(*scale, {{"x", s.g.data()}}, {{"c", 1.0}}, kN);
  Graph gc_graph("centralize_grads");
  Value x = gc_graph.state("x");
  gc_graph.output("x", x - row_mean(x));
  auto gc = engine().kernel(gc_graph);
  KernelCall gc_call = make_call(*gc, {{"x", s.g.data()}}, {}, kN);
  gc_call.cols = kCols;
  auto step = [&] {
    optim::GradStats st =
        optim::grad_stats({{stats.get(), s.g.data(), nullptr, kN}}, &stats_pool(), &stats_scratch);
    benchmark::DoNotOptimize(st.sumsq);
    scale->run(scale_call);
    gc->run(gc_call);
    s.opt->step();
  };
  for (int i = 0; i < 2; ++i) step();
  for (auto _ : state) step();
  report(state, 52, 1);
}

// The statistics kernel alone (reads g: 4 B/element), with f32 and f64 squares.
void run_stats(benchmark::State& state, bool f64) {
  std::vector<float> g(kN, 0.01f);
  Graph gr("stats_f32");
  gr.result("sumsq", sum_squares(gr.grad("grad")));
  auto k = engine().kernel(f64 ? optim::grad_stats_graph(false, false) : gr);
  for (auto _ : state) {
    optim::GradStats st =
        optim::grad_stats({{k.get(), g.data(), nullptr, kN}}, &stats_pool(), &stats_scratch);
    benchmark::DoNotOptimize(st.sumsq);
  }
  report(state, 4, 0);
}
void BM_Stats_F64Squares(benchmark::State& state) { run_stats(state, true); }
void BM_Stats_F32Squares(benchmark::State& state) { run_stats(state, false); }

// Between steps: a learning-rate scheduler's set() on a group with 2^22 elements of AdamW state
// (32 MiB). It validates the change without touching the state; it used to copy the whole group,
// state included (97 ms per call for 2^24 elements, measured before the fix).
void BM_Set_LearningRate(benchmark::State& state) {
  Arrays a(2, kN);
  auto opt = Optimizer::create(engine(), {{"type", "adamw"}});
  opt->add_param_group({{{a[0], kN, {}}, {a[1], kN, {}}, "w"}});
  opt->step();  // creates the state
  double lr = 1e-3;
  for (auto _ : state) opt->set(0, "lr", lr *= 0.999);
  state.SetLabel("2^22 elements of AdamW state");
}

BENCHMARK(BM_Set_LearningRate)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Stats_F64Squares)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Stats_F32Squares)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AdamW_Plain)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AdamW_ClipFused)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AdamW_ClipScalerFused)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AdamW_ClipUnfused)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AdamW_Accumulate4)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AdamW_ClipGC_Fused)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AdamW_ClipGC_Unfused)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace optfuse::bench

BENCHMARK_MAIN();
