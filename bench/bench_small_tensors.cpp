// Many small tensors vs one large one, same element count, through Optimizer::step() (AdamW):
// real models have hundreds of biases and norms, and per-tensor call overhead must not dominate.
// Issue 6's target: 1000 tensors of 1K elements within 2x the time of one 1M-element tensor.
// Read the ratio of the two rows' times (same run); `per_tensor` is the time per tensor.
#include <benchmark/benchmark.h>

#include <vector>

#include "bench/support.h"
#include "optfuse/optim.h"

namespace optfuse::bench {
namespace {

void run_steps(benchmark::State& state, int64_t tensors, int64_t elements_each) {
  std::vector<std::vector<float>> p(tensors, std::vector<float>(elements_each, 0.5f));
  std::vector<std::vector<float>> g(tensors, std::vector<float>(elements_each, 0.01f));
  std::vector<ParamRef> refs;
  for (int64_t i = 0; i < tensors; ++i)
    refs.push_back({{p[i].data(), elements_each, {}}, {g[i].data(), elements_each, {}}, ""});
  auto opt = Optimizer::create(engine(), {{"type", "adamw"}});
  opt->add_param_group(refs);
  for (int i = 0; i < 3; ++i) opt->step();  // compile, create state, warm up
  for (auto _ : state) opt->step();
  state.SetBytesProcessed(state.iterations() * opt->bytes_per_step());
  state.counters["per_tensor"] = benchmark::Counter(
      double(tensors), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.SetLabel(std::to_string(tensors) + " x " + std::to_string(elements_each));
}

void BM_Step_ManySmall(benchmark::State& state) { run_steps(state, 1000, 1024); }
void BM_Step_OneLarge(benchmark::State& state) { run_steps(state, 1, 1000 * 1024); }

BENCHMARK(BM_Step_ManySmall)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Step_OneLarge)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace optfuse::bench

BENCHMARK_MAIN();
