// Parallel loops on a process's OpenMP runtime (include/optfuse/parallel.h): every kernel task
// and every small-tensor round runs there once set, and the results are the bits of optfuse's
// own threads. Bits must agree: the same kernels run the same tasks over the same element
// ranges; only which thread runs a task differs, and no task's arithmetic depends on that.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <cstring>
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

TEST(OpenMpRuntime, KernelsAndSmallTensorRoundsRunThereWithTheSameBits) {
  // One tensor of many tasks, and enough small ones for a worker round.
  std::vector<int64_t> sizes = {1 << 20};
  for (int i = 0; i < 64; ++i) sizes.push_back(1000 + i);
  EngineOptions eo;
  eo.num_threads = 2;
  Engine engine(eo);
  Model own(sizes), omp(sizes);
  own.train(engine, 3);
  ASSERT_EQ(openmp_runtime().parallel, nullptr);

  use_openmp_runtime({&counting_parallel, &omp_get_thread_num, &omp_get_num_threads});
  omp.train(engine, 3);
  use_openmp_runtime({});
  EXPECT_GE(regions.load(), 6);  // per step: the large tensor's tasks and the small round
  EXPECT_EQ(openmp_runtime().parallel, nullptr);
  for (size_t k = 0; k < sizes.size(); ++k)
    ASSERT_EQ(std::memcmp(own.p[k].data(), omp.p[k].data(), own.p[k].size() * sizeof(float)), 0)
        << "tensor " << k;
}

}  // namespace
}  // namespace optfuse
