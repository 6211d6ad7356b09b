// AdamW's step time against the bytes it moves, for every way optfuse stores params and state:
// one tensor of n elements (2^16 .. 2^26) through Optimizer::step(), each variant paired with a
// ceiling that moves the same bytes.
//
// Variants (bytes per element: param, grad, state; see Optimizer::bytes_per_step):
//   f32                 f32 params, f32 state                                28
//   f32_state_bf16      f32 params, bf16 state                               20
//   f32_state_int8      f32 params, 8-bit state, one f32 scale per 256       16.06
//   bf16_master         bf16 params + f32 master copy, f32 state             28
//   bf16_master_bf16    bf16 params + f32 master copy, bf16 state            20
//   bf16_no_master      bf16 params, no master, bf16 state (torch's way)     14
//   f16_no_master       f16 params, no master, f16 state                     14
// Grads are in the params' dtype (as autograd makes them).
//
// The ceiling of a variant is the 4-read-3-write graph (tools/bandwidth.h, p' = p + g, m' = m + g,
// v' = v + g) as an optimizer (ceiling_optimizer_type) with the SAME precision options and
// tensor dtypes, so the precision transform gives it exactly the variant's loads and stores
// (checked: equal bytes_per_step) with trivial arithmetic. For f32_state_int8 the ceiling's state
// is 8-bit too, so it also decodes, takes the block maxima and encodes: its share says what
// AdamW's own arithmetic costs on top of the 8-bit codec (bench_block_state times the 8-bit step
// against a ceiling without the codec). Counters: `step_ms` (median step),
// `ceiling_ms`, `share` = median over pairs of ceiling time / step time (each timed step is
// followed by one timed ceiling step, so both see the same machine state), `B_per_elem`, `GBps`.
// bench/report.py plots step_ms against B_per_elem.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/support.h"
#include "optfuse/optfuse.hpp"
#include "optim/precision.h"

namespace optfuse::bench {
namespace {

struct Variant {
  const char* name;
  DType param;
  Options group;  // precision options of the group
};
const std::vector<Variant> kVariants = {
    {"f32", DType::F32, Options::object()},
    {"f32_state_bf16", DType::F32, {{"state_dtype", "bf16"}}},
    {"f32_state_int8", DType::F32, {{"state_dtype", "int8"}}},
    {"bf16_master", DType::BF16, Options::object()},
    {"bf16_master_bf16", DType::BF16, {{"state_dtype", "bf16"}}},
    {"bf16_no_master", DType::BF16, {{"master_weights", false}}},
    {"f16_no_master", DType::F16, {{"master_weights", false}}},
};

// A tensor of `n` elements of `t` over `storage` (f32 storage of at least n elements), filled
// with well-scaled values in [0.25, 1.25) (16-bit ones rounded to nearest even).
TensorRef tensor_over(float* storage, int64_t n, DType t) {
  if (t == DType::F32) return {storage, n, {}, t};
  auto* bits = reinterpret_cast<uint16_t*>(storage);
  for (int64_t i = 0; i < n; ++i)
    bits[i] = optim::to_16bit(0.25f + static_cast<float>(i & 1023) * (1.0f / 1024.0f), t);
  return {bits, n, {}, t};
}

Engine& precision_engine() {
  static Engine e;  // the schedules every engine finds (resolve_schedule_db)
  return e;
}

std::unique_ptr<Optimizer> make(const std::string& type, const Variant& v, float* param,
                                float* grad, int64_t n) {
  auto opt = Optimizer::create(precision_engine(), {{"type", type}});
  opt->add_param_group({{tensor_over(param, n, v.param), tensor_over(grad, n, v.param), "w"}},
                       v.group);
  return opt;
}

void BM_Precision(benchmark::State& state, const Variant& v) {
  const int64_t n = state.range(0);
  try {
    Arrays a(4, n);  // AdamW's param and grad, the ceiling's
    auto opt = make("adamw", v, a[0], a[1], n);
    auto ceiling = make(ceiling_optimizer_type(), v, a[2], a[3], n);
    for (int i = 0; i < 3; ++i) {  // the first step compiles and creates the state
      opt->step();
      ceiling->step();
    }
    const int64_t bytes = opt->bytes_per_step();
    if (ceiling->bytes_per_step() != bytes)
      throw Error(std::string(v.name) + ": the ceiling moves " +
                  std::to_string(ceiling->bytes_per_step()) + " bytes, AdamW " +
                  std::to_string(bytes));
    std::vector<double> t_step, t_ceiling, shares;
    for (auto _ : state) {
      auto t0 = Clock::now();
      opt->step();
      const double ts = seconds_since(t0);
      state.SetIterationTime(ts);
      t0 = Clock::now();
      ceiling->step();
      const double tc = seconds_since(t0);
      t_step.push_back(ts);
      t_ceiling.push_back(tc);
      shares.push_back(tc / ts);
    }
    state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * bytes);
    state.counters["step_ms"] = median(t_step) * 1e3;
    state.counters["ceiling_ms"] = median(t_ceiling) * 1e3;
    state.counters["share"] = median(shares);
    state.counters["B_per_elem"] = static_cast<double>(bytes) / static_cast<double>(n);
    state.counters["GBps"] = static_cast<double>(bytes) / median(t_step) / 1e9;
    auto uses = opt->kernel_uses();
    state.SetLabel(uses.empty() ? v.name : uses[0].name + " " + uses[0].key.substr(0, 16));
  } catch (const std::exception& ex) {
    state.SkipWithError(ex.what());
  }
}

// Size-major (every variant at one size, then the next): neighbouring runs compare.
void register_all() {
  for (int64_t n = int64_t{1} << 16; n <= int64_t{1} << 26; n *= 4)
    for (const Variant& v : kVariants)
      benchmark::RegisterBenchmark((std::string("Precision/adamw/") + v.name).c_str(),
                                   [&v](benchmark::State& s) { BM_Precision(s, v); })
          ->Arg(n)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
}

}  // namespace
}  // namespace optfuse::bench

int main(int argc, char** argv) {
  optfuse::bench::register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
