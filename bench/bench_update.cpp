// One optimizer step over n fp32 elements, every way we can run it, in one binary:
//   fused AdamW (Kernel::run, and through Optimizer::step), fused SGD-momentum,
//   the plain scalar loops, the unfused one-pass-per-op baselines, and the bandwidth ceilings.
// bytes_per_second counts the USEFUL traffic of the update for every variant of that update
// (AdamW: p, g, m, v read + p, m, v written = 28 B/element; SGD-momentum: p, g, b read + p, b
// written = 20 B/element), so a ratio of two bytes_per_second at the same size is a ratio of
// speeds. The unfused variants report the traffic they really move as `moved_B_per_elem`.
// See bench/README.md for how to run and read it.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench/scalar_ref.h"
#include "bench/support.h"
#include "optfuse/optfuse.hpp"
#include "optim/rule.h"
#include "tools/bandwidth.h"
#include "tools/unfused.h"

namespace optfuse::bench {
namespace {

constexpr int64_t kAdamBytes = 28;  // per element: 4 reads + 3 writes of fp32
constexpr int64_t kSgdBytes = 20;   // per element: 3 reads + 2 writes of fp32
constexpr int kWarmup = 3;          // untimed calls before the loop: page faults, waking workers

// torch.optim.AdamW defaults at step 10 (bias corrections still matter), and SGD with momentum
// 0.9, as the library's own rules compute them (host doubles, rounded once by the kernel call).
const Options& adamw_options() {
  static const Options o = optim::make_rule("adamw")->defaults();
  return o;
}
std::map<std::string, double> adamw_scalars() {
  std::map<std::string, double> s;
  optim::make_rule("adamw")->scalars(adamw_options(), optim::TensorStep{10, false}, &s);
  return s;
}
Options sgd_options() {
  Options o = optim::make_rule("sgd")->defaults();
  o["momentum"] = 0.9;
  return o;
}
std::map<std::string, double> sgd_scalars() {
  std::map<std::string, double> s;
  optim::make_rule("sgd")->scalars(sgd_options(), optim::TensorStep{10, false}, &s);
  return s;
}

void set_bytes(benchmark::State& state, int64_t per_element) {
  state.SetBytesProcessed(state.iterations() * state.range(0) * per_element);
}

// A call of `k` with its inputs on arrays a[first], a[first + 1], ... in signature order.
KernelCall call_over(const Kernel& k, const Arrays& a, int first,
                     const std::map<std::string, double>& scalars) {
  std::map<std::string, float*> tensors;
  const auto& inputs = k.signature().inputs;
  for (size_t i = 0; i < inputs.size(); ++i)
    tensors[inputs[i].name] = a[first + static_cast<int>(i)];
  return make_call(k, tensors, scalars, a.size());
}

// Times one fused kernel for `graph`, called directly.
void run_fused(benchmark::State& state, const Graph& graph,
               const std::map<std::string, double>& scalars, int64_t bytes_per_element) {
  try {
    auto k = engine().kernel(graph);
    Arrays a(static_cast<int>(k->signature().inputs.size()), state.range(0));
    KernelCall call = call_over(*k, a, 0, scalars);
    for (int i = 0; i < kWarmup; ++i) k->run(call);
    state.SetLabel(label(*k));
    for (auto _ : state) k->run(call);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  set_bytes(state, bytes_per_element);
}

// ---- AdamW --------------------------------------------------------------------------------

void BM_AdamW_Fused(benchmark::State& state) {
  run_fused(state, optim::make_rule("adamw")->graph(adamw_options()), adamw_scalars(), kAdamBytes);
}

// The same kernel through the public optimizer: one tensor, one group, step() per iteration
// (scalars recomputed, pointers gathered, one kernel call). Shows what the wrapper costs.
void BM_AdamW_Optimizer(benchmark::State& state) {
  const int64_t n = state.range(0);
  try {
    Arrays a(2, n);
    auto opt = Optimizer::create(engine(), {{"type", "adamw"}});
    opt->add_param_group({{{a[0], n, {}}, {a[1], n, {}}, "w"}});
    for (int i = 0; i < kWarmup; ++i) opt->step();  // the first creates the state
    if (opt->bytes_per_step() != kAdamBytes * n)
      throw Error("bytes_per_step " + std::to_string(opt->bytes_per_step()) + " != 28 n");
    auto uses = opt->kernel_uses();
    state.SetLabel(uses.empty() ? "optimizer"
                                : "optimizer " + uses[0].name + " " + uses[0].key.substr(0, 16));
    for (auto _ : state) opt->step();
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  set_bytes(state, kAdamBytes);
}

void BM_AdamW_Unfused(benchmark::State& state) {
  const int64_t n = state.range(0);
  try {
    Arrays a(5, n);
    tools::Unfused u =
        tools::Unfused::adamw(engine(), a[0], a[1], a[2], a[3], a[4], n, adamw_scalars());
    for (int i = 0; i < kWarmup; ++i) u.run();
    state.SetLabel(u.label());
    state.counters["moved_B_per_elem"] = static_cast<double>(u.traffic_per_element());
    for (auto _ : state) u.run();
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  set_bytes(state, kAdamBytes);
}

void BM_AdamW_Scalar(benchmark::State& state) {
  const int64_t n = state.range(0);
  Arrays a(4, n);
  const AdamWConstants c = adamw_constants(adamw_scalars());
  for (int i = 0; i < kWarmup; ++i) adamw_scalar(a[0], a[1], a[2], a[3], n, c);
  state.SetLabel("scalar loop, 1 thread, build-type flags");
  for (auto _ : state) {
    adamw_scalar(a[0], a[1], a[2], a[3], n, c);
    benchmark::ClobberMemory();
  }
  set_bytes(state, kAdamBytes);
}

// ---- SGD with momentum --------------------------------------------------------------------

void BM_SGDMomentum_Fused(benchmark::State& state) {
  run_fused(state, optim::make_rule("sgd")->graph(sgd_options()), sgd_scalars(), kSgdBytes);
}

void BM_SGDMomentum_Unfused(benchmark::State& state) {
  const int64_t n = state.range(0);
  try {
    Arrays a(3, n);
    const Options o = sgd_options();
    tools::Unfused u =
        tools::Unfused::sgd_momentum(engine(), a[0], a[1], a[2], n, o["lr"].get<double>(),
                                     o["momentum"].get<double>(), o["dampening"].get<double>());
    for (int i = 0; i < kWarmup; ++i) u.run();
    state.SetLabel(u.label());
    state.counters["moved_B_per_elem"] = static_cast<double>(u.traffic_per_element());
    for (auto _ : state) u.run();
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  set_bytes(state, kSgdBytes);
}

void BM_SGDMomentum_Scalar(benchmark::State& state) {
  const int64_t n = state.range(0);
  Arrays a(3, n);
  const Options o = sgd_options();
  const SgdConstants c{o["lr"].get<float>(), o["weight_decay"].get<float>(),
                       o["momentum"].get<float>(),
                       static_cast<float>(1.0 - o["dampening"].get<double>())};
  for (int i = 0; i < kWarmup; ++i) sgd_momentum_scalar(a[0], a[1], a[2], n, c);
  state.SetLabel("scalar loop, 1 thread, build-type flags");
  for (auto _ : state) {
    sgd_momentum_scalar(a[0], a[1], a[2], n, c);
    benchmark::ClobberMemory();
  }
  set_bytes(state, kSgdBytes);
}

// ---- Ceilings: the same traffic with trivial arithmetic, same engine and schedule ----------

void BM_Ceiling_4R3W(benchmark::State& state) {
  run_fused(state, tools::stream_4r3w_graph(), {}, kAdamBytes);
}

// SGD-momentum's traffic (p, g, b -> p, b): p' = p + g, b' = b + g.
Graph stream_3r2w_graph() {
  Graph gr("stream_3r2w");
  Value p = gr.param("param"), g = gr.grad("grad"), b = gr.state("momentum_buffer");
  gr.output("param", p + g);
  gr.output("momentum_buffer", b + g);
  return gr;
}

void BM_Ceiling_3R2W(benchmark::State& state) {
  run_fused(state, stream_3r2w_graph(), {}, kSgdBytes);
}

// ---- Paired: two kernels alternated call by call -------------------------------------------
// On a shared machine, load from other processes comes and goes between benchmarks and spoils a
// ratio of two separate runs. Here each iteration times one call of each kernel (order alternated,
// each over its own arrays), so both see the same conditions; the counters give the ratio of
// speeds two ways:
//   ratio_median = median(b call) / median(a call)
//   ratio_min    = fastest b call / fastest a call (preemption only ever adds time)
// bytes_per_second counts both calls (2 x `bytes` per element, default AdamW's 28).
void paired_calls(benchmark::State& state, const Kernel& a,
                  const std::map<std::string, double>& a_scalars, const Kernel& b,
                  const std::map<std::string, double>& b_scalars, int64_t bytes = kAdamBytes,
                  int64_t cols = 0) {
  std::vector<double> t_a, t_b;
  Arrays arrays(8, state.range(0));
  KernelCall ca = call_over(a, arrays, 0, a_scalars);
  KernelCall cb = call_over(b, arrays, 4, b_scalars);
  ca.cols = cb.cols = cols;  // (per-row and per-column kernels: one matrix of rows of `cols`)
  for (int i = 0; i < kWarmup; ++i) a.run(ca), b.run(cb);
  auto timed = [](const Kernel& k, const KernelCall& c) {
    auto t0 = Clock::now();
    k.run(c);
    return seconds_since(t0);
  };
  bool a_first = true;
  for (auto _ : state) {
    if (a_first) {
      t_a.push_back(timed(a, ca));
      t_b.push_back(timed(b, cb));
    } else {
      t_b.push_back(timed(b, cb));
      t_a.push_back(timed(a, ca));
    }
    a_first = !a_first;
  }
  state.counters["ratio_median"] = median(t_b) / median(t_a);
  state.counters["ratio_min"] =
      *std::min_element(t_b.begin(), t_b.end()) / *std::min_element(t_a.begin(), t_a.end());
  set_bytes(state, 2 * bytes);
}

// Fused AdamW against the ceiling, both with schedule `s`: ratio = AdamW's share of the ceiling.
void paired_adamw_ceiling(benchmark::State& state, const Schedule& s) {
  try {
    auto fused = engine().kernel(optim::make_rule("adamw")->graph(adamw_options()), s);
    auto ceiling = engine().kernel(tools::stream_4r3w_graph(), s);
    paired_calls(state, *fused, adamw_scalars(), *ceiling, {});
    state.SetLabel("adamw " + fused->key().substr(0, 16) + " vs stream_4r3w " +
                   ceiling->key().substr(0, 16) + ", both " + fused->schedule().str());
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void BM_Paired_AdamW_Ceiling(benchmark::State& state) {
  paired_adamw_ceiling(state, engine().options().schedule);
}

// The same pair with software prefetch off in both kernels (src/lower/README.md, "Software
// prefetch"): what the prefetches buy, side by side with the default in one run.
void BM_Paired_AdamW_Ceiling_NoPrefetch(benchmark::State& state) {
  Schedule s = engine().options().schedule;
  s.prefetch = 0;
  s.prefetch_l2 = 0;
  paired_adamw_ceiling(state, s);
}

// The same pair with the L2 prefetch off in both kernels (src/lower/README.md, "A second
// prefetch into L2"): what it buys, side by side with the default in one run.
void BM_Paired_AdamW_Ceiling_NoL2Prefetch(benchmark::State& state) {
  Schedule s = engine().options().schedule;
  s.prefetch_l2 = 0;
  paired_adamw_ceiling(state, s);
}

// Fused AdamW with the default schedule against fused AdamW without the L2 prefetch: ratio =
// the default's speed-up in absolute time (the ceiling pairs above give shares, not speeds).
void BM_Paired_AdamW_L2Prefetch_Speedup(benchmark::State& state) {
  Schedule without = engine().options().schedule;
  without.prefetch_l2 = 0;
  try {
    const Graph g = optim::make_rule("adamw")->graph(adamw_options());
    auto with_l2 = engine().kernel(g), without_l2 = engine().kernel(g, without);
    paired_calls(state, *with_l2, adamw_scalars(), *without_l2, adamw_scalars());
    state.SetLabel(with_l2->schedule().str() + " vs " + without_l2->schedule().str());
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// The same pair with the schedule the engine's database (resolve_schedule_db: $OPTFUSE_SCHEDULES,
// the per-user one, the shipped one) gives AdamW at this size, in both kernels: what a tuned
// engine runs, against the same ceiling.
void BM_Paired_AdamW_Ceiling_Tuned(benchmark::State& state) {
  static Engine tuned;  // only to look the schedule up: engine() compiles both kernels
  paired_adamw_ceiling(
      state, tuned.schedule_for(optim::make_rule("adamw")->graph(adamw_options()), state.range(0)));
}

// ---- Adadelta, Rprop, ASGD against their byte ceilings ---------------------------------------
// Each library rule's kernel (torch's defaults, the scalars of step 10 as the rule computes them)
// paired with the ceiling of its traffic, both with the engine's schedule: ratio = its share of
// the ceiling. Adadelta (p, g, square_avg, acc_delta) and Rprop (p, g, prev, step_size) move
// AdamW's 28 B/element; ASGD (p, g, ax -> p, ax) SGD-momentum's 20.
std::map<std::string, double> rule_scalars(const optim::UpdateRule& rule, const Options& h,
                                           int64_t step) {
  optim::HostState host = rule.initial_host_state(h);
  std::map<std::string, double> s;
  for (int64_t t = 1; t <= step; ++t) {  // host state (ASGD's eta and mu) as after step - 1
    s.clear();
    rule.scalars(h, optim::TensorStep{t, t == 1, &host}, &s);
  }
  return s;
}

void paired_rule_ceiling(benchmark::State& state, const std::string& type, const Options& over,
                         const Graph& ceiling_graph, int64_t bytes) {
  try {
    auto rule = optim::make_rule(type);
    Options h = rule->defaults();
    if (over.is_object()) h.update(over);
    auto fused = engine().kernel(rule->graph(h));
    auto ceiling = engine().kernel(ceiling_graph);
    paired_calls(state, *fused, rule_scalars(*rule, h, 10), *ceiling, {}, bytes);
    state.SetLabel(type + " " + fused->key().substr(0, 16) + " vs " + ceiling->name() + " " +
                   ceiling->key().substr(0, 16) + ", both " + fused->schedule().str());
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void BM_Paired_Adadelta_Ceiling(benchmark::State& state) {
  paired_rule_ceiling(state, "adadelta", {}, tools::stream_4r3w_graph(), kAdamBytes);
}

void BM_Paired_Rprop_Ceiling(benchmark::State& state) {
  paired_rule_ceiling(state, "rprop", {}, tools::stream_4r3w_graph(), kAdamBytes);
}

// torch's t0 = 1e6: ax is a copy of the param (the kernel's copy case).
void BM_Paired_ASGD_Ceiling(benchmark::State& state) {
  paired_rule_ceiling(state, "asgd", {}, stream_3r2w_graph(), kSgdBytes);
}

// t0 = 0: at step 10 ax averages (mu = 1/9), reading ax.
void BM_Paired_ASGD_Averaging_Ceiling(benchmark::State& state) {
  paired_rule_ceiling(state, "asgd", {{"t0", 0.0}}, stream_3r2w_graph(), kSgdBytes);
}

// ---- Adafactor against its byte ceiling ------------------------------------------------------
// Its factored kernel on one square matrix (torch's defaults, the scalars of step 10) paired with
// a staged kernel of the same passes and trivial arithmetic: p' = p + col_sum(g) + sum(g) +
// sum(p), which reads g three times and p twice (24 B/element). ratio = its share of the ceiling.
Graph adafactor_ceiling_graph() {
  Graph g("ceiling_adafactor");
  Value p = g.param("p"), grad = g.grad("g");
  g.output("p", p + col_sum(grad) + reduce_sum(grad) + reduce_sum(p));
  return g;
}

void BM_Paired_Adafactor_Ceiling(benchmark::State& state) {
  try {
    auto rule = optim::make_rule("adafactor");
    const Options h = rule->defaults();
    auto fused = engine().kernel(*rule->factored_graph(h));
    auto ceiling = engine().kernel(adafactor_ceiling_graph());
    const auto side = static_cast<int64_t>(std::llround(std::sqrt(double(state.range(0)))));
    paired_calls(state, *fused, rule_scalars(*rule, h, 10), *ceiling, {}, 24, side);
    state.SetLabel("adafactor (factored) " + fused->key().substr(0, 16) + " vs " + ceiling->name() +
                   " " + ceiling->key().substr(0, 16) + ", " + std::to_string(side) + " x " +
                   std::to_string(side));
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// Registered size-major (every variant at 2^10, then every variant at 2^12, ...) so that the
// runs a ratio compares are close in time on a noisy machine. Sizes: 2^10 (L1-resident) ..
// 2^26 (1.75 GiB of AdamW traffic per step, far past L3), every factor of 4.
void register_all() {
  const std::pair<const char*, void (*)(benchmark::State&)> variants[] = {
      {"BM_AdamW_Fused", BM_AdamW_Fused},
      {"BM_AdamW_Optimizer", BM_AdamW_Optimizer},
      {"BM_Ceiling_4R3W", BM_Ceiling_4R3W},
      {"BM_Paired_AdamW_Ceiling", BM_Paired_AdamW_Ceiling},
      {"BM_Paired_AdamW_Ceiling_NoPrefetch", BM_Paired_AdamW_Ceiling_NoPrefetch},
      {"BM_Paired_AdamW_Ceiling_NoL2Prefetch", BM_Paired_AdamW_Ceiling_NoL2Prefetch},
      {"BM_Paired_AdamW_L2Prefetch_Speedup", BM_Paired_AdamW_L2Prefetch_Speedup},
      {"BM_Paired_AdamW_Ceiling_Tuned", BM_Paired_AdamW_Ceiling_Tuned},
      {"BM_AdamW_Unfused", BM_AdamW_Unfused},
      {"BM_AdamW_Scalar", BM_AdamW_Scalar},
      {"BM_SGDMomentum_Fused", BM_SGDMomentum_Fused},
      {"BM_Ceiling_3R2W", BM_Ceiling_3R2W},
      {"BM_SGDMomentum_Unfused", BM_SGDMomentum_Unfused},
      {"BM_SGDMomentum_Scalar", BM_SGDMomentum_Scalar},
      {"BM_Paired_Adadelta_Ceiling", BM_Paired_Adadelta_Ceiling},
      {"BM_Paired_Rprop_Ceiling", BM_Paired_Rprop_Ceiling},
      {"BM_Paired_ASGD_Ceiling", BM_Paired_ASGD_Ceiling},
      {"BM_Paired_ASGD_Averaging_Ceiling", BM_Paired_ASGD_Averaging_Ceiling},
      {"BM_Paired_Adafactor_Ceiling", BM_Paired_Adafactor_Ceiling},
  };
  for (int64_t n = int64_t{1} << 10; n <= int64_t{1} << 26; n *= 4)
    for (const auto& [name, fn] : variants)
      benchmark::RegisterBenchmark(name, fn)->Arg(n)->UseRealTime();
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
