// Engine and JIT: kernel reuse and keys, runtime scalars, errors, object store seam, threads.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "engine/kernel_impl.h"
#include "engine/runtime_object.h"
#include "jit/embedded_runtime.h"
#include "jit/halide_bridge.h"
#include "jit/jit.h"
#include "optfuse/engine.h"
#include "optfuse/error.h"
#include "optfuse/optfuse.hpp"
#include "support/cache_util.h"
#include "support/engine.h"
#include "support/gen.h"
#include "support/run_kernel.h"

namespace optfuse {
namespace {

using testing::Aliasing;
using testing::expect_close;
using testing::gen;
using ::testing::HasSubstr;
using testing::run_kernel;
using testing::Scalars;
using testing::Tensors;

Engine& engine() { return testing::shared_engine(); }

// p' = p - lr * g: built with operands in the order given.
Graph sgd(const std::string& name, bool swapped = false) {
  Graph g(name);
  Value p = g.param("p"), grad = g.grad("g"), lr = g.scalar("lr");
  g.output("p", p - (swapped ? grad * lr : lr * grad));
  return g;
}

Tensors data(const std::vector<std::string>& names, size_t n) {
  Tensors t;
  uint32_t seed = 1;
  for (const auto& name : names) {
    std::vector<double>& v = t[name];
    for (size_t i = 0; i < n; ++i) v.push_back(gen(seed, i));
    ++seed;
  }
  return t;
}

TEST(Engine, SameStructureIsOneCompile) {
  Engine e(testing::memory_only());  // counts compilations
  auto k1 = e.kernel(sgd("a"));
  auto k2 = e.kernel(sgd("b", /*swapped=*/true));  // other name, commutative operands swapped
  EXPECT_EQ(k1, k2);
  EngineCounters c = e.counters();
  EXPECT_EQ(c.compiles, 1);
  EXPECT_EQ(c.lookups, 2);
  EXPECT_EQ(c.hits, 1);
  EXPECT_GT(c.compile_seconds, 0);

  Graph other("other");
  Value p = other.param("p"), grad = other.grad("g"), lr = other.scalar("lr");
  other.output("p", p + lr * grad);
  auto k3 = e.kernel(other);
  EXPECT_NE(k3->key(), k1->key());
  EXPECT_EQ(e.counters().compiles, 2);
  EXPECT_EQ(e.kernels().size(), 2u);
}

TEST(Engine, KeyWithoutCompiling) {
  Engine e;
  std::string key = e.kernel_key(sgd("a"));
  EXPECT_EQ(key.size(), 32u);
  EXPECT_EQ(e.counters().compiles, 0);
  EXPECT_EQ(e.counters().lookups, 0);
  Schedule s;
  s.vector_width = 8;
  EXPECT_NE(e.kernel_key(sgd("a"), s), key);
  EXPECT_EQ(e.kernel(sgd("a"))->key(), key);
}

TEST(Engine, ScalarChangeNeedsNoRecompile) {
  Engine& e = engine();
  auto k = e.kernel(sgd("sgd"));
  int64_t compiles = e.counters().compiles;
  Tensors in = data({"p", "g"}, 100);
  Tensors out1 = run_kernel(*k, in, {{"lr", 0.5}});
  Tensors out2 = run_kernel(*k, in, {{"lr", 0.25}});
  EXPECT_EQ(e.counters().compiles, compiles);
  for (size_t i = 0; i < 100; ++i) {
    EXPECT_EQ(out1["p"][i], float(in["p"][i] - 0.5 * in["g"][i]));
    EXPECT_EQ(out2["p"][i], float(in["p"][i] - 0.25 * in["g"][i]));
  }
}

TEST(Engine, SignatureIsCanonicalOrder) {
  Graph g("adamish");
  Value v = g.state("v"), m = g.state("m"), grad = g.grad("g"), p = g.param("p");
  Value lr = g.scalar("lr"), b = g.scalar("beta");
  g.output("v", v + grad * grad);
  g.output("p", p - lr * m);
  g.output("m", b * m + grad);
  auto k = engine().kernel(g);
  const KernelSignature& sig = k->signature();
  ASSERT_EQ(sig.inputs.size(), 4u);
  EXPECT_EQ(sig.inputs[0].name, "p");  // roles param, grad, state; then names
  EXPECT_EQ(sig.inputs[1].name, "g");
  EXPECT_EQ(sig.inputs[2].name, "m");
  EXPECT_EQ(sig.inputs[3].name, "v");
  ASSERT_EQ(sig.scalars.size(), 2u);
  EXPECT_EQ(sig.scalars[0].name, "beta");
  EXPECT_EQ(sig.scalars[1].name, "lr");
  ASSERT_EQ(sig.outputs.size(), 3u);
  EXPECT_EQ(sig.outputs[0].replaces, "m");
  EXPECT_EQ(sig.outputs[1].replaces, "p");
  EXPECT_EQ(sig.outputs[2].replaces, "v");
  EXPECT_EQ(sig.input_index("m"), 2);
  EXPECT_EQ(sig.scalar_index("lr"), 1);
  EXPECT_EQ(sig.input_index("nope"), -1);
  Tensors in = data({"p", "g", "m", "v"}, 1000);
  Scalars sc{{"lr", 0.1}, {"beta", 0.9}};
  expect_close(run_kernel(*k, in, sc), interpret(g, in, sc), 1e-6);
}

TEST(Engine, BadTargetNamesTheString) {
  EngineOptions o;
  o.target = "not-a-target";
  try {
    Engine e(o);
    FAIL() << "no error";
  } catch (const Error& err) {
    EXPECT_THAT(err.what(), HasSubstr("\"not-a-target\""));
  }
}

TEST(Engine, ExplicitTargetString) {
  EngineOptions o;
  o.target = "x86-64-linux-avx2";
  Engine e(o);
  EXPECT_EQ(e.target_string(), "x86-64-linux-avx2");
  EXPECT_EQ(Engine().target_string().rfind("x86-64-linux", 0), 0u);
}

// $OPTFUSE_HOST_TARGET replaces "host", also leading ("host-cuda"), so a suite runs as another
// machine would; the previous value is restored, as the whole suite may run under one.
TEST(Engine, HostTargetFromTheEnvironment) {
  const char* was = std::getenv("OPTFUSE_HOST_TARGET");
  const std::string saved = was ? was : "";
  ::setenv("OPTFUSE_HOST_TARGET", "x86-64-linux-avx-avx2-f16c-fma-sse41", 1);
  EXPECT_EQ(Engine().target_string(), "x86-64-linux-avx-avx2-f16c-fma-sse41");
  EngineOptions o;
  o.target = "host-cuda";
  o.compile_only = true;
  EXPECT_EQ(Engine(o).target_string(), "x86-64-linux-avx-avx2-cuda-f16c-fma-sse41");
  o.target = "x86-64-linux-sse41";  // only "host" is replaced
  EXPECT_EQ(Engine(o).target_string(), "x86-64-linux-sse41");
  ::setenv("OPTFUSE_HOST_TARGET", "not-a-target", 1);
  EXPECT_THAT([] { Engine e; },
              ::testing::ThrowsMessage<Error>(HasSubstr("OPTFUSE_HOST_TARGET=\"not-a-target\"")));
  if (was)
    ::setenv("OPTFUSE_HOST_TARGET", saved.c_str(), 1);
  else
    ::unsetenv("OPTFUSE_HOST_TARGET");
}

// The runtime built into the library serves every x86-64 Linux CPU target, so a cold engine
// compiles its kernel and no runtime; a target with a feature that changes the runtime (debug)
// gets one compiled, once per process.
TEST(Engine, EmbeddedRuntimeServesCpuTargets) {
#if defined(__x86_64__)
  EXPECT_NE(jit::embedded_runtime("x86-64-linux-avx-avx2-f16c-fma-sse41"), nullptr);
  EXPECT_NE(
      jit::embedded_runtime(
          "x86-64-linux-avx-avx2-avx512-avx512_skylake-f16c-fma-no_runtime-sse41-user_context"),
      nullptr);
  for (const char* other :
       {"x86-64-linux-avx2-debug", "x86-64-linux-avx2-cuda", "arm-64-linux", "x86-64-osx-avx2"})
    EXPECT_EQ(jit::embedded_runtime(other), nullptr) << other;
  EXPECT_EQ(jit::Jit::object_problem(*jit::embedded_runtime("x86-64-linux-sse41")), "");

  Engine e(testing::memory_only());
  auto k = e.kernel(sgd("cold"));
  Tensors in = data({"p", "g"}, 100);
  Tensors out = run_kernel(*k, in, {{"lr", 0.5}});
  for (size_t i = 0; i < 100; ++i) EXPECT_EQ(out["p"][i], float(in["p"][i] - 0.5 * in["g"][i]));
  EXPECT_EQ(e.counters().compiles, 1);
  EXPECT_EQ(e.counters().runtime_compiles, 0);

  bool compiled = false;
  auto debug = engine_detail::runtime_object("x86-64-linux-sse41-debug", &compiled);
  EXPECT_TRUE(compiled);
  EXPECT_EQ(jit::Jit::object_problem(*debug), "");
  EXPECT_EQ(engine_detail::runtime_object("x86-64-linux-sse41-debug", &compiled), debug);
  EXPECT_FALSE(compiled);
  // Started ahead (compile_runtime_soon): only where a compile is still to come is the store
  // asked; the compile started is the one runtime_object() then returns.
  auto unasked = [] {
    ADD_FAILURE() << "the store was asked";
    return false;
  };
  engine_detail::compile_runtime_soon("x86-64-linux-avx2", unasked);         // built in
  engine_detail::compile_runtime_soon("x86-64-linux-sse41-debug", unasked);  // compiled
  bool asked = false;
  engine_detail::compile_runtime_soon("x86-64-linux-avx2-debug", [&] {
    asked = true;
    return false;
  });
  EXPECT_TRUE(asked);
  EXPECT_EQ(jit::Jit::object_problem(
                *engine_detail::runtime_object("x86-64-linux-avx2-debug", &compiled)),
            "");
  EXPECT_TRUE(compiled);
#else
  GTEST_SKIP() << "the embedded runtime is built for x86-64";
#endif
}

// OPTFUSE_PERF_JITDUMP=1: LLVM's perf listener writes a jitdump (under $JITDUMPDIR) naming the
// kernels it loads, and the kernels run as without it.
TEST(Engine, PerfJitdumpNamesTheKernels) {
  testing::TempDir dir;
  ::setenv("JITDUMPDIR", dir.path().c_str(), 1);
  ::setenv("OPTFUSE_PERF_JITDUMP", "1", 1);
  {
    Engine e(testing::memory_only());
    auto k = e.kernel(sgd("dumped"));
    Tensors in = data({"p", "g"}, 100);
    Tensors out = run_kernel(*k, in, {{"lr", 0.5}});
    for (size_t i = 0; i < 100; ++i) EXPECT_EQ(out["p"][i], float(in["p"][i] - 0.5 * in["g"][i]));
  }
  ::unsetenv("OPTFUSE_PERF_JITDUMP");
  ::unsetenv("JITDUMPDIR");
  const std::string name = "jit-" + std::to_string(::getpid()) + ".dump";
  bool found = false;
  for (const auto& f : std::filesystem::recursive_directory_iterator(dir.path()))
    found = found || f.path().filename() == name;
  EXPECT_TRUE(found) << "no " << name << " under " << dir.path();
}

TEST(Engine, NonCudaGpuTargetIsAClearError) {
  EngineOptions o;
  o.target = "host-opencl";  // CUDA targets: test_cuda_ptx.cpp
  Engine e(o);
  EXPECT_THAT([&] { e.kernel(sgd("a")); },
              ::testing::ThrowsMessage<Error>(HasSubstr("only the CUDA GPU backend")));
}

TEST(Kernel, CallSizeMismatchNamesKernel) {
  Engine e;  // a kernel takes the name of the first graph that compiled it
  auto k = e.kernel(sgd("my_sgd"));
  std::vector<float> p(4), g(4);
  KernelCall call{{p.data(), g.data()}, {0.1}, {p.data()}, 4};
  k->run(call);
  KernelCall few_inputs = call;
  few_inputs.inputs.pop_back();
  EXPECT_THAT([&] { k->run(few_inputs); },
              ::testing::ThrowsMessage<Error>(AllOf(HasSubstr("my_sgd"), HasSubstr("1 inputs"))));
  KernelCall no_scalars = call;
  no_scalars.scalars.clear();
  EXPECT_THAT([&] { k->run(no_scalars); }, ::testing::ThrowsMessage<Error>(HasSubstr("scalars")));
  KernelCall two_outputs = call;
  two_outputs.outputs.push_back(g.data());
  EXPECT_THAT([&] { k->run(two_outputs); }, ::testing::ThrowsMessage<Error>(HasSubstr("outputs")));
  KernelCall negative = call;
  negative.n = -1;
  EXPECT_THROW(k->run(negative), Error);
  KernelCall null_input = call;
  null_input.inputs[1] = nullptr;
  EXPECT_THAT([&] { k->run(null_input); }, ::testing::ThrowsMessage<Error>(HasSubstr("\"g\"")));
}

// CPU kernels take any float-aligned pointer: tensors are often views at odd offsets into a
// larger allocation. Every misalignment of a 64-byte line must give the interpreter's result.
TEST(Kernel, MisalignedViewsAreCorrect) {
  auto k = engine().kernel(sgd("sgd"));
  const size_t n = 1003;
  Tensors in = data({"p", "g"}, n);
  Tensors want = interpret(sgd("sgd"), in, {{"lr", 0.5}});
  for (size_t shift = 0; shift < 16; ++shift) {
    std::vector<float> p(n + 16), g(n + 16);
    for (size_t i = 0; i < n; ++i) {
      p[shift + i] = float(in["p"][i]);
      g[(15 - shift) + i] = float(in["g"][i]);
    }
    KernelCall call;
    call.n = static_cast<int64_t>(n);
    call.inputs = {p.data() + shift, g.data() + (15 - shift)};
    call.scalars = {0.5};
    call.outputs = {p.data() + shift};
    k->run(call);
    Tensors got;
    for (size_t i = 0; i < n; ++i) got["p"].push_back(p[shift + i]);
    expect_close(got, want, 1e-7);
    EXPECT_EQ(p[shift + n], 0.0f) << "wrote past the end at shift " << shift;
    if (shift > 0) EXPECT_EQ(p[shift - 1], 0.0f) << "wrote before the start at shift " << shift;
  }
}

TEST(Kernel, ZeroElementsIsANoOp) {
  auto k = engine().kernel(sgd("sgd"));
  KernelCall call{{nullptr, nullptr}, {0.1}, {nullptr}, 0};
  EXPECT_NO_THROW(k->run(call));
}

// CPU kernels carry no Halide assertions (jit/halide_bridge.cpp, kernel_target): every buffer a
// kernel sees is built by KernelImpl::run_slice from the kernel's own signature, so the checks
// re-verified what is true by construction. An object compiled with them references Halide's
// error functions (halide_error_bad_type, halide_error_access_out_of_bounds, ...); CUDA kernels
// keep them (test_cuda_ptx.cpp), where they also carry the device calls' error codes out.
TEST(Kernel, CpuKernelsCarryNoHalideAssertions) {
  const std::string host = jit::resolve_target("host");
  for (const char* type : {"sgd", "adamw"}) {
    const std::vector<char> obj =
        jit::compile_kernel_object(canonicalize(update_graph({{"type", type}})),
                                   jit::resolve_schedule(Schedule{}, host), host, "k");
    const std::string text(obj.begin(), obj.end());
    EXPECT_EQ(text.find("halide_error_"), std::string::npos) << type;
    EXPECT_NE(text.find("halide_do_par_for"), std::string::npos) << type;  // (a real object)
  }
}

TEST(Kernel, OutlivesItsEngine) {
  std::shared_ptr<const Kernel> k;
  {
    Engine e;
    k = e.kernel(sgd("sgd"));
  }
  Tensors in = data({"p", "g"}, 5000);
  expect_close(run_kernel(*k, in, {{"lr", 0.5}}), interpret(sgd("sgd"), in, {{"lr", 0.5}}), 1e-7);
}

class MemoryStore : public ObjectStore {
 public:
  bool get(const std::string& key, std::vector<char>* object) override {
    ++gets;
    auto it = objects.find(key);
    if (it == objects.end()) return false;
    *object = it->second;
    return true;
  }
  void put(const std::string& key, const std::vector<char>& object) override {
    objects[key] = object;
  }
  std::map<std::string, std::vector<char>> objects;
  int gets = 0;
};

TEST(Engine, ObjectStoreServesASecondEngine) {
  auto store = std::make_shared<MemoryStore>();
  Engine first;
  first.set_object_store(store);
  first.kernel(sgd("sgd"));
  EXPECT_EQ(first.counters().compiles, 1);
  EXPECT_GE(store->objects.size(), 1u);  // the kernel (and the runtime unless compiled earlier)

  Engine second;
  second.set_object_store(store);
  auto k = second.kernel(sgd("sgd"));
  EXPECT_EQ(second.counters().compiles, 0);
  Tensors in = data({"p", "g"}, 777);
  expect_close(run_kernel(*k, in, {{"lr", 2.0}}), interpret(sgd("sgd"), in, {{"lr", 2.0}}), 1e-7);
}

TEST(Engine, ConcurrentRequestsCompileOnce) {
  Engine e(testing::memory_only());  // counts compilations
  std::vector<std::thread> threads;
  std::vector<std::shared_ptr<const Kernel>> got(4);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] { got[t] = e.kernel(sgd("sgd" + std::to_string(t))); });
  for (auto& th : threads) th.join();
  EXPECT_EQ(e.counters().compiles, 1);
  EXPECT_EQ(e.counters().lookups, 4);
  for (auto& k : got) EXPECT_EQ(k, got[0]);
}

TEST(Kernel, ConcurrentCallsAgreeWithSerial) {
  auto k = engine().kernel(sgd("sgd"));
  Tensors in = data({"p", "g"}, 100000);
  Tensors want = interpret(sgd("sgd"), in, {{"lr", 0.5}});
  std::vector<std::thread> threads;
  std::vector<Tensors> got(4);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] { got[t] = run_kernel(*k, in, {{"lr", 0.5}}); });
  for (auto& th : threads) th.join();
  for (auto& g : got) expect_close(g, want, 1e-7);
}

TEST(Kernel, ChunksAreFewAndWholeVectors) {
  auto k = std::dynamic_pointer_cast<const engine_detail::KernelImpl>(engine().kernel(sgd("sgd")));
  int64_t vw = k->schedule().vector_width, threads = engine().num_threads();
  EXPECT_EQ(k->chunk_for(10) % vw, 0);
  EXPECT_GE(k->chunk_for(10), k->schedule().min_task);  // small calls: one task
  int64_t n = int64_t(1) << 24;
  int64_t chunk = k->chunk_for(n);
  EXPECT_EQ(chunk % vw, 0);
  EXPECT_EQ((n + chunk - 1) / chunk, threads * k->schedule().tasks_per_thread);
}

}  // namespace
}  // namespace optfuse
