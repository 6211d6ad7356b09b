// AdamW with 8-bit block-quantized state (src/optim/block_state.h) at the kernel level: one
// tensor of n f32 params, blocks of 256, both moments as u8 codes plus one f32 absmax per block
// (4 + 4 + 4 + 2 x 2 + 2 x 2 x 4 / 256 = 16.06 B per element, against 28 B with f32 state).
//
// Each timed call of the 8-bit kernel is followed by one of the f32-state kernel and one of a
// ceiling kernel that moves the 8-bit kernel's bytes with trivial arithmetic (p' = p + g, each
// code 255 - code, each scale + 1: the same loads, stores and per-block loop), so all three see the
// same machine state. Counters: `step_ms` (median 8-bit call), `f32_ms`, `ceiling_ms`,
// `speedup` = median over triples of f32 time / 8-bit time, `share` = median of ceiling time /
// 8-bit time, `ceiling_speedup` = median of f32 time / ceiling time (the speedup of a kernel
// that moved the 8-bit kernel's bytes without computing: the most the 8-bit state can give),
// `B_per_elem`, `GBps`.
//
// BlockState/adamw/step: the same through Optimizer::step() ("state_dtype": "int8" against the
// default f32 state, each a tensor of n elements), with the same ceiling kernel: what a user's
// step takes, slices on the worker threads and the tensor's last partial block included.
//
// BlockState/reads: what bounds the speedup. Three kernels with trivial arithmetic, timed in
// turn: the f32-state AdamW's traffic (4 f32 reads, 3 writes: 16 B read, 12 B written per
// element), the 8-bit one's without its scales (f32 param and grad, two u8 codes: 10 B read,
// 6 B written) and one as long as that but read-heavy (3 f32 reads, 1 write: 12 B, 4 B).
// Counters per kernel: `<name>_ms` (median) and `<name>_read_GBps` (bytes read / median). Where
// the read rates agree, reads bound the step and the 8-bit state's best speedup is the ratio of
// bytes read, 16 / 10.03 = 1.60 (docs/int8-state.md, "Speed").
#include <benchmark/benchmark.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/support.h"
#include "optfuse/optfuse.hpp"
#include "optim/block_state.h"
#include "optim/options.h"
#include "optim/precision.h"
#include "optim/rule.h"
#include "tools/bandwidth.h"

namespace optfuse::bench {
namespace {

using optim::BlockMap;
constexpr int64_t kBlock = 256;

Engine& block_engine() {
  static Engine e;
  return e;
}

// The ceiling: the 8-bit kernel's buffers, each read and written once, per block; without
// `scales`, the same elementwise traffic with no per-block state (BlockState/reads).
Graph ceiling_graph(bool scales = true) {
  Graph g(scales ? "ceiling_q8" : "reads_q8");
  g.output("param", g.param("param") + g.grad("grad"));
  for (const char* s : {"exp_avg", "exp_avg_sq"}) {
    g.output(s, cast(255.0 - cast(g.state(s, DType::U8), DType::F32), DType::U8));
    if (scales) g.output(optim::block_scale_name(s), g.row_state(optim::block_scale_name(s)) + 1.0);
  }
  return g;
}

// One kernel bound to its buffers (by input name) and scalars.
struct Bound {
  std::shared_ptr<const Kernel> kernel;
  KernelCall call;
  Bound(std::shared_ptr<const Kernel> k, const std::map<std::string, void*>& buffers,
        const std::map<std::string, double>& scalars, int64_t n)
      : kernel(std::move(k)) {
    for (const auto& in : kernel->signature().inputs) call.inputs.push_back(buffers.at(in.name));
    for (const auto& s : kernel->signature().scalars) call.scalars.push_back(scalars.at(s.name));
    for (const auto& o : kernel->signature().outputs)
      call.outputs.push_back(buffers.at(o.replaces));
    call.n = n;
    call.cols = kBlock;
  }
  double time() const {
    auto t0 = Clock::now();
    kernel->run(call);
    return seconds_since(t0);
  }
};

// The triples' times (8-bit, f32 state, ceiling) and the counters they give.
struct Triples {
  std::vector<double> q8, f32, ceiling, speedups, shares, bounds;
  void add(benchmark::State& state, double tq, double tf, double tc) {
    state.SetIterationTime(tq);
    q8.push_back(tq);
    f32.push_back(tf);
    ceiling.push_back(tc);
    speedups.push_back(tf / tq);
    shares.push_back(tc / tq);
    bounds.push_back(tf / tc);
  }
  void report(benchmark::State& state, double bytes, int64_t n) const {
    state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
    state.counters["step_ms"] = median(q8) * 1e3;
    state.counters["f32_ms"] = median(f32) * 1e3;
    state.counters["ceiling_ms"] = median(ceiling) * 1e3;
    state.counters["speedup"] = median(speedups);
    state.counters["share"] = median(shares);
    state.counters["ceiling_speedup"] = median(bounds);
    state.counters["B_per_elem"] = bytes / static_cast<double>(n);
    state.counters["GBps"] = bytes / median(q8) / 1e9;
  }
};

void BM_BlockState(benchmark::State& state) {
  const int64_t n = state.range(0), blocks = n / kBlock;
  try {
    auto rule = optim::make_rule("adamw");
    Options h = optim::merge(optim::with_precision_defaults(rule->defaults()), Options::object(),
                             "adamw", "param group");
    std::map<std::string, double> scalars;
    optim::HostState host = rule->initial_host_state(h);
    rule->scalars(h, optim::TensorStep{10, false, &host}, &scalars);
    const Graph f32 = rule->graph(h);
    const Graph q8 = optim::quantize_state(
        f32, {{"exp_avg", BlockMap::kSignedLinear}, {"exp_avg_sq", BlockMap::kSqrt}});

    Arrays a(6, n);  // param, grad (8-bit and ceiling share them), f32 param, grad, m, v
    std::vector<uint8_t> codes(4 * static_cast<size_t>(n), 100);
    std::vector<float> scales(4 * static_cast<size_t>(blocks), 1e-3f);
    auto q8_buffers = [&](int k) {
      return std::map<std::string, void*>{
          {"param", a[0]},
          {"grad", a[1]},
          {"exp_avg", codes.data() + (2 * k) * n},
          {"exp_avg_sq", codes.data() + (2 * k + 1) * n},
          {"exp_avg.absmax", scales.data() + (2 * k) * blocks},
          {"exp_avg_sq.absmax", scales.data() + (2 * k + 1) * blocks}};
    };
    Bound quantized(block_engine().kernel(q8), q8_buffers(0), scalars, n);
    Bound ceiling(block_engine().kernel(ceiling_graph()), q8_buffers(1), scalars, n);
    Bound full(block_engine().kernel(f32),
               {{"param", a[2]}, {"grad", a[3]}, {"exp_avg", a[4]}, {"exp_avg_sq", a[5]}}, scalars,
               n);
    for (int i = 0; i < 2; ++i) quantized.time(), ceiling.time(), full.time();  // first touch
    Triples times;
    for (auto _ : state) {
      const double tq = quantized.time();
      const double tf = full.time(), tc = ceiling.time();
      times.add(state, tq, tf, tc);
    }
    times.report(state, 16.0 * n + 16.0 * blocks, n);
    state.SetLabel(label(*quantized.kernel));
  } catch (const std::exception& ex) {
    state.SkipWithError(ex.what());
  }
}

void BM_BlockStateStep(benchmark::State& state) {
  const int64_t n = state.range(0), blocks = n / kBlock;
  try {
    Arrays a(6, n);  // each optimizer's param and grad, the ceiling's
    auto make = [&](float* p, float* g, Options group) {
      auto opt = Optimizer::create(block_engine(), {{"type", "adamw"}});
      opt->add_param_group({{{p, n, {n}}, {g, n, {n}}, "w"}}, std::move(group));
      return opt;
    };
    auto q8 = make(a[0], a[1], {{"state_dtype", "int8"}, {"block_size", kBlock}});
    auto f32 = make(a[2], a[3], Options::object());
    std::vector<uint8_t> codes(2 * static_cast<size_t>(n), 100);
    std::vector<float> scales(2 * static_cast<size_t>(blocks), 1e-3f);
    Bound ceiling(block_engine().kernel(ceiling_graph()),
                  {{"param", a[4]},
                   {"grad", a[5]},
                   {"exp_avg", codes.data()},
                   {"exp_avg_sq", codes.data() + n},
                   {"exp_avg.absmax", scales.data()},
                   {"exp_avg_sq.absmax", scales.data() + blocks}},
                  {}, n);
    for (int i = 0; i < 3; ++i) q8->step(), f32->step(), ceiling.time();  // compile, state
    auto timed = [](Optimizer& o) {
      auto t0 = Clock::now();
      o.step();
      return seconds_since(t0);
    };
    Triples times;
    for (auto _ : state) {
      const double tq = timed(*q8);
      const double tf = timed(*f32), tc = ceiling.time();
      times.add(state, tq, tf, tc);
    }
    times.report(state, static_cast<double>(q8->bytes_per_step()), n);
    auto uses = q8->kernel_uses();
    state.SetLabel(uses.empty() ? "" : uses[0].name + " " + uses[0].key.substr(0, 16));
  } catch (const std::exception& ex) {
    state.SkipWithError(ex.what());
  }
}

void BM_Reads(benchmark::State& state) {
  const int64_t n = state.range(0);
  try {
    const Graph q8 = ceiling_graph(/*scales=*/false);
    Graph heavy("reads_3r1w");
    heavy.output("param", heavy.param("param") + heavy.grad("grad") + heavy.state("exp_avg"));
    Arrays a(4, n);
    std::vector<uint8_t> codes(2 * static_cast<size_t>(n), 100);
    const std::map<std::string, void*> f32{
        {"param", a[0]}, {"grad", a[1]}, {"exp_avg", a[2]}, {"exp_avg_sq", a[3]}};
    const std::map<std::string, void*> u8{{"param", a[0]},
                                          {"grad", a[1]},
                                          {"exp_avg", codes.data()},
                                          {"exp_avg_sq", codes.data() + n}};
    struct Kind {
      const char* name;
      Bound bound;
      double read;  // bytes read per element
      std::vector<double> times;
    };
    std::vector<Kind> kinds;
    kinds.push_back(
        {"f32_4r3w", Bound(block_engine().kernel(tools::stream_4r3w_graph()), f32, {}, n), 16, {}});
    kinds.push_back({"q8", Bound(block_engine().kernel(q8), u8, {}, n), 10, {}});
    kinds.push_back({"f32_3r1w", Bound(block_engine().kernel(heavy), f32, {}, n), 12, {}});
    for (int i = 0; i < 2; ++i)
      for (Kind& k : kinds) k.bound.time();  // first touch
    for (auto _ : state) {
      double total = 0;
      for (Kind& k : kinds) {
        k.times.push_back(k.bound.time());
        total += k.times.back();
      }
      state.SetIterationTime(total);
    }
    for (const Kind& k : kinds) {
      const double t = median(k.times);
      state.counters[std::string(k.name) + "_ms"] = t * 1e3;
      state.counters[std::string(k.name) + "_read_GBps"] =
          k.read * static_cast<double>(n) / t / 1e9;
    }
  } catch (const std::exception& ex) {
    state.SkipWithError(ex.what());
  }
}

BENCHMARK(BM_BlockStateStep)
    ->Name("BlockState/adamw/step")
    ->RangeMultiplier(4)
    ->Range(int64_t{1} << 16, int64_t{1} << 26)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

BENCHMARK(BM_BlockState)
    ->Name("BlockState/adamw/q8")
    ->RangeMultiplier(4)
    ->Range(int64_t{1} << 16, int64_t{1} << 26)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

BENCHMARK(BM_Reads)
    ->Name("BlockState/reads")
    ->Arg(int64_t{1} << 24)
    ->Arg(int64_t{1} << 26)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace optfuse::bench

BENCHMARK_MAIN();
