// AdamW with gradient centralization over a [rows, cols] fp32 tensor, three ways, in one binary:
//   Fused:    ONE kernel: the per-row mean is the kernel's prologue (computed at the start of each
//             row, the row then read again from cache by the update): 1 pass, 28 B/element
//             (+4 B/element if a row does not stay in cache between the two reads);
//   Unfused:  GC as a kernel of its own writing the centered gradient (reads g twice, writes it:
//             8-12 B/element; +4 B where lowering still loads the unread "centered" input), then
//             the plain AdamW kernel (28 B/element): 2 passes, 36-44 B;
//             torch's eager GC (mean, then subtract) is one more pass again: 3 passes, 44 B;
//   Plain:    AdamW without GC, the 1-pass reference (28 B/element).
// bytes_per_second counts the useful 28 B/element for every variant, so a ratio of two at the
// same size is a ratio of speeds; `moved_B_per_elem` says what each moves.
// Run: build/bench/bench_gc --benchmark_counters_tabular=true (on a quiet machine).
#include <benchmark/benchmark.h>

#include <exception>
#include <map>
#include <string>

#include "bench/support.h"
#include "optfuse/optfuse.hpp"
#include "optim/rule.h"

namespace optfuse::bench {
namespace {

constexpr int64_t kAdamBytes = 28;
constexpr int kWarmup = 3;

Options adamw_options(bool gc) {
  Options o = optim::make_rule("adamw")->defaults();
  o["grad_centralization"] = gc;
  return o;
}

std::map<std::string, double> adamw_scalars() {
  std::map<std::string, double> s;
  optim::make_rule("adamw")->scalars(adamw_options(false), optim::TensorStep{10, false}, &s);
  return s;
}

// arrays: 0 param, 1 grad, 2 exp_avg, 3 exp_avg_sq, 4 the centered gradient (unfused only).
std::map<std::string, float*> adamw_tensors(const Arrays& a, float* grad) {
  return {{"param", a[0]}, {"grad", grad}, {"exp_avg", a[2]}, {"exp_avg_sq", a[3]}};
}

void finish(benchmark::State& state, double moved) {
  state.SetBytesProcessed(state.iterations() * state.range(0) * kAdamBytes);
  state.counters["moved_B_per_elem"] = moved;
  state.counters["cols"] = static_cast<double>(state.range(1));
}

void BM_AdamW_GC_Fused(benchmark::State& state) {
  const int64_t n = state.range(0), cols = state.range(1);
  try {
    auto k = engine().kernel(optim::make_rule("adamw")->graph(adamw_options(true)));
    Arrays a(4, n);
    KernelCall call = make_call(*k, adamw_tensors(a, a[1]), adamw_scalars(), n);
    call.cols = cols;
    for (int i = 0; i < kWarmup; ++i) k->run(call);
    state.SetLabel(label(*k));
    for (auto _ : state) k->run(call);
  } catch (const std::exception& e) {
    return state.SkipWithError(e.what());
  }
  finish(state, kAdamBytes);
}

void BM_AdamW_GC_Unfused(benchmark::State& state) {
  const int64_t n = state.range(0), cols = state.range(1);
  try {
    Graph gc("gc_only");
    Value g = gc.grad("grad");
    gc.state("centered");
    gc.output("centered", g - row_mean(g));
    auto center = engine().kernel(gc);
    auto update = engine().kernel(optim::make_rule("adamw")->graph(adamw_options(false)));
    Arrays a(5, n);
    KernelCall c1 = make_call(*center, {{"grad", a[1]}, {"centered", a[4]}}, {}, n);
    c1.cols = cols;
    KernelCall c2 = make_call(*update, adamw_tensors(a, a[4]), adamw_scalars(), n);
    for (int i = 0; i < kWarmup; ++i) {
      center->run(c1);
      update->run(c2);
    }
    state.SetLabel(label(*center) + " + " + label(*update));
    for (auto _ : state) {
      center->run(c1);
      update->run(c2);
    }
  } catch (const std::exception& e) {
    return state.SkipWithError(e.what());
  }
  finish(state, kAdamBytes + 8);
}

void BM_AdamW_Plain(benchmark::State& state) {
  const int64_t n = state.range(0);
  try {
    auto k = engine().kernel(optim::make_rule("adamw")->graph(adamw_options(false)));
    Arrays a(4, n);
    KernelCall call = make_call(*k, adamw_tensors(a, a[1]), adamw_scalars(), n);
    for (int i = 0; i < kWarmup; ++i) k->run(call);
    state.SetLabel(label(*k));
    for (auto _ : state) k->run(call);
  } catch (const std::exception& e) {
    return state.SkipWithError(e.what());
  }
  finish(state, kAdamBytes);
}

// {n, cols}: a 768-wide layer (GPT-2 small), a 4096-wide one, and a wide embedding-like row,
// from cache-resident to far past L3.
void shapes(benchmark::internal::Benchmark* b) {
  for (int64_t cols : {768, 4096, 65536})
    for (int64_t n : {int64_t(1) << 20, int64_t(1) << 24}) b->Args({n / cols * cols, cols});
  b->UseRealTime();
}

BENCHMARK(BM_AdamW_GC_Fused)->Apply(shapes);
BENCHMARK(BM_AdamW_GC_Unfused)->Apply(shapes);
BENCHMARK(BM_AdamW_Plain)->Apply(shapes);

}  // namespace
}  // namespace optfuse::bench

BENCHMARK_MAIN();
