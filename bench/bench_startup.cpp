// Time to a callable kernel, cold vs warm disk cache (issue 3's start-up figure), in one binary:
//   Startup_Warm          Engine over a filled cache dir + the AdamW kernel: read, verify, load
//   Startup_ColdKernel    Engine over an empty cache dir + the AdamW kernel: Halide compiles it
//                         (the Halide runtime is compiled once per process, so it is timed apart)
//   RuntimeCompile        compiling the Halide runtime object for the host target (what a fresh
//                         process pays where the library's own runtime does not serve its
//                         target, jit/embedded_runtime.h: a GPU target, another architecture)
//   FirstStep_Warm        Engine + Optimizer + the first AdamW step of a small model, warm cache
// Cold is what a fresh x86-64 process pays without a cache; Warm is what it pays with.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "jit/halide_bridge.h"
#include "optfuse/optfuse.hpp"

namespace optfuse::bench {
namespace {

namespace fs = std::filesystem;

const Options kConfig = {{"type", "adamw"}, {"lr", 1e-3}};

std::string fresh_dir(const std::string& tag) {
  static int counter = 0;
  fs::path dir =
      fs::temp_directory_path() /
      ("optfuse_bench_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  fs::remove_all(dir);
  return dir.string();
}

EngineOptions with_cache(const std::string& dir) {
  EngineOptions o;
  o.cache_dir = dir;
  return o;
}

void BM_Startup_Warm(benchmark::State& state) {
  std::string dir = fresh_dir("warm");
  { Engine(with_cache(dir)).kernel(update_graph(kConfig)); }  // fill the cache
  int64_t compiles = 0, disk_hits = 0;
  for (auto _ : state) {
    {
      Engine engine(with_cache(dir));
      benchmark::DoNotOptimize(engine.kernel(update_graph(kConfig)));
      state.PauseTiming();  // tearing the JIT down is not start-up
      compiles += engine.counters().compiles;
      disk_hits += engine.counters().disk_hits;
    }
    state.ResumeTiming();
  }
  state.counters["compiles_per_start"] = double(compiles) / double(state.iterations());
  state.counters["disk_hits_per_start"] = double(disk_hits) / double(state.iterations());
  fs::remove_all(dir);
}

void BM_Startup_ColdKernel(benchmark::State& state) {
  { Engine warm_runtime; }  // the runtime compile is timed by BM_RuntimeCompile
  for (auto _ : state) {
    state.PauseTiming();
    std::string dir = fresh_dir("cold");
    state.ResumeTiming();
    {
      Engine engine(with_cache(dir));
      benchmark::DoNotOptimize(engine.kernel(update_graph(kConfig)));
      state.PauseTiming();
    }
    fs::remove_all(dir);
    state.ResumeTiming();
  }
}

void BM_RuntimeCompile(benchmark::State& state) {
  std::string target = jit::resolve_target("host");
  for (auto _ : state) benchmark::DoNotOptimize(jit::compile_runtime_object(target));
}

void BM_FirstStep_Warm(benchmark::State& state) {
  const int64_t tensors = 16, n = 1 << 16;
  std::vector<std::vector<float>> params(tensors, std::vector<float>(n, 0.5f));
  std::vector<std::vector<float>> grads(tensors, std::vector<float>(n, 0.01f));
  std::vector<ParamRef> refs;
  for (int64_t i = 0; i < tensors; ++i)
    refs.push_back({{params[i].data(), n, {}}, {grads[i].data(), n, {}}, ""});
  std::string dir = fresh_dir("first");
  { Engine(with_cache(dir)).kernel(update_graph(kConfig)); }
  for (auto _ : state) {
    {
      Engine engine(with_cache(dir));
      auto opt = Optimizer::create(engine, kConfig);
      opt->add_param_group(refs);
      opt->step();
      state.PauseTiming();
    }
    state.ResumeTiming();
  }
  state.SetLabel(std::to_string(tensors) + " tensors x " + std::to_string(n) + " elements");
  fs::remove_all(dir);
}

BENCHMARK(BM_Startup_Warm)->Unit(benchmark::kMillisecond)->Iterations(20);
BENCHMARK(BM_Startup_ColdKernel)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_RuntimeCompile)->Unit(benchmark::kMillisecond)->Iterations(2);
BENCHMARK(BM_FirstStep_Warm)->Unit(benchmark::kMillisecond)->Iterations(10);

}  // namespace
}  // namespace optfuse::bench

BENCHMARK_MAIN();
