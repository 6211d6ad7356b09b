#pragma once
// Param groups built by hand for the Optimizer error tests: small owned tensors and optimizers
// on the shared engine (support/engine.h).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "optfuse/optim.h"
#include "support/engine.h"

namespace optfuse::testing {

// A small owned float32 tensor: its param (0.5) and grad (0.25) buffers.
struct Buf {
  std::vector<float> p, g;
  explicit Buf(size_t n) : p(n, 0.5f), g(n, 0.25f) {}
  ParamRef ref(const std::string& name = "") {
    return {{p.data(), int64_t(p.size()), {}}, {g.data(), int64_t(g.size()), {}}, name};
  }
};

inline std::unique_ptr<Optimizer> make_optimizer(const Options& config) {
  return Optimizer::create(shared_engine(), config);
}

// An optimizer of `type` with one valid group (so the next group is "param group 1").
inline std::unique_ptr<Optimizer> with_one_group(const std::string& type, Buf* b) {
  auto opt = make_optimizer({{"type", type}});
  opt->add_param_group({b->ref("first")});
  return opt;
}

}  // namespace optfuse::testing
