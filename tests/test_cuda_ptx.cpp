// CUDA target without a GPU: every library optimizer structure compiles for CUDA, the PTX Halide
// embeds in the object has one kernel entry with 128-bit (v4) global loads and stores and is
// accepted by ptxas for sm_80 and sm_90; an engine that would run CUDA kernels on a machine
// without a driver/device fails at creation with a clear Error; compile-only engines and the disk
// cache work without one. Tests that need a device skip with "no CUDA device"; they include
// reducing kernels (LAMB, LARS, the statistics kernel, GC) against the CPU kernel.
#include <HalideRuntime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "engine/kernel_impl.h"
#include "jit/cuda_driver.h"
#include "jit/halide_bridge.h"
#include "jit/ptx.h"
#include "jit/session.h"
#include "optfuse/optfuse.hpp"
#include "support/ptxas.h"

namespace optfuse {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kTarget = "host-cuda-cuda_capability_80";

struct Structure {
  const char* label;
  Options config;
};

// Every structure the library optimizers produce (hyperparameter values do not change it).
std::vector<Structure> structures() {
  return {
      {"sgd", {{"type", "sgd"}, {"lr", 0.1}}},
      {"sgd_momentum", {{"type", "sgd"}, {"lr", 0.1}, {"momentum", 0.9}}},
      {"sgd_nesterov", {{"type", "sgd"}, {"lr", 0.1}, {"momentum", 0.9}, {"nesterov", true}}},
      {"adam", {{"type", "adam"}}},
      {"adam_amsgrad", {{"type", "adam"}, {"amsgrad", true}}},
      {"adamw", {{"type", "adamw"}}},
      {"adamw_amsgrad", {{"type", "adamw"}, {"amsgrad", true}}},
      {"adadelta", {{"type", "adadelta"}}},
      {"asgd", {{"type", "asgd"}}},
      {"rprop", {{"type", "rprop"}}},
  };
}

std::vector<char> cuda_object(const Graph& g, const std::string& target = kTarget) {
  return testing::cuda_object(g, target, "optfuse_cuda_test");
}

using testing::find_ptxas;
using testing::kNoPtxas;
using testing::ptxas;

TEST(CudaPtx, EveryOptimizerStructureCompilesToVectorizedPtx) {
  std::string tool = find_ptxas();
  for (const Structure& s : structures()) {
    SCOPED_TRACE(s.label);
    std::vector<std::string> ptx = jit::extract_ptx(cuda_object(update_graph(s.config)));
    ASSERT_EQ(ptx.size(), 1u);
    const std::string& text = ptx[0];
    EXPECT_THAT(text, HasSubstr(".target sm_80"));
    EXPECT_THAT(text, HasSubstr(".entry"));
    EXPECT_THAT(text, HasSubstr("ld.global.v4.f32"));  // 128-bit loads of every f32 input
    // Stores: Halide 14 emits a 4 x f32 store as one i128 store (CodeGen_PTX_Dev), which LLVM
    // 14's NVPTX backend splits into two st.global.u64 (i128 is not a legal type there): 16
    // bytes per thread in two 64-bit stores, never a scalar 32-bit global store.
    EXPECT_THAT(text, ::testing::AnyOf(HasSubstr("st.global.v4.f32"), HasSubstr("st.global.u64")));
    EXPECT_THAT(text, Not(HasSubstr("st.global.f32")));
    EXPECT_THAT(text, Not(HasSubstr("ld.global.f32")));
    if (tool.empty()) continue;
    EXPECT_EQ(ptxas(tool, text, "sm_80", s.label), "");
    EXPECT_EQ(ptxas(tool, text, "sm_90", s.label), "");
  }
  if (tool.empty()) GTEST_SKIP() << kNoPtxas << ": PTX checked, not assembled";
}

TEST(CudaPtx, PlainCudaTargetAssembles) {
  // "host-cuda" without a capability: Halide emits PTX 3.2 for sm_20, which ptxas still takes.
  std::string text =
      jit::extract_ptx(cuda_object(update_graph({{"type", "adam"}}), "host-cuda"))[0];
  EXPECT_THAT(text, HasSubstr(".target sm_20"));
  EXPECT_THAT(text, HasSubstr("ld.global.v4.f32"));
  std::string tool = find_ptxas();
  if (tool.empty()) GTEST_SKIP() << kNoPtxas;
  EXPECT_EQ(ptxas(tool, text, "sm_90", "plain"), "");
}

TEST(CudaPtx, OneKernelEntryPerGraph) {
  std::string text = jit::extract_ptx(cuda_object(update_graph({{"type", "adamw"}})))[0];
  size_t entries = 0;
  for (size_t at = text.find(".entry"); at != std::string::npos; at = text.find(".entry", at + 1))
    ++entries;
  EXPECT_EQ(entries, 1u);  // all outputs in one kernel, the uniforms inlined (no host stage)
}

// CUDA kernels keep Halide's assertions (jit/halide_bridge.cpp, kernel_target): their host code
// checks the device calls' error codes with them. (CPU kernels: test_jit_engine.cpp.)
TEST(CudaPtx, CudaKernelsKeepHalideAssertions) {
  const std::vector<char> obj = cuda_object(update_graph({{"type", "sgd"}, {"lr", 0.1}}));
  EXPECT_NE(std::string(obj.begin(), obj.end()).find("halide_error_"), std::string::npos);
}

TEST(CudaPtx, CpuObjectsHoldNoPtx) {
  std::string resolved = jit::resolve_target("host");
  std::vector<char> obj = jit::compile_kernel_object(
      canonicalize(update_graph({{"type", "sgd"}, {"lr", 0.1}})),
      jit::resolve_schedule(Schedule{}, resolved), resolved, "optfuse_cpu_test");
  EXPECT_TRUE(jit::extract_ptx(obj).empty());
}

TEST(CudaPtx, ExtractorFindsTheNulTerminatedModule) {
  std::string ptx = "//\n// Generated by LLVM NVPTX Back-End\n//\n\n.version 7.0\n.target sm_80\n";
  std::string blob = std::string(
                         "\x7f"
                         "ELF junk .version 1\0",
                         21) +
                     ptx + std::string(1, '\0') + "trailing .version 2";
  std::vector<std::string> found = jit::extract_ptx(std::vector<char>(blob.begin(), blob.end()));
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0], ptx);
}

TEST(CudaSchedule, GpuKeysAndCpuKeysAreIndependent) {
  Schedule gpu = jit::resolve_schedule(Schedule{}, jit::resolve_target(kTarget));
  EXPECT_EQ(gpu.str(), "gpu.v4.b256");
  Schedule odd;
  odd.tasks_per_thread = 7;  // a CPU-only field: no new GPU key
  EXPECT_EQ(jit::resolve_schedule(odd, jit::resolve_target(kTarget)).str(), "gpu.v4.b256");
  Schedule cpu;
  cpu.gpu_block = 128;  // a GPU-only field: CPU keys unchanged
  EXPECT_EQ(jit::resolve_schedule(cpu, jit::resolve_target("x86-64-linux-avx2")).str(),
            jit::resolve_schedule(Schedule{}, jit::resolve_target("x86-64-linux-avx2")).str());
  EXPECT_EQ(jit::resolve_schedule(Schedule{}, jit::resolve_target("x86-64-linux-avx2")).str(),
            "v16.t1.m16384");
}

TEST(CudaSchedule, BlockSizeIsAScheduleField) {
  EngineOptions o;
  o.target = kTarget;
  o.compile_only = true;
  o.memory_only = true;  // precompile() below must compile, not find a cached object
  o.schedule.gpu_block = 128;
  Engine e(o);
  Graph g = update_graph({{"type", "sgd"}, {"lr", 0.1}});
  EXPECT_NE(e.kernel_key(g), Engine([&] {
                               o.schedule.gpu_block = 0;
                               return o;
                             }())
                                 .kernel_key(g));
  std::string stmt = e.lowered_stmt(g);
  EXPECT_THAT(stmt, HasSubstr("halide_cuda_run"));
  EXPECT_THAT(stmt, HasSubstr(", 128, 1, 1,"));          // threads per block
  EXPECT_THAT(stmt, HasSubstr(".extent.0 + 511)/512"));  // blocks: ceil(n / (128 * 4)), any n
  EXPECT_THAT(stmt, Not(HasSubstr("uniforms")));         // inlined: no host stage, no copy
  EXPECT_FALSE(e.precompile(g));
}

// LLVM 14's NVPTX backend cannot select an f32 -> bf16 fp_round (it aborts the process); the
// lowering writes bf16 conversions as integer operations (src/lower/bf16.h), so bf16 params
// (f32 master) and bf16 state compile for the GPU, round to nearest even as the CPU path does,
// and assemble. (Their bits against the CPU need a device: the GPU check.)
TEST(CudaPtx, Bf16ParamsAndStateCompileAndAssemble) {
  std::string tool = find_ptxas();
  struct Case {
    const char* label;  // (a file name for ptxas: no spaces)
    Graph g;
  };
  std::vector<Case> cases;
  cases.push_back({"adamw_bf16_state", update_graph({{"type", "adamw"}, {"state_dtype", "bf16"}})});
  cases.push_back(
      {"adamw_bf16_params", update_graph({{"type", "adamw"}}, {}, DType::BF16, DType::BF16)});
  cases.push_back({"sgd_bf16_params_and_state",
                   update_graph({{"type", "sgd"}, {"momentum", 0.9}, {"state_dtype", "bf16"}}, {},
                                DType::BF16, DType::F32)});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    std::vector<std::string> ptx = jit::extract_ptx(cuda_object(c.g));
    ASSERT_EQ(ptx.size(), 1u);
    EXPECT_THAT(ptx[0], Not(HasSubstr("bf16")));  // no float conversion instruction: integer ops
    if (tool.empty()) continue;
    EXPECT_EQ(ptxas(tool, ptx[0], "sm_80", c.label), "");
    EXPECT_EQ(ptxas(tool, ptx[0], "sm_90", c.label), "");
  }
  if (tool.empty()) GTEST_SKIP() << kNoPtxas << ": PTX checked, not assembled";
}

TEST(CudaEngine, CompileOnlyEngineCachesObjectsWithoutADevice) {
  fs::path dir = fs::temp_directory_path() / ("optfuse-cuda-cache-" + std::to_string(getpid()));
  fs::remove_all(dir);
  Graph g = update_graph({{"type", "adam"}});
  for (const std::string& target : std::vector<std::string>{"host-cuda", kTarget}) {
    SCOPED_TRACE(target);
    EngineOptions o;
    o.target = target;
    o.compile_only = true;
    o.cache_dir = dir.string();
    {
      Engine e(o);
      EXPECT_FALSE(e.precompile(g));  // compiled and stored
      EXPECT_FALSE(e.precompile_runtime());
      EXPECT_THAT([&] { e.kernel(g); }, ::testing::ThrowsMessage<Error>(HasSubstr("compile-only")));
    }
    Engine again(o);
    EXPECT_TRUE(again.precompile(g));  // from the disk cache
    EXPECT_TRUE(again.precompile_runtime());
    EXPECT_EQ(again.counters().compiles, 0);
  }
  fs::remove_all(dir);
}

TEST(CudaEngine, CreationWithoutADeviceIsAClearError) {
  if (jit::cuda_device_problem().empty()) GTEST_SKIP() << "a CUDA device is present";
  for (const std::string& target : std::vector<std::string>{"host-cuda", kTarget}) {
    EngineOptions o;
    o.target = target;
    EXPECT_THAT([&] { Engine e(o); },
                ::testing::ThrowsMessage<Error>(AllOf(
                    HasSubstr("target " + jit::resolve_target(target) + ": "),
                    ::testing::AnyOf(HasSubstr("no CUDA driver found (libcuda.so.1 could not be "
                                               "loaded)"),
                                     HasSubstr("no CUDA device")))));
  }
}

TEST(CudaCall, CpuKernelsRejectDevicePointers) {
  Engine e;
  auto k = e.kernel(update_graph({{"type", "sgd"}, {"lr", 0.1}}));
  std::vector<float> p(8), g(8);
  KernelCall call{{p.data(), g.data()}, {1.0, 0.1, 0.0}, {p.data()}, 8};
  call.scalars.resize(k->signature().scalars.size(), 0.0);
  k->run(call);
  call.device = true;
  EXPECT_THAT([&] { k->run(call); },
              ::testing::ThrowsMessage<Error>(HasSubstr("runs on the CPU: its call needs host "
                                                        "pointers")));
}

// A kernel that says it runs on CUDA (the device interface is never reached: check() throws).
std::shared_ptr<engine_detail::KernelImpl> fake_cuda_kernel(Engine& e) {
  auto k = std::dynamic_pointer_cast<const engine_detail::KernelImpl>(
      e.kernel(update_graph({{"type", "sgd"}, {"lr", 0.1}})));
  static int not_an_interface;
  return std::make_shared<engine_detail::KernelImpl>(
      k->signature(), k->key(), "fake_cuda", k->schedule(), k->session(), k->entry(),
      reinterpret_cast<const halide_device_interface_t*>(&not_an_interface));
}

TEST(CudaCall, CudaKernelsRejectHostPointers) {
  Engine e;
  auto k = fake_cuda_kernel(e);
  EXPECT_TRUE(k->on_device());
  alignas(16) float p[8] = {}, g[8] = {};
  KernelCall call{{p, g}, std::vector<double>(k->signature().scalars.size(), 0.0), {p}, 8};
  EXPECT_THAT([&] { k->run(call); }, ::testing::ThrowsMessage<Error>(
                                         AllOf(HasSubstr("\"fake_cuda\" runs on a CUDA device"),
                                               HasSubstr("host pointers are not accepted"))));
}

TEST(CudaCall, DevicePointersMustBeAligned) {
  Engine e;
  auto k = fake_cuda_kernel(e);
  alignas(16) float p[12] = {}, g[12] = {};
  KernelCall call{{p + 1, g}, std::vector<double>(k->signature().scalars.size(), 0.0), {p + 1}, 8};
  call.device = true;  // (host memory standing in for device pointers: only checked here)
  EXPECT_THAT([&] { k->run(call); },
              ::testing::ThrowsMessage<Error>(HasSubstr("is not 16-byte aligned")));
}

// The CUDA runtime asks optfuse's hooks for its context and stream, which answer from the call:
// checked here without a device by calling the runtime's own entry points with a call context.
TEST(CudaSession, RuntimeTakesContextAndStreamFromTheCall) {
  auto session = jit::Session::create(jit::compile_runtime_object(jit::resolve_target(kTarget)), 1,
                                      /*cuda=*/true);
  using Acquire = int (*)(void*, void**, bool);
  using Release = int (*)(void*);
  using GetStream = int (*)(void*, void*, void**);
  auto acquire = reinterpret_cast<Acquire>(session->lookup("halide_cuda_acquire_context"));
  auto release = reinterpret_cast<Release>(session->lookup("halide_cuda_release_context"));
  auto get_stream = reinterpret_cast<GetStream>(session->lookup("halide_cuda_get_stream"));
  int fake_context, fake_stream;
  jit::CallContext call;
  call.cuda = {&fake_context, &fake_stream};
  void* ctx = nullptr;
  void* stream = nullptr;
  ASSERT_EQ(acquire(&call, &ctx, true), 0);
  EXPECT_EQ(ctx, &fake_context);
  ASSERT_EQ(get_stream(&call, ctx, &stream), 0);
  EXPECT_EQ(stream, &fake_stream);
  EXPECT_EQ(release(&call), 0);
  // Without a context in the call: device 0's primary context, or a clear error without one.
  jit::CallContext bare;
  int rc = acquire(&bare, &ctx, true);
  if (jit::cuda_device_problem().empty()) {
    EXPECT_EQ(rc, 0);
    EXPECT_EQ(ctx, jit::cuda_primary_context(0));
  } else {
    EXPECT_NE(rc, 0);
    EXPECT_THAT(bare.error, HasSubstr(jit::cuda_device_problem()));
  }
}

// Device memory for `host` in the engine's CUDA context (device 0's primary context, where kernels
// run).
class DeviceArray {
 public:
  using Fn = int (*)(void*, halide_buffer_t*, const halide_device_interface_t*);
  using Fn1 = int (*)(void*, halide_buffer_t*);
  DeviceArray(jit::Session& s, const halide_device_interface_t* cuda, std::vector<float>& host)
      : s_(s), dim_{0, static_cast<int32_t>(host.size()), 1, 0} {
    b_.host = reinterpret_cast<uint8_t*>(host.data());
    b_.type = halide_type_t(halide_type_float, 32);
    b_.dimensions = 1;
    b_.dim = &dim_;
    EXPECT_EQ(reinterpret_cast<Fn>(s_.lookup("halide_device_malloc"))(nullptr, &b_, cuda), 0);
    b_.flags |= halide_buffer_flag_host_dirty;
    EXPECT_EQ(reinterpret_cast<Fn>(s_.lookup("halide_copy_to_device"))(nullptr, &b_, cuda), 0);
  }
  ~DeviceArray() { reinterpret_cast<Fn1>(s_.lookup("halide_device_free"))(nullptr, &b_); }
  void* device() { return reinterpret_cast<void*>(b_.device); }
  void to_host() {  // after the kernel wrote it behind Halide's back
    EXPECT_EQ(reinterpret_cast<Fn1>(s_.lookup("halide_device_sync"))(nullptr, &b_), 0);
    b_.flags |= halide_buffer_flag_device_dirty;
    EXPECT_EQ(reinterpret_cast<Fn1>(s_.lookup("halide_copy_to_host"))(nullptr, &b_), 0);
  }

 private:
  jit::Session& s_;
  halide_dimension_t dim_;
  halide_buffer_t b_{};
};

TEST(CudaEngine, RunsOnADeviceLikeTheCpu) {
  std::string problem = jit::cuda_device_problem();
  if (!problem.empty()) GTEST_SKIP() << "no CUDA device: " << problem;
  EngineOptions o;
  o.target = kTarget;
  Engine gpu(o), cpu;
  for (const Structure& st : structures()) {
    SCOPED_TRACE(st.label);
    Graph g = update_graph(st.config);
    auto gk = std::dynamic_pointer_cast<const engine_detail::KernelImpl>(gpu.kernel(g));
    auto ck = cpu.kernel(g);
    ASSERT_TRUE(gk->on_device());
    const int64_t n = 1000003;  // not a multiple of 4 or of a block: both tails run
    std::vector<std::vector<float>> host, ref;
    for (size_t i = 0; i < gk->signature().inputs.size(); ++i) {
      std::vector<float> v(n);
      for (int64_t j = 0; j < n; ++j) v[j] = 0.5f + 0.25f * std::sin(float(j * (i + 1)));
      host.push_back(v);
    }
    ref = host;
    std::vector<double> scalars(gk->signature().scalars.size());
    for (size_t i = 0; i < scalars.size(); ++i) scalars[i] = 0.1 * (i + 1);
    KernelCall c{{}, scalars, {}, n};
    for (auto& v : ref) c.inputs.push_back(v.data());
    for (const auto& out : gk->signature().outputs)
      c.outputs.push_back(c.inputs[gk->signature().input_index(out.replaces)]);
    ck->run(c);  // in place on the CPU copies
    std::vector<std::unique_ptr<DeviceArray>> dev;
    KernelCall d{{}, scalars, {}, n};
    d.device = true;
    for (auto& v : host) {
      dev.push_back(
          std::make_unique<DeviceArray>(*gk->session(), gk->session()->cuda_device_interface(), v));
      d.inputs.push_back(dev.back()->device());
    }
    for (const auto& out : gk->signature().outputs)
      d.outputs.push_back(d.inputs[gk->signature().input_index(out.replaces)]);
    gk->run(d);  // in place on the device
    for (size_t i = 0; i < host.size(); ++i) {
      dev[i]->to_host();
      for (int64_t j = 0; j < n; j += (j < n - 64 ? 997 : 1))
        ASSERT_NEAR(host[i][j], ref[i][j], 1e-5f * std::max(1.0f, std::fabs(ref[i][j])))
            << "tensor " << i << " element " << j;
    }
  }
}

// Reducing kernels on the device (issue 7: LAMB, the statistics kernel, gradient centralization)
// against the same graph's CPU kernel: outputs in place, results copied back by Halide.
void expect_device_matches_cpu(Engine& gpu, Engine& cpu, const Graph& g, int64_t n, int64_t cols) {
  auto gk = std::dynamic_pointer_cast<const engine_detail::KernelImpl>(gpu.kernel(g));
  auto ck = cpu.kernel(g);
  ASSERT_TRUE(gk->on_device());
  const KernelSignature& sig = gk->signature();
  std::vector<std::vector<float>> host, ref;
  for (size_t i = 0; i < sig.inputs.size(); ++i) {
    std::vector<float> v(std::max<int64_t>(n, 1));
    for (int64_t j = 0; j < n; ++j) v[j] = 0.5f + 0.25f * std::sin(float(j * (i + 1)));
    host.push_back(v);
  }
  ref = host;
  std::vector<double> scalars(sig.scalars.size());
  for (size_t i = 0; i < scalars.size(); ++i) scalars[i] = 0.1 * (i + 1);
  std::vector<double> cpu_results(sig.results.size()), gpu_results(sig.results.size(), -1.0);
  KernelCall c{{}, scalars, {}, n};
  c.cols = cols;
  c.results = cpu_results.data();
  for (auto& v : ref) c.inputs.push_back(v.data());
  for (const auto& out : sig.outputs) c.outputs.push_back(c.inputs[sig.input_index(out.replaces)]);
  ck->run(c);
  std::vector<std::unique_ptr<DeviceArray>> dev;
  KernelCall d{{}, scalars, {}, n};
  d.cols = cols;
  d.results = gpu_results.data();
  d.device = true;
  for (auto& v : host) {
    dev.push_back(
        std::make_unique<DeviceArray>(*gk->session(), gk->session()->cuda_device_interface(), v));
    d.inputs.push_back(dev.back()->device());
  }
  for (const auto& out : sig.outputs) d.outputs.push_back(d.inputs[sig.input_index(out.replaces)]);
  gk->run(d);
  for (size_t i = 0; i < sig.results.size(); ++i) {
    if (gpu_results[i] == cpu_results[i]) continue;  // also -inf: the max of nothing
    EXPECT_NEAR(gpu_results[i], cpu_results[i], 1e-12 * (1 + std::fabs(cpu_results[i])))
        << "result " << sig.results[i].name;
  }
  for (size_t i = 0; i < host.size(); ++i) {
    dev[i]->to_host();
    for (int64_t j = 0; j < n; j += (j < n - 64 ? 997 : 1))
      ASSERT_NEAR(host[i][j], ref[i][j], 1e-5f * std::max(1.0f, std::fabs(ref[i][j])))
          << "tensor " << i << " element " << j;
  }
}

TEST(CudaEngine, ReducingKernelsRunOnADeviceLikeTheCpu) {
  std::string problem = jit::cuda_device_problem();
  if (!problem.empty()) GTEST_SKIP() << "no CUDA device: " << problem;
  EngineOptions o;
  o.target = kTarget;
  Engine gpu(o), cpu;
  Graph stats("stats");
  Value grad = stats.grad("g");
  stats.result("sumsq", sum_squares(grad));
  stats.result("maxabs", max_abs(grad));
  {
    SCOPED_TRACE("lamb");
    expect_device_matches_cpu(gpu, cpu, update_graph({{"type", "lamb"}}), 1000003, 0);
  }
  {
    SCOPED_TRACE("lars, 5 elements");
    expect_device_matches_cpu(gpu, cpu, update_graph({{"type", "lars"}}), 5, 0);
  }
  for (int64_t n : {int64_t(0), int64_t(3), int64_t(1) << 22}) {
    SCOPED_TRACE("statistics, n = " + std::to_string(n));
    expect_device_matches_cpu(gpu, cpu, stats, n, 0);
  }
  for (int64_t cols : {int64_t(7), int64_t(1030), int64_t(20000)}) {
    SCOPED_TRACE("adamw with gradient centralization, cols = " + std::to_string(cols));
    expect_device_matches_cpu(gpu, cpu,
                              update_graph({{"type", "adamw"}, {"grad_centralization", true}}),
                              cols * 37, cols);
  }
}

}  // namespace
}  // namespace optfuse
