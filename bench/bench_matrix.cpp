// Every library optimizer x dtype x size: Optimizer::step() on one tensor of n elements, n = 2^10
// (L1-resident) .. 2^26 (far past L3), every factor of 4, with its defaults.
//
// Counters: `GBps` (bytes_per_step() / step time: the update's useful traffic), `ceiling_GBps`
// (the 4-read-3-write kernel of tools/bandwidth.h over arrays of the same size, same engine and
// schedule) and `share` = GBps / ceiling_GBps as the MEDIAN OF PAIRS: every timed step is
// followed by one timed ceiling pass (not counted in the step time), so both see the same machine
// state. Optimizers that move less than 28 B/element (SGD without momentum: 12) have a lower
// attainable share; compare them with each other, not with 1.0.
//
// Tuned schedules: with OPTFUSE_SCHEDULES set (a database file or directory, see
// include/optfuse/schedules.h) the engine uses them and the label says "tuned".
// Dtypes: the tensors' dtypes. f32; bf16 and f16: 16-bit params and grads, the optimizer keeping
// f32 master weights and f32 state (28 B/element like f32: master r+w 8, param w 2, grad 2,
// state 16), so their share of the same f32 ceiling compares directly.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/support.h"
#include "optfuse/optfuse.hpp"
#include "optim/precision.h"
#include "tools/bandwidth.h"

namespace optfuse::bench {
namespace {

struct DtypeAxis {
  const char* name;
  DType param, grad;
};
const std::vector<DtypeAxis> kDtypes = {{"f32", DType::F32, DType::F32},
                                        {"bf16", DType::BF16, DType::BF16},
                                        {"f16", DType::F16, DType::F16}};

// A tensor of `n` elements of `t` over `storage` (an f32 array of at least n elements): as it is
// for f32; for 16-bit dtypes, `storage` refilled with n 16-bit values of the same magnitudes.
TensorRef tensor_over(float* storage, int64_t n, DType t) {
  if (t == DType::F32) return {storage, n, {}, t};
  auto* bits = reinterpret_cast<uint16_t*>(storage);
  for (int64_t i = 0; i < n; ++i) {
    const float x = 0.25f + static_cast<float>(i & 1023) * (1.0f / 1024.0f);
    if (t == DType::BF16) {
      bits[i] = optim::to_bf16_bits(x);
    } else {
      const _Float16 h = static_cast<_Float16>(x);
      std::memcpy(&bits[i], &h, sizeof h);
    }
  }
  return {bits, n, {}, t};
}

Engine& matrix_engine() {
  static Engine e;  // the schedules every engine finds (resolve_schedule_db)
  return e;
}

void BM_Matrix(benchmark::State& state, const std::string& type, const DtypeAxis& dtype) {
  const int64_t n = state.range(0);
  try {
    Engine& e = matrix_engine();
    Arrays a(6, n);  // param, grad; the ceiling's p, m, v, g
    const Options config = {{"type", type}};
    auto opt = Optimizer::create(e, config);
    if (type == "sparseadam") {
      // Row-sparse gradients only: rows of 64 elements, every row present (one run of rows, so
      // one kernel call: the dense-equivalent rate of LazyAdam's update).
      if (dtype.param != DType::F32) throw Error("sparseadam: f32 params only in this matrix");
      TensorRef param = tensor_over(a[0], n, dtype.param);
      param.shape = {n / 64, 64};
      opt->add_param_group({{param, {nullptr, n, {}}, "w"}});
      std::vector<int64_t> rows(static_cast<size_t>(n / 64));
      for (size_t r = 0; r < rows.size(); ++r) rows[r] = static_cast<int64_t>(r);
      opt->set_sparse_grad(0, 0, rows, {a[1], n, {}});
    } else {
      opt->add_param_group(
          {{tensor_over(a[0], n, dtype.param), tensor_over(a[1], n, dtype.grad), "w"}});
    }
    auto ceiling = e.kernel(tools::stream_4r3w_graph(), n);
    KernelCall ceiling_call = make_call(
        *ceiling, {{"param", a[2]}, {"grad", a[5]}, {"exp_avg", a[3]}, {"exp_avg_sq", a[4]}}, {},
        n);
    for (int i = 0; i < 3; ++i) {  // the first step compiles and creates the state
      opt->step();
      ceiling->run(ceiling_call);
    }
    const double bytes = static_cast<double>(opt->bytes_per_step());
    const double ceiling_bytes = 28.0 * static_cast<double>(n);
    std::vector<double> t_step, t_ceiling, shares;
    for (auto _ : state) {
      auto t0 = Clock::now();
      opt->step();
      double ts = seconds_since(t0);
      state.SetIterationTime(ts);
      t0 = Clock::now();
      ceiling->run(ceiling_call);
      double tc = seconds_since(t0);
      t_step.push_back(ts);
      t_ceiling.push_back(tc);
      shares.push_back((bytes / ts) / (ceiling_bytes / tc));
    }
    state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * opt->bytes_per_step());
    state.counters["GBps"] = bytes / median(t_step) / 1e9;
    state.counters["ceiling_GBps"] = ceiling_bytes / median(t_ceiling) / 1e9;
    state.counters["share"] = median(shares);
    state.counters["B_per_elem"] = bytes / static_cast<double>(n);
    auto uses = opt->kernel_uses();
    bool tuned = false;
    e.schedule_for(update_graph(config, {}, dtype.param, dtype.grad), n, &tuned);
    state.SetLabel(uses.empty() ? type
                                : uses[0].name + " " + uses[0].key.substr(0, 16) + " " +
                                      (tuned ? "tuned" : "default"));
  } catch (const std::exception& ex) {
    state.SkipWithError(ex.what());
  }
}

// Size-major (every optimizer at one size, then the next): neighbouring runs compare.
void register_all() {
  for (int64_t n = int64_t{1} << 10; n <= int64_t{1} << 26; n *= 4)
    for (const DtypeAxis& d : kDtypes)
      for (const std::string& type : optimizer_types())
        benchmark::RegisterBenchmark(("Matrix/" + type + "/" + d.name).c_str(),
                                     [type, &d](benchmark::State& s) { BM_Matrix(s, type, d); })
            ->Arg(n)
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
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
