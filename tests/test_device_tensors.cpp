// Device tensors in the Optimizer and the C API (optim.h "Device tensors", optfuse.h).
//
// Without a GPU (here): the memory checks (device tensors on a CPU engine, host tensors on a CUDA
// engine, mixing), the features refused on the device, a stream given to a CPU optimizer, and the
// C API's error texts. CUDA engines that would run kernels need a device, so the CUDA-side checks
// use compile-only engines (they accept device tensors; kernel() and so step() throw).
// With a GPU (scripts/gpu_check.sh): AdamW, SGD and Adagrad on device tensors against the same
// optimizer on the CPU, on the default stream and on a stream of our own; f16 params (master
// copies made on the device); gradient accumulation; save / load of device state
// (to a CPU optimizer and back to a GPU one); the C API. These skip with "no CUDA device: ..."
// where there is none.
#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "jit/cuda_driver.h"
#include "optfuse/optfuse.h"
#include "optfuse/optfuse.hpp"
#include "optim/precision.h"

namespace optfuse {
namespace {

using ::testing::HasSubstr;

const std::string kGpuTarget = "host-cuda-cuda_capability_80";

// Addresses standing in for device pointers where nothing dereferences them (16-byte aligned,
// distinct, never overlapping for the sizes used here).
void* fake_device(int i) {
  return reinterpret_cast<void*>(uintptr_t(0x7000000000) + uintptr_t(i) * 0x100000);
}

ParamRef device_ref(int i, int64_t n, std::string name = "", DType grad = DType::F32) {
  ParamRef r;
  r.param = {fake_device(2 * i), n, {}, DType::F32, Memory::Cuda};
  r.grad = {fake_device(2 * i + 1), n, {}, grad, Memory::Cuda};
  r.name = std::move(name);
  return r;
}

EngineOptions compile_only_cuda() {
  EngineOptions o;
  o.target = kGpuTarget;
  o.compile_only = true;
  return o;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// ---- memory checks (no device needed) ------------------------------------------------------

TEST(DeviceTensors, CpuEngineRejectsDeviceTensorsNamingThem) {
  Engine cpu;
  auto opt = Optimizer::create(cpu, {{"type", "adamw"}});
  std::vector<float> p(8), g(8);
  ParamRef host{{p.data(), 8}, {g.data(), 8}, "bias"};
  std::string e = error_of([&] { opt->add_param_group({host, device_ref(0, 8, "w")}); });
  // Tensor 1 is device memory, tensor 0 host: the mix is named first.
  EXPECT_THAT(e, HasSubstr("param group 0, tensor 1 ('w'): param is in CUDA device memory but the "
                           "group's first param (tensor 0) is in host memory"));
  EXPECT_THAT(e, HasSubstr("does not mix host and device tensors"));
  e = error_of([&] { opt->add_param_group({device_ref(0, 8, "w")}); });
  EXPECT_THAT(e, HasSubstr("param group 0, tensor 0 ('w'): param is in CUDA device memory but the "
                           "engine's target"));
  EXPECT_THAT(e, HasSubstr("runs kernels on the CPU"));
  EXPECT_EQ(opt->num_groups(), 0u);  // nothing added
  opt->add_param_group({host});
  EXPECT_EQ(opt->num_groups(), 1u);
}

TEST(DeviceTensors, MixingParamAndGradMemoryIsAnError) {
  Engine cpu;
  auto opt = Optimizer::create(cpu, {{"type", "sgd"}, {"lr", 0.1}});
  std::vector<float> p(8), g(8);
  ParamRef r{{p.data(), 8}, {fake_device(1), 8, {}, DType::F32, Memory::Cuda}, "fc"};
  EXPECT_THAT(error_of([&] { opt->add_param_group({r}); }),
              HasSubstr("param group 0, tensor 0 ('fc'): grad is in CUDA device memory but the "
                        "group's first param (tensor 0) is in host memory"));
  // Across groups: group 1's device tensors against group 0's host ones.
  opt->add_param_group({ParamRef{{p.data(), 8}, {g.data(), 8}}});
  EXPECT_THAT(error_of([&] { opt->add_param_group({device_ref(3, 8)}); }),
              HasSubstr("param group 1, tensor 0: param is in CUDA device memory but the "
                        "optimizer's tensors are in host memory"));
  // A new grad in the other memory.
  EXPECT_THAT(error_of([&] {
                opt->set_grad(0, 0, {fake_device(9), 8, {}, DType::F32, Memory::Cuda});
              }),
              HasSubstr("param group 0, tensor 0: the new grad is in CUDA device memory but this "
                        "optimizer's tensors are in host memory"));
  EXPECT_EQ(opt->num_groups(), 1u);
}

TEST(DeviceTensors, CudaEngineRejectsHostTensorsAndTakesDeviceOnes) {
  Engine gpu(compile_only_cuda());
  auto opt = Optimizer::create(gpu, {{"type", "adamw"}, {"lr", 1e-3}});
  std::vector<float> p(8), g(8);
  EXPECT_THAT(error_of([&] {
                opt->add_param_group({ParamRef{{p.data(), 8}, {g.data(), 8}, "b"}});
              }),
              HasSubstr("param group 0, tensor 0 ('b'): param is in host memory but the engine's "
                        "target " +
                        gpu.target_string() +
                        " runs kernels on a CUDA device: give "
                        "device tensors (TensorRef::memory = Memory::Cuda)"));
  opt->add_param_group({device_ref(0, 1000, "w"), device_ref(1, 17, "b")});
  opt->add_param_group({device_ref(2, 64, "e", DType::BF16)});  // bf16 grads: fine
  EXPECT_EQ(opt->group_size(0), 2u);
  // Overlap checks see device addresses like host ones.
  EXPECT_THAT(error_of([&] { opt->add_param_group({device_ref(0, 1000)}); }),
              HasSubstr("the same param is also param group 0, tensor 0 ('w')"));
  // The step fails before anything is allocated or run (a compile-only engine has no kernels).
  EXPECT_THROW(opt->step(), Error);
  EXPECT_EQ(opt->step_count(0, 0), 0);
  TensorRef s = opt->state_ref(0, 0, "exp_avg");
  EXPECT_EQ(s.data, nullptr);
  EXPECT_EQ(s.memory, Memory::Cuda);
  EXPECT_EQ(opt->state(0, 0, "exp_avg"), nullptr);
  // Its state file (no state yet) saves; loading needs a CUDA context, which it lacks.
  const std::string file = testing::TempDir() + "optfuse_compile_only_" + std::to_string(getpid());
  opt->save_state(file);
  EXPECT_THAT(error_of([&] { opt->load_state(file); }),
              HasSubstr("cannot be loaded onto device tensors by an optimizer of a compile-only "
                        "engine"));
  std::remove(file.c_str());
}

TEST(DeviceTensors, FeaturesNotYetOnTheDeviceAreNamed) {
  Engine gpu(compile_only_cuda());
  auto create = [&](Options config) { return error_of([&] { Optimizer::create(gpu, config); }); };
  const std::string not_yet = "is not supported on CUDA device tensors yet";
  EXPECT_THAT(create({{"type", "lamb"}}),
              HasSubstr("optimizer config: " + std::string("lamb (its update reduces")));
  EXPECT_THAT(create({{"type", "lars"}}), HasSubstr("lars (its update reduces"));
  EXPECT_THAT(create({{"type", "lamb"}}), HasSubstr(not_yet));
  EXPECT_THAT(create({{"type", "adamw"}, {"max_grad_norm", 1.0}}),
              HasSubstr("optimizer config: max_grad_norm (global-norm clipping needs a GPU "
                        "reduction) " +
                        not_yet));
  EXPECT_THAT(create({{"type", "adamw"}, {"loss_scale", "dynamic"}}), HasSubstr("loss_scale"));
  Optimizer::create(gpu, {{"type", "sgd"}, {"accumulation_steps", 4}});  // no reduction: fine
  EXPECT_THAT(create({{"type", "sparseadam"}}),
              HasSubstr("sparseadam (row-sparse gradients) " + not_yet));
  EXPECT_THAT(
      create({{"type", "adamw"}, {"grad_centralization", true}}),
      HasSubstr("optimizer config: grad_centralization (it needs a GPU row reduction) " + not_yet));

  auto opt = Optimizer::create(gpu, {{"type", "adamw"}});
  EXPECT_THAT(error_of([&] {
                opt->add_param_group({device_ref(0, 8)}, {{"grad_centralization", true}});
              }),
              HasSubstr("param group 0: grad_centralization"));
  EXPECT_EQ(opt->num_groups(), 0u);
  // bf16 params and bf16 state: accepted (bf16 stores compile for CUDA, src/lower/bf16.h).
  Optimizer::create(gpu, {{"type", "adamw"}, {"state_dtype", "bf16"}});
  ParamRef bf16 = device_ref(0, 8, "emb");
  bf16.param.dtype = DType::BF16;
  opt->add_param_group({bf16}, {{"state_dtype", "bf16"}});
  EXPECT_EQ(opt->num_groups(), 1u);
  EXPECT_THAT(error_of([&] { opt->set(0, "grad_centralization", true); }),
              HasSubstr("param group 0: grad_centralization"));
  opt->set(0, "state_dtype", "f32");                             // and back
  EXPECT_FALSE(opt->get(0, "grad_centralization").get<bool>());  // unchanged
}

// The kernel that makes a 16-bit device param's master copy: exact widening (checked on the CPU,
// where its output can be read), and it compiles for CUDA.
TEST(DeviceTensors, MasterCopyKernelWidensExactly) {
  Engine cpu, gpu(compile_only_cuda());
  for (DType t : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(t));
    std::vector<uint16_t> param(70000);
    for (size_t i = 0; i < param.size(); ++i)
      param[i] = uint16_t(i * 7919u);  // every kind of value
    std::vector<float> master(param.size(), -1.0f);
    const Graph g = optim::master_copy_graph(t);
    auto k = cpu.kernel(g);
    KernelCall call;
    for (const auto& in : k->signature().inputs)
      call.inputs.push_back(in.role == Role::Param ? static_cast<void*>(param.data())
                                                   : master.data());
    call.outputs.assign(1, master.data());
    call.n = int64_t(param.size());
    k->run(call);
    std::vector<float> want = optim::widen_to_f32(param.data(), t, call.n);
    for (size_t i = 0; i < param.size(); ++i)
      if (std::isnan(want[i]))
        ASSERT_TRUE(std::isnan(master[i])) << i;
      else
        ASSERT_EQ(master[i], want[i]) << i;
    gpu.precompile(g);  // PTX for it (throws if the CUDA backend refused it)
  }
}

TEST(DeviceTensors, StreamForACpuOptimizerIsAnError) {
  Engine cpu;
  auto opt = Optimizer::create(cpu, {{"type", "sgd"}, {"lr", 0.1}});
  std::vector<float> p(8, 1.0f), g(8, 1.0f);
  opt->add_param_group({ParamRef{{p.data(), 8}, {g.data(), 8}}});
  StepArgs args;
  args.cuda_stream = reinterpret_cast<void*>(0x1234);
  EXPECT_THAT(
      error_of([&] { opt->step(args); }),
      HasSubstr("step: a CUDA stream was given, but this optimizer's tensors are host memory"));
  EXPECT_EQ(p[0], 1.0f);
  EXPECT_EQ(opt->step_count(0, 0), 0);
  opt->step(StepArgs{});
  EXPECT_FLOAT_EQ(p[0], 0.9f);
}

TEST(DeviceTensors, CApiErrorsSayWhy) {
  optfuse_engine* e = nullptr;
  ASSERT_EQ(optfuse_engine_create("host", 1, &e), OPTFUSE_OK);
  optfuse_optimizer* o = nullptr;
  ASSERT_EQ(optfuse_optimizer_create(e, "{\"type\":\"adamw\"}", &o), OPTFUSE_OK);
  void* params[] = {fake_device(0)};
  void* grads[] = {fake_device(1)};
  int64_t numels[] = {64};
  EXPECT_EQ(optfuse_optimizer_add_group_device(o, 1, params, OPTFUSE_F32, grads, OPTFUSE_F32,
                                               numels, nullptr, nullptr, nullptr),
            OPTFUSE_ERR_INVALID);
  EXPECT_THAT(optfuse_last_error(),
              HasSubstr("param group 0, tensor 0: param is in CUDA device memory but the engine's "
                        "target"));
  std::vector<float> p(64, 1.0f), g(64, 0.5f);
  float* hp[] = {p.data()};
  float* hg[] = {g.data()};
  ASSERT_EQ(optfuse_optimizer_add_group(o, 1, hp, hg, numels, nullptr, nullptr, nullptr),
            OPTFUSE_OK);
  EXPECT_EQ(optfuse_optimizer_set_grad_device(o, 0, 0, fake_device(1), OPTFUSE_F32, 64),
            OPTFUSE_ERR_INVALID);
  EXPECT_THAT(optfuse_last_error(), HasSubstr("the new grad is in CUDA device memory"));
  optfuse_step_result r{};
  EXPECT_EQ(optfuse_optimizer_step_stream(o, reinterpret_cast<void*>(0x1234), &r),
            OPTFUSE_ERR_INVALID);
  EXPECT_THAT(optfuse_last_error(), HasSubstr("a CUDA stream was given"));
  EXPECT_EQ(p[0], 1.0f);  // the rejected step changed nothing
  EXPECT_EQ(optfuse_optimizer_step_stream(o, nullptr, &r), OPTFUSE_OK);
  EXPECT_EQ(r.outcome, OPTFUSE_STEP_APPLIED);
  EXPECT_NE(p[0], 1.0f);
  optfuse_optimizer_destroy(o);
  optfuse_engine_destroy(e);
}

TEST(DeviceTensors, CApiCudaEngineWithoutADeviceFailsAtCreation) {
  if (jit::cuda_device_problem().empty()) GTEST_SKIP() << "a CUDA device is present";
  optfuse_engine* e = reinterpret_cast<optfuse_engine*>(0x1);
  EXPECT_EQ(optfuse_engine_create("host-cuda", 0, &e), OPTFUSE_ERR_INVALID);
  EXPECT_EQ(e, nullptr);
  EXPECT_THAT(optfuse_last_error(), HasSubstr("no CUDA"));
  EXPECT_THAT(optfuse_last_error(), HasSubstr("can still be compiled and cached without a device"));
}

// ---- on a device (skips without one) -------------------------------------------------------

#define REQUIRE_DEVICE()                                                 \
  do {                                                                   \
    std::string problem = jit::cuda_device_problem();                    \
    if (!problem.empty()) GTEST_SKIP() << "no CUDA device: " << problem; \
  } while (0)

// A device allocation in device 0's primary context (the engine's default), test-owned.
class DeviceMem {
 public:
  explicit DeviceMem(size_t bytes) : bytes_(bytes) {
    const jit::CudaDriver& cu = jit::cuda_driver();
    jit::CudaContextScope scope(jit::cuda_primary_context(0));
    cu.check(cu.cuMemAlloc(&ptr_, bytes), "cuMemAlloc (test)");
  }
  template <typename T>
  explicit DeviceMem(const std::vector<T>& host) : DeviceMem(host.size() * sizeof(T)) {
    upload(host);
  }
  ~DeviceMem() {
    jit::CudaContextScope scope(jit::cuda_primary_context(0));
    jit::cuda_driver().cuMemFree(ptr_);
  }
  void* ptr() const { return reinterpret_cast<void*>(static_cast<uintptr_t>(ptr_)); }
  template <typename T>
  void upload(const std::vector<T>& host) {
    const jit::CudaDriver& cu = jit::cuda_driver();
    jit::CudaContextScope scope(jit::cuda_primary_context(0));
    cu.check(cu.cuCtxSynchronize(), "cuCtxSynchronize (test)");
    cu.check(cu.cuMemcpyHtoD(ptr_, host.data(), host.size() * sizeof(T)), "cuMemcpyHtoD (test)");
    cu.check(cu.cuCtxSynchronize(), "cuCtxSynchronize (test)");
  }
  template <typename T>
  std::vector<T> download() const {
    const jit::CudaDriver& cu = jit::cuda_driver();
    jit::CudaContextScope scope(jit::cuda_primary_context(0));
    cu.check(cu.cuCtxSynchronize(), "cuCtxSynchronize (test)");
    std::vector<T> host(bytes_ / sizeof(T));
    cu.check(cu.cuMemcpyDtoH(host.data(), ptr_, bytes_), "cuMemcpyDtoH (test)");
    return host;
  }

 private:
  size_t bytes_;
  unsigned long long ptr_ = 0;
};

// The same model twice: host copies for a CPU optimizer, device copies for a GPU one.
struct Twin {
  std::vector<int64_t> sizes;
  std::vector<std::vector<float>> host_params, host_grads;
  std::vector<std::unique_ptr<DeviceMem>> dev_params, dev_grads;

  explicit Twin(std::vector<int64_t> n) : sizes(std::move(n)) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::vector<float> p(static_cast<size_t>(sizes[i]));
      for (size_t j = 0; j < p.size(); ++j) p[j] = 0.5f + 0.25f * std::sin(float(j * (i + 2)));
      host_params.push_back(p);
      host_grads.emplace_back(p.size());
      dev_params.push_back(std::make_unique<DeviceMem>(p));
      dev_grads.push_back(std::make_unique<DeviceMem>(p.size() * sizeof(float)));
    }
  }
  // New gradients for step `k`, the same on both sides.
  void set_grads(int k) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      for (size_t j = 0; j < host_grads[i].size(); ++j)
        host_grads[i][j] = 0.1f * std::cos(float(j * (i + 1) + k)) + 0.01f * float(k);
      dev_grads[i]->upload(host_grads[i]);
    }
  }
  std::vector<ParamRef> host_refs(size_t begin, size_t end) {
    std::vector<ParamRef> refs;
    for (size_t i = begin; i < end; ++i)
      refs.push_back({{host_params[i].data(), sizes[i]},
                      {host_grads[i].data(), sizes[i]},
                      "t" + std::to_string(i)});
    return refs;
  }
  std::vector<ParamRef> device_refs(size_t begin, size_t end) {
    std::vector<ParamRef> refs;
    for (size_t i = begin; i < end; ++i)
      refs.push_back({{dev_params[i]->ptr(), sizes[i], {}, DType::F32, Memory::Cuda},
                      {dev_grads[i]->ptr(), sizes[i], {}, DType::F32, Memory::Cuda},
                      "t" + std::to_string(i)});
    return refs;
  }
};

// GPU vs CPU: the same f32 graph; NVPTX may contract a*b+c into fma where the CPU kernel does
// not, so a few ulp apart per step: 2e-5 relative (1e-5 per kernel in test_cuda_ptx, a few steps).
void expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu,
                  const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  for (size_t j = 0; j < cpu.size(); ++j)
    ASSERT_NEAR(gpu[j], cpu[j], 2e-5f * std::max(1.0f, std::fabs(cpu[j])))
        << what << " element " << j;
}

void* make_stream() {
  using Create = int (*)(void**, unsigned);
  auto create = reinterpret_cast<Create>(dlsym(RTLD_DEFAULT, "cuStreamCreate"));
  if (!create) return nullptr;
  jit::CudaContextScope scope(jit::cuda_primary_context(0));
  void* s = nullptr;
  jit::cuda_driver().check(create(&s, 1 /* CU_STREAM_NON_BLOCKING */), "cuStreamCreate (test)");
  return s;
}

struct Case {
  const char* label;
  Options config;
  Options overrides;
  std::vector<std::string> states;
};

TEST(DeviceOptimizer, MatchesTheCpuOptimizer) {
  REQUIRE_DEVICE();
  EngineOptions o;
  o.target = kGpuTarget;
  Engine gpu(o), cpu;
  void* stream = make_stream();
  const std::vector<Case> cases = {
      {"adamw",
       {{"type", "adamw"}, {"lr", 1e-2}, {"weight_decay", 0.1}},
       {},
       {"exp_avg", "exp_avg_sq"}},
      {"sgd nesterov",
       {{"type", "sgd"}, {"lr", 0.1}, {"momentum", 0.9}, {"nesterov", true}},
       {},
       {"momentum_buffer"}},
      {"adagrad",
       {{"type", "adagrad"}, {"lr", 0.1}, {"initial_accumulator_value", 0.25}},
       {},
       {"sum"}},
  };
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& c = cases[ci];
    {
      void* s = ci == 0 ? nullptr : stream;  // the first case on the default stream
      SCOPED_TRACE(std::string(c.label) + (s ? " on a stream" : " on the default stream"));
      Twin m({1000003, 4096, 17, 1});
      auto on_gpu = Optimizer::create(gpu, c.config), on_cpu = Optimizer::create(cpu, c.config);
      on_gpu->add_param_group(m.device_refs(0, 2), c.overrides);
      on_gpu->add_param_group(m.device_refs(2, 4), c.overrides);
      on_cpu->add_param_group(m.host_refs(0, 2), c.overrides);
      on_cpu->add_param_group(m.host_refs(2, 4), c.overrides);
      for (int k = 0; k < 4; ++k) {
        m.set_grads(k);
        StepArgs args;
        args.cuda_stream = s;
        EXPECT_TRUE(on_gpu->step(args).applied());
        on_cpu->step();
      }
      for (size_t i = 0; i < m.sizes.size(); ++i) {
        const size_t gi = i / 2, ti = i % 2;
        expect_close(m.dev_params[i]->download<float>(), m.host_params[i],
                     "param " + std::to_string(i));
        for (const auto& name : c.states) {
          TensorRef ref = on_gpu->state_ref(gi, ti, name);
          EXPECT_EQ(ref.memory, Memory::Cuda);
          EXPECT_NE(ref.data, nullptr);
          EXPECT_EQ(on_gpu->state(gi, ti, name), nullptr);  // not on the host
          expect_close(on_gpu->state_values(gi, ti, name), on_cpu->state_values(gi, ti, name),
                       name + " of tensor " + std::to_string(i));
        }
        EXPECT_EQ(on_gpu->step_count(gi, ti), 4);
      }
    }
  }
}

// f16 params with f32 master copies made on the device (the same grads in f32).
// 16-bit params (f32 master on the device) and bf16 state: the CPU's results. bf16 rounds in the
// same integer operations on both (src/lower/bf16.h), f16 in each target's conversion.
TEST(DeviceOptimizer, SixteenBitParamsAndBf16StateMatchTheCpu) {
  REQUIRE_DEVICE();
  EngineOptions o;
  o.target = kGpuTarget;
  Engine gpu(o), cpu;
  struct Case {
    DType param;
    const char* state_dtype;
  };
  for (const Case& c : {Case{DType::F16, "f32"}, Case{DType::BF16, "f32"},
                        Case{DType::BF16, "bf16"}, Case{DType::F32, "bf16"}}) {
    SCOPED_TRACE(std::string(dtype_name(c.param)) + " params, " + c.state_dtype + " state");
    const Options config = {
        {"type", "adamw"}, {"lr", 1e-2}, {"weight_decay", 0.1}, {"state_dtype", c.state_dtype}};
    const int64_t n = 100003;
    const size_t bytes = dtype_size(c.param);
    std::vector<uint16_t> host16(n);
    std::vector<float> host32(n), host_grad(n);
    for (int64_t j = 0; j < n; ++j) {
      host32[size_t(j)] = 0.5f + float(j % 1024) / 2048.0f;  // values in [0.5, 1)
      host16[size_t(j)] = c.param == DType::F16 ? uint16_t(0x3800 + j % 1024)
                                                : optim::to_bf16_bits(host32[size_t(j)]);
    }
    void* host_param = bytes == 2 ? static_cast<void*>(host16.data()) : host32.data();
    auto dev_param =
        bytes == 2 ? std::make_unique<DeviceMem>(host16) : std::make_unique<DeviceMem>(host32);
    DeviceMem dev_grad(host_grad);
    auto on_gpu = Optimizer::create(gpu, config), on_cpu = Optimizer::create(cpu, config);
    on_gpu->add_param_group({ParamRef{{dev_param->ptr(), n, {}, c.param, Memory::Cuda},
                                      {dev_grad.ptr(), n, {}, DType::F32, Memory::Cuda}}});
    on_cpu->add_param_group(
        {ParamRef{{host_param, n, {}, c.param}, {host_grad.data(), n, {}, DType::F32}}});
    for (int k = 0; k < 3; ++k) {
      for (int64_t j = 0; j < n; ++j) host_grad[size_t(j)] = 0.1f * std::cos(float(j + k));
      dev_grad.upload(host_grad);
      on_gpu->step();
      on_cpu->step();
    }
    for (const char* s : {"exp_avg", "exp_avg_sq"})
      expect_close(on_gpu->state_values(0, 0, s), on_cpu->state_values(0, 0, s), s);
    if (bytes == 4) continue;
    expect_close(on_gpu->state_values(0, 0, "master"), on_cpu->state_values(0, 0, "master"),
                 "master");
    // The 16-bit params: the same masters rounded, so equal or (a master a few ulp apart across
    // a rounding boundary) one 16-bit ulp apart (bf16: 2^-8 relative, f16: 2^-11).
    std::vector<float> got =
        optim::widen_to_f32(dev_param->download<uint16_t>().data(), c.param, n);
    std::vector<float> want = optim::widen_to_f32(host16.data(), c.param, n);
    const float ulp = c.param == DType::BF16 ? 1.0f / 128 : 1.0f / 512;
    for (int64_t j = 0; j < n; ++j)
      ASSERT_NEAR(got[size_t(j)], want[size_t(j)], std::fabs(want[size_t(j)]) * ulp) << j;
  }
}

// Gradient accumulation with its buffers on the device: two cycles of 3 micro-steps, and a state
// file written in the middle of a cycle holds the same buffer as the CPU's.
TEST(DeviceOptimizer, AccumulationMatchesTheCpu) {
  REQUIRE_DEVICE();
  EngineOptions o;
  o.target = kGpuTarget;
  Engine gpu(o), cpu;
  const Options config = {{"type", "adamw"}, {"lr", 1e-2}, {"accumulation_steps", 3}};
  const std::string file = testing::TempDir() + "optfuse_device_acc_" + std::to_string(getpid());
  Twin m({50001, 9});
  auto on_gpu = Optimizer::create(gpu, config), on_cpu = Optimizer::create(cpu, config);
  on_gpu->add_param_group(m.device_refs(0, 2));
  on_cpu->add_param_group(m.host_refs(0, 2));
  for (int k = 0; k < 7; ++k) {
    m.set_grads(k);
    StepResult a = on_gpu->step(), b = on_cpu->step();
    EXPECT_EQ(a.outcome, b.outcome) << k;
  }
  // 7 micro-steps: two updates, then one micro-step into the third cycle.
  EXPECT_EQ(on_gpu->step_count(0, 0), 2);
  on_gpu->save_state(file);
  auto from_file = Optimizer::create(cpu, config);
  from_file->add_param_group(m.host_refs(0, 2));
  from_file->load_state(file);
  for (size_t i = 0; i < m.sizes.size(); ++i) {
    expect_close(m.dev_params[i]->download<float>(), m.host_params[i],
                 "param " + std::to_string(i));
    expect_close(on_gpu->state_values(0, i, "exp_avg"), on_cpu->state_values(0, i, "exp_avg"),
                 "exp_avg " + std::to_string(i));
    EXPECT_EQ(on_gpu->state_values(0, i, "grad_accum"), on_cpu->state_values(0, i, "grad_accum"));
    EXPECT_EQ(*from_file->state(0, i, "grad_accum"), on_cpu->state_values(0, i, "grad_accum"));
  }
  std::remove(file.c_str());
}

// A host pointer labelled Memory::Cuda is refused before any kernel could fault on it.
TEST(DeviceOptimizer, HostPointersLabelledCudaAreRefused) {
  REQUIRE_DEVICE();
  EngineOptions o;
  o.target = kGpuTarget;
  Engine gpu(o);
  auto opt = Optimizer::create(gpu, {{"type", "sgd"}, {"lr", 0.1}});
  Twin m({64});
  std::vector<float> host(64);
  ParamRef bad = m.device_refs(0, 1)[0];
  bad.grad.data = host.data();
  EXPECT_THAT(error_of([&] { opt->add_param_group({bad}); }),
              HasSubstr("param group 0, tensor 0 ('t0'): grad pointer (Memory::Cuda) is not CUDA "
                        "memory"));
  EXPECT_EQ(opt->num_groups(), 0u);
  opt->add_param_group(m.device_refs(0, 1));
  EXPECT_THAT(error_of([&] {
                opt->set_grad(0, 0, {host.data(), 64, {}, DType::F32, Memory::Cuda});
              }),
              HasSubstr("grad pointer (Memory::Cuda) is not CUDA memory"));
}

TEST(DeviceOptimizer, SavedStateLoadsOnTheCpuAndBackOnTheDevice) {
  REQUIRE_DEVICE();
  EngineOptions o;
  o.target = kGpuTarget;
  Engine gpu(o), cpu;
  const Options config = {{"type", "adamw"}, {"lr", 1e-2}, {"amsgrad", true}};
  const std::string file = testing::TempDir() + "optfuse_device_" + std::to_string(getpid());
  Twin m({100003, 33});
  auto first = Optimizer::create(gpu, config);
  first->add_param_group(m.device_refs(0, 2));
  for (int k = 0; k < 3; ++k) {
    m.set_grads(k);
    first->step();
  }
  first->save_state(file);
  // On the CPU: the params as they are now, the state from the file; then both take 2 steps.
  for (size_t i = 0; i < m.sizes.size(); ++i) m.host_params[i] = m.dev_params[i]->download<float>();
  auto on_cpu = Optimizer::create(cpu, config);
  on_cpu->add_param_group(m.host_refs(0, 2));
  on_cpu->load_state(file);
  EXPECT_EQ(on_cpu->step_count(0, 0), 3);
  for (const char* name : {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"})
    EXPECT_EQ(*on_cpu->state(0, 0, name), first->state_values(0, 0, name)) << name;  // exact copies
  // Back on the device: a second GPU optimizer over the same tensors continues bit-identically.
  Twin copy({100003, 33});
  for (size_t i = 0; i < m.sizes.size(); ++i) copy.dev_params[i]->upload(m.host_params[i]);
  auto second = Optimizer::create(gpu, config);
  second->add_param_group(copy.device_refs(0, 2));
  second->load_state(file);
  for (int k = 3; k < 5; ++k) {
    m.set_grads(k);
    copy.set_grads(k);
    first->step();
    second->step();
    on_cpu->step();
  }
  for (size_t i = 0; i < m.sizes.size(); ++i) {
    EXPECT_EQ(copy.dev_params[i]->download<float>(), m.dev_params[i]->download<float>()) << i;
    expect_close(m.dev_params[i]->download<float>(), m.host_params[i],
                 "param " + std::to_string(i));
    EXPECT_EQ(second->state_values(0, i, "exp_avg"), first->state_values(0, i, "exp_avg"));
  }
  std::remove(file.c_str());
}

TEST(DeviceOptimizer, CApiStepsDeviceTensors) {
  REQUIRE_DEVICE();
  optfuse_engine* e = nullptr;
  ASSERT_EQ(optfuse_engine_create(kGpuTarget.c_str(), 0, &e), OPTFUSE_OK) << optfuse_last_error();
  optfuse_optimizer* o = nullptr;
  ASSERT_EQ(optfuse_optimizer_create(e, "{\"type\":\"sgd\",\"lr\":0.1,\"momentum\":0.9}", &o),
            OPTFUSE_OK);
  Twin m({4099});
  m.set_grads(1);
  void* params[] = {m.dev_params[0]->ptr()};
  void* grads[] = {m.dev_grads[0]->ptr()};
  int64_t numels[] = {m.sizes[0]};
  ASSERT_EQ(optfuse_optimizer_add_group_device(o, 1, params, OPTFUSE_F32, grads, OPTFUSE_F32,
                                               numels, nullptr, nullptr, nullptr),
            OPTFUSE_OK)
      << optfuse_last_error();
  optfuse_step_result r{};
  for (int k = 0; k < 2; ++k)
    ASSERT_EQ(optfuse_optimizer_step_stream(o, nullptr, &r), OPTFUSE_OK) << optfuse_last_error();
  // torch's SGD with momentum, two steps with the same gradient: buf = g, then 1.9 g.
  std::vector<float> got = m.dev_params[0]->download<float>();
  for (size_t j = 0; j < got.size(); ++j) {
    float g = m.host_grads[0][j], want = m.host_params[0][j] - 0.1f * g - 0.1f * (0.9f * g + g);
    ASSERT_NEAR(got[j], want, 1e-6f) << j;
  }
  optfuse_optimizer_destroy(o);
  optfuse_engine_destroy(e);
}

}  // namespace
}  // namespace optfuse
