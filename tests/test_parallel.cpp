// Parallel loops on a process's OpenMP runtime (include/optfuse/parallel.h): every kernel's
// parallel tasks and every step's round of slices run there once set, and the results are the
// bits of optfuse's own threads. Bits must agree: the same kernels run the same tasks over the
// same element ranges; only which thread runs a task differs, and no task's arithmetic depends
// on that. Also: a serial call (KernelCall::serial, the step's slices) gives a parallel call's
// bits.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "optfuse/optfuse.hpp"

extern "C" void GOMP_parallel(void (*fn)(void*), void* data, unsigned threads, unsigned flags);

namespace optfuse {
namespace {

std::atomic<int> regions{0};

void counting_parallel(void (*fn)(void*), void* data, unsigned threads, unsigned flags) {
  ++regions;
  GOMP_parallel(fn, data, threads, flags);
}

struct Model {
  std::vector<std::vector<float>> p, g;
  explicit Model(const std::vector<int64_t>& sizes) {
    for (size_t k = 0; k < sizes.size(); ++k) {
      std::vector<float> x(static_cast<size_t>(sizes[k])), y(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        x[i] = 0.01f * static_cast<float>((i * 7 + k) % 101) - 0.5f;
        y[i] = 0.02f * static_cast<float>((i * 13 + k) % 37) - 0.3f;
      }
      p.push_back(std::move(x));
      g.push_back(std::move(y));
    }
  }
  void train(Engine& e, int steps) {
    auto opt = Optimizer::create(e, {{"type", "adamw"}, {"lr", 1e-2}});
    std::vector<ParamRef> refs;
    for (size_t k = 0; k < p.size(); ++k)
      refs.push_back({{p[k].data(), static_cast<int64_t>(p[k].size())},
                      {g[k].data(), static_cast<int64_t>(g[k].size())}});
    opt->add_param_group(refs);
    for (int s = 0; s < steps; ++s) opt->step();
  }
};

TEST(OpenMpRuntime, KernelsAndStepRoundsRunThereWithTheSameBits) {
  // One tensor of many slices, and many small ones: one round per step.
  std::vector<int64_t> sizes = {1 << 20};
  for (int i = 0; i < 64; ++i) sizes.push_back(1000 + i);
  EngineOptions eo;
  eo.num_threads = 2;
  Engine engine(eo);
  Model own(sizes), omp(sizes);
  own.train(engine, 3);
  ASSERT_EQ(openmp_runtime().parallel, nullptr);

  // A kernel call of many tasks, outside a step (its parallel loop is Halide's do_par_for).
  auto kernel = engine.kernel(update_graph({{"type", "sgd"}, {"lr", 0.1}}));
  std::vector<float> kp(1 << 20, 1.0f), kg(kp.size(), 0.5f), kp_omp = kp;
  KernelCall call;
  call.inputs = {kg.data(), kp.data()};
  if (kernel->signature().inputs[0].role != Role::Grad) std::swap(call.inputs[0], call.inputs[1]);
  call.scalars.assign(kernel->signature().scalars.size(), 0.1);
  call.n = static_cast<int64_t>(kp.size());
  call.outputs = {kp.data()};
  kernel->run(call);

  use_openmp_runtime({&counting_parallel, &omp_get_thread_num, &omp_get_num_threads});
  omp.train(engine, 3);
  EXPECT_GE(regions.load(), 3);  // one round per step
  const int after_steps = regions.load();
  call.inputs[kernel->signature().inputs[0].role == Role::Grad ? 1 : 0] = kp_omp.data();
  call.outputs = {kp_omp.data()};
  kernel->run(call);
  use_openmp_runtime({});
  EXPECT_GT(regions.load(), after_steps);  // the kernel's tasks
  EXPECT_EQ(openmp_runtime().parallel, nullptr);
  ASSERT_EQ(std::memcmp(kp.data(), kp_omp.data(), kp.size() * sizeof(float)), 0);
  for (size_t k = 0; k < sizes.size(); ++k)
    ASSERT_EQ(std::memcmp(own.p[k].data(), omp.p[k].data(), own.p[k].size() * sizeof(float)), 0)
        << "tensor " << k;
}

// A serial call runs the whole range as one task in the kernel's streaming loop, a parallel one
// splits it into tasks of the vector loop: the same vector arithmetic per element, so the bits
// must agree. AdamW over sizes with a ragged last vector, serial calls on slices as step() cuts.
TEST(SerialCall, GivesTheParallelCallsBits) {
  EngineOptions eo;
  eo.num_threads = 2;
  eo.memory_only = true;
  Engine engine(eo);
  auto kernel = engine.kernel(update_graph({{"type", "adamw"}}));
  const KernelSignature& sig = kernel->signature();
  for (int64_t n : {int64_t(100000), int64_t(1) << 18}) {
    std::vector<std::vector<float>> a(sig.inputs.size()), b;
    for (size_t i = 0; i < a.size(); ++i) {
      a[i].resize(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j)
        a[i][static_cast<size_t>(j)] = 0.001f * static_cast<float>((j * (7 + i)) % 997) + 0.01f;
    }
    b = a;
    auto call_over = [&](std::vector<std::vector<float>>& t, int64_t begin, int64_t count) {
      KernelCall c;
      for (auto& v : t) c.inputs.push_back(v.data() + begin);
      for (const auto& out : sig.outputs)
        c.outputs.push_back(t[static_cast<size_t>(sig.input_index(out.replaces))].data() + begin);
      c.scalars.assign(sig.scalars.size(), 0.5);
      c.n = count;
      return c;
    };
    kernel->run(call_over(a, 0, n));
    const int64_t slice = 40000;  // a multiple of every vector width, not of a task
    for (int64_t begin = 0; begin < n; begin += slice) {
      KernelCall c = call_over(b, begin, std::min(slice, n - begin));
      c.serial = true;
      kernel->run(c);
    }
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_EQ(std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)), 0)
          << "n " << n << ", input " << sig.inputs[i].name;
  }
}

}  // namespace
}  // namespace optfuse
