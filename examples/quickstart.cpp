// The README's C++ start as a complete program: AdamW over two parameter groups, a learning-rate
// schedule, a checkpoint. Run it twice: the second process loads its kernels from the disk cache
// instead of compiling them (CTest `example_quickstart_warm` checks that).
#include <chrono>
#include <cstdio>
#include <vector>

#include "optfuse/optfuse.hpp"

int main() {
  auto t0 = std::chrono::steady_clock::now();
  optfuse::Engine engine;  // target "host", all cores, kernels cached in ~/.cache/optfuse
  auto opt = optfuse::Optimizer::create(engine, {{"type", "adamw"}, {"lr", 1e-3}});

  // A weight matrix and a bias: float32 params and grads, owned by the caller.
  std::vector<float> w(1 << 20, 0.01f), gw(w.size(), 0.1f), b(1024, 0.0f), gb(b.size(), -0.2f);
  std::vector<optfuse::ParamRef> matrices = {
      {{w.data(), int64_t(w.size()), {1024, 1024}}, {gw.data(), int64_t(gw.size())}, "w"}};
  std::vector<optfuse::ParamRef> biases = {
      {{b.data(), int64_t(b.size())}, {gb.data(), int64_t(gb.size())}, "b"}};
  opt->add_param_group(matrices, {{"weight_decay", 0.1}});
  opt->add_param_group(biases, {{"weight_decay", 0.0}});

  for (int step = 0; step < 10; ++step) {
    // ... the backward pass fills gw and gb ...
    for (size_t g = 0; g < opt->num_groups(); ++g)
      opt->set(g, "lr", 1e-3 * (1.0 - step / 10.0));  // a schedule: no recompilation
    opt->step();                                      // one fused kernel pass per tensor
    if (step == 0) {
      double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      optfuse::EngineCounters c = engine.counters();
      std::printf(
          "first step done %.1f ms after start: %lld kernels compiled, %lld objects from "
          "the disk cache %s\n",
          ms, static_cast<long long>(c.compiles), static_cast<long long>(c.disk_hits),
          engine.options().cache_dir.c_str());
    }
  }
  opt->save_state("quickstart.optfuse");  // resume bit-identically with load_state
  std::printf("w[0] = %.6f, b[0] = %.6f after 10 steps\n", w[0], b[0]);
  return 0;
}
