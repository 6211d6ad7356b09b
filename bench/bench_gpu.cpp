// Fused AdamW (fp32) on a CUDA device against the device's practical limits, in one run:
//   GPU_AdamW_Fused   the library's AdamW graph, one kernel, Kernel::run with KernelCall::device
//   GPU_Ceiling_4R3W  tools/bandwidth.h (p,g,m,v -> p,m,v, one add each), same engine/schedule
//   GPU_CopyDtoD      cuMemcpyDtoD of 14 B/element: 14 read + 14 written = AdamW's 28 B/element
// at n = 2^24, 2^26, 2^28. bytes_per_second counts TRAFFIC (reads + writes) for every variant:
// 28 B/element for all three (a copy of S bytes moves 2 S), so the ratio of two bytes_per_second
// at the same n is a ratio of speeds (AdamW / copy, AdamW / ceiling).
//
// Device memory: the CUDA driver API is loaded at run time (src/jit/cuda_driver.h: dlopen
// libcuda.so.1; no link-time CUDA dependency). The engine runs its kernels in device 0's primary
// context (EngineOptions::cuda_context unset), so the benchmark allocates there: that context is
// made current on the benchmark thread for every driver call (cuMemAlloc, cuMemsetD32,
// cuMemcpyDtoD, cuCtxSynchronize). Kernels launch on its default stream, so cuCtxSynchronize
// covers them.
//
// Timing: launches are asynchronous, so every timed iteration is kBatch calls then
// cuCtxSynchronize, measured with a steady clock (UseManualTime). Without a driver or device every
// benchmark is skipped with "no CUDA device: ..." (SkipWithError: Google Benchmark 1.7 has no
// SkipWithMessage) and the process exits 77; any other failure exits 1.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "jit/cuda_driver.h"
#include "optfuse/optfuse.hpp"
#include "optim/rule.h"
#include "tools/bandwidth.h"

namespace optfuse::bench {
namespace {

constexpr int64_t kAdamBytes = 28;  // per element: 4 reads + 3 writes of fp32
constexpr int kWarmup = 3;          // untimed calls first (module load / PTX JIT on the first)
constexpr int kBatch = 8;           // calls per timed iteration, then one synchronize

using CUdeviceptr = jit::CuDevicePtr;
using Driver = jit::CudaDriver;

// Everything the benchmarks share: the driver, one CUDA engine and its kernels.
struct Gpu {
  std::string problem;  // non-empty: no usable driver/device, every benchmark skips with it
  Driver cu;            // jit::cuda_driver(), copied once loaded
  std::string device;   // "NVIDIA H200 (sm_90)"
  std::unique_ptr<Engine> engine;
  std::shared_ptr<const Kernel> adamw, ceiling;
  std::map<std::string, double> adamw_scalars;
};

// The Halide CUDA target for a device of compute capability major.minor: the highest capability
// Halide 14 knows (it stops at 8.6) not above the device's, except that sm_90 and newer get 8.0,
// the target the tests assemble for sm_90 (the driver JITs that PTX for the device).
// OPTFUSE_GPU_TARGET overrides it.
std::string target_for(int major, int minor) {
  const int cc = major * 10 + minor;
  if (cc >= 90) return "host-cuda-cuda_capability_80";
  for (int known : {86, 80, 75, 70, 61, 50, 35, 32, 30})
    if (known <= cc) return "host-cuda-cuda_capability_" + std::to_string(known);
  return "host-cuda";
}

void setup(Gpu& g) {
  if (std::string p = jit::cuda_device_problem(); !p.empty()) {
    g.problem = p.rfind("no CUDA device", 0) == 0 ? p : "no CUDA device: " + p;
    return;
  }
  g.cu = jit::cuda_driver();
  int dev = 0, major = 0, minor = 0;
  g.cu.check(g.cu.cuDeviceGet(&dev, 0),
             "cuDeviceGet");  // the engine's default (EngineOptions::cuda_device)
  g.cu.check(g.cu.cuDeviceGetAttribute(&major, 75, dev), "cuDeviceGetAttribute(major)");
  g.cu.check(g.cu.cuDeviceGetAttribute(&minor, 76, dev), "cuDeviceGetAttribute(minor)");
  char name[256] = {};
  g.cu.check(g.cu.cuDeviceGetName(name, sizeof name, dev), "cuDeviceGetName");
  g.device = std::string(name) + " (sm_" + std::to_string(major * 10 + minor) + ")";

  EngineOptions o;
  const char* env = std::getenv("OPTFUSE_GPU_TARGET");
  o.target = env && *env ? env : target_for(major, minor);
  g.engine = std::make_unique<Engine>(o);
  auto rule = optim::make_rule("adamw");
  Options defaults = rule->defaults();
  rule->scalars(defaults, optim::TensorStep{10, false}, &g.adamw_scalars);
  g.adamw = g.engine->kernel(rule->graph(defaults));
  g.ceiling = g.engine->kernel(tools::stream_4r3w_graph());

  // The engine's context (device 0's primary context), current on the benchmark thread for every
  // driver call; the kernels run in it too, on its default stream.
  g.cu.check(g.cu.cuCtxPushCurrent(jit::cuda_primary_context(0)), "cuCtxPushCurrent");
}

Gpu& gpu() {
  static Gpu g;
  static bool done = false;
  if (!done) {
    done = true;
    try {
      setup(g);
    } catch (const std::exception& e) {
      g.problem = std::string("CUDA set-up failed: ") + e.what();
    }
  }
  return g;
}

bool g_failed = false;  // a benchmark failed for a reason other than "no CUDA device"

// Device memory, freed on scope exit.
class DeviceMemory {
 public:
  DeviceMemory(const Driver& cu, size_t bytes) : cu_(cu) {
    cu_.check(cu_.cuMemAlloc(&ptr_, bytes), "cuMemAlloc");
  }
  ~DeviceMemory() { cu_.cuMemFree(ptr_); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  CUdeviceptr ptr() const { return ptr_; }

 private:
  const Driver& cu_;
  CUdeviceptr ptr_ = 0;
};

unsigned bits(float f) {
  unsigned u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Runs `body` (one batch of asynchronous work) in timed iterations, each ended by a synchronize.
template <typename Body>
void timed_loop(benchmark::State& state, const Driver& cu, Body body) {
  for (int i = 0; i < kWarmup; ++i) body();
  cu.check(cu.cuCtxSynchronize(), "cuCtxSynchronize");
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kBatch; ++i) body();
    cu.check(cu.cuCtxSynchronize(), "cuCtxSynchronize");
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
}

// Skips (and returns false) when there is no device; otherwise labels the run.
bool ready(benchmark::State& state) {
  Gpu& g = gpu();
  if (!g.problem.empty()) {
    if (g.problem.rfind("no CUDA device", 0) != 0) g_failed = true;
    state.SkipWithError(g.problem.c_str());
    return false;
  }
  return true;
}

void finish(benchmark::State& state) {
  state.SetBytesProcessed(state.iterations() * kBatch * state.range(0) * kAdamBytes);
  state.counters["B_per_elem"] = static_cast<double>(kAdamBytes);
}

// p, g, m, v: one allocation of 4 n floats (each array 256-byte aligned: n is a multiple of 64).
void run_kernel(benchmark::State& state, const Kernel& k, const std::map<std::string, double>& sc) {
  Gpu& g = gpu();
  const int64_t n = state.range(0);
  DeviceMemory mem(g.cu, size_t(4 * n) * sizeof(float));
  const float fill[4] = {0.5f, 0.01f, 0.001f, 0.0001f};  // finite, no denormals over the run
  KernelCall call{{}, std::vector<double>(k.signature().scalars.size(), 0.0), {}, n};
  call.device = true;
  for (int i = 0; i < 4; ++i) {
    CUdeviceptr at = mem.ptr() + size_t(i * n) * sizeof(float);
    g.cu.check(g.cu.cuMemsetD32(at, bits(fill[i]), size_t(n)), "cuMemsetD32");
    call.inputs.push_back(reinterpret_cast<void*>(at));
  }
  if (k.signature().inputs.size() != 4) throw Error(k.name() + ": expected 4 inputs");
  for (size_t i = 0; i < call.scalars.size(); ++i) {
    auto it = sc.find(k.signature().scalars[i].name);
    if (it == sc.end()) throw Error("no value for scalar " + k.signature().scalars[i].name);
    call.scalars[i] = it->second;
  }
  for (const auto& out : k.signature().outputs)
    call.outputs.push_back(call.inputs[k.signature().input_index(out.replaces)]);
  state.SetLabel(k.name() + " " + k.key().substr(0, 16) + " " + g.engine->target_string() + " " +
                 g.device);
  timed_loop(state, g.cu, [&] { k.run(call); });
}

void BM_GPU_AdamW_Fused(benchmark::State& state) {
  if (!ready(state)) return;
  try {
    run_kernel(state, *gpu().adamw, gpu().adamw_scalars);
  } catch (const std::exception& e) {
    g_failed = true;
    state.SkipWithError(e.what());
    return;
  }
  finish(state);
}

void BM_GPU_Ceiling_4R3W(benchmark::State& state) {
  if (!ready(state)) return;
  try {
    run_kernel(state, *gpu().ceiling, {});
  } catch (const std::exception& e) {
    g_failed = true;
    state.SkipWithError(e.what());
    return;
  }
  finish(state);
}

// cuMemcpyDtoD of 14 n bytes (3.5 fp32 arrays): 14 n read + 14 n written = 28 n, AdamW's traffic.
void BM_GPU_CopyDtoD(benchmark::State& state) {
  if (!ready(state)) return;
  try {
    Gpu& g = gpu();
    const size_t bytes = size_t(state.range(0)) * (kAdamBytes / 2);
    DeviceMemory src(g.cu, bytes), dst(g.cu, bytes);
    g.cu.check(g.cu.cuMemsetD32(src.ptr(), bits(0.5f), bytes / 4), "cuMemsetD32");
    state.SetLabel("cuMemcpyDtoD " + std::to_string(bytes) + " B " + g.device);
    timed_loop(state, g.cu,
               [&] { g.cu.check(g.cu.cuMemcpyDtoD(dst.ptr(), src.ptr(), bytes), "cuMemcpyDtoD"); });
  } catch (const std::exception& e) {
    g_failed = true;
    state.SkipWithError(e.what());
    return;
  }
  finish(state);
}

// Size-major, so the runs a ratio compares are close in time. 2^28: 7 GiB of traffic per call.
void register_all() {
  const std::pair<const char*, void (*)(benchmark::State&)> variants[] = {
      {"BM_GPU_AdamW_Fused", BM_GPU_AdamW_Fused},
      {"BM_GPU_Ceiling_4R3W", BM_GPU_Ceiling_4R3W},
      {"BM_GPU_CopyDtoD", BM_GPU_CopyDtoD},
  };
  for (int64_t n : {int64_t{1} << 24, int64_t{1} << 26, int64_t{1} << 28})
    for (const auto& [name, fn] : variants)
      benchmark::RegisterBenchmark(name, fn)->Arg(n)->UseManualTime()->Unit(
          benchmark::kMicrosecond);
}

}  // namespace
}  // namespace optfuse::bench

int main(int argc, char** argv) {
  optfuse::bench::register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  const std::string& problem = optfuse::bench::gpu().problem;
  if (optfuse::bench::g_failed) return 1;
  if (!problem.empty()) {
    std::fprintf(stderr, "bench_gpu: skipped: %s\n", problem.c_str());
    return 77;
  }
  return 0;
}
