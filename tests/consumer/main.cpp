// A C++ program built against the installed optfuse (find_package and pkg-config): one AdamW step.
#include <cstdio>
#include <optfuse/optfuse.hpp>
#include <vector>

int main() {
  optfuse::EngineOptions eo;  // memory-only cache: the test leaves nothing behind
  optfuse::Engine engine(eo);
  auto opt = optfuse::Optimizer::create(engine, {{"type", "adamw"}, {"lr", 1e-2}});
  std::vector<float> w(1000, 1.0f), g(1000, 0.5f);
  opt->add_param_group({{{w.data(), 1000}, {g.data(), 1000}}});
  opt->step();
  if (!(w[0] < 1.0f)) {
    std::fprintf(stderr, "consumer_cpp: the param did not move (%g)\n", w[0]);
    return 1;
  }
  std::printf("consumer_cpp: ok, w[0] = %.6f after one step\n", w[0]);
  return 0;
}
