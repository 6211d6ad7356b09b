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

// `tensors` tensors in `groups` parameter groups (equal shares, learning rates differing so each
// group has its own scalars, as with layer-wise learning rates).
void run_steps(benchmark::State& state, int64_t tensors, int64_t elements_each,
               int64_t groups = 1) {
  std::vector<std::vector<float>> p(tensors, std::vector<float>(elements_each, 0.5f));
  std::vector<std::vector<float>> g(tensors, std::vector<float>(elements_each, 0.01f));
  auto opt = Optimizer::create(engine(), {{"type", "adamw"}});
  for (int64_t k = 0; k < groups; ++k) {
    std::vector<ParamRef> refs;
    for (int64_t i = tensors * k / groups; i < tensors * (k + 1) / groups; ++i)
      refs.push_back({{p[i].data(), elements_each, {}}, {g[i].data(), elements_each, {}}, ""});
    opt->add_param_group(refs, {{"lr", 1e-3 * (1.0 + 0.01 * double(k))}});
  }
  for (int i = 0; i < 3; ++i) opt->step();  // compile, create state, warm up
  for (auto _ : state) opt->step();
  state.SetBytesProcessed(state.iterations() * opt->bytes_per_step());
  state.counters["per_tensor"] = benchmark::Counter(
      double(tensors), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.SetLabel(std::to_string(tensors) + " x " + std::to_string(elements_each) +
                 (groups > 1 ? " in " + std::to_string(groups) + " groups" : ""));
}

void BM_Step_ManySmall(benchmark::State& state) { run_steps(state, 1000, 1024); }
void BM_Step_OneLarge(benchmark::State& state) { run_steps(state, 1, 1000 * 1024); }
// The same 1000 tensors in 100 groups of 10: the small tensors of all groups are spread over
// the threads in one round per step (not one per group).
void BM_Step_ManySmall_100Groups(benchmark::State& state) { run_steps(state, 1000, 1024, 100); }

// The same 1000 tensors when every step gets new gradient buffers, as with torch's
// zero_grad(set_to_none=True): set_grad for each tensor (two sets of buffers, alternated), then
// step. Compare with ManySmall: the rebinding should cost a small fraction of the step.
void BM_Step_ManySmall_NewGrads(benchmark::State& state) {
  const int64_t tensors = 1000, each = 1024;
  std::vector<std::vector<float>> p(tensors, std::vector<float>(each, 0.5f));
  std::vector<std::vector<float>> g[2] = {
      std::vector<std::vector<float>>(tensors, std::vector<float>(each, 0.01f)),
      std::vector<std::vector<float>>(tensors, std::vector<float>(each, 0.02f))};
  std::vector<ParamRef> refs;
  for (int64_t i = 0; i < tensors; ++i)
    refs.push_back({{p[i].data(), each, {}}, {g[0][i].data(), each, {}}, ""});
  auto opt = Optimizer::create(engine(), {{"type", "adamw"}});
  opt->add_param_group(refs);
  for (int i = 0; i < 3; ++i) opt->step();
  int which = 0;
  for (auto _ : state) {
    which ^= 1;
    for (int64_t i = 0; i < tensors; ++i)
      opt->set_grad(0, static_cast<size_t>(i), {g[which][i].data(), each, {}});
    opt->step();
  }
  state.SetBytesProcessed(state.iterations() * opt->bytes_per_step());
  state.SetLabel("1000 x 1024, set_grad for each, then step");
}

BENCHMARK(BM_Step_ManySmall)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Step_OneLarge)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Step_ManySmall_NewGrads)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Step_ManySmall_100Groups)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace optfuse::bench

BENCHMARK_MAIN();
