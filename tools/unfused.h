#pragma once
// The unfused baseline: an update as an eager framework runs it, one pass over memory per op
// (`optfuse demo` and bench_update compare the fused step with it).
// Each op is its own single-op graph compiled by the SAME engine as the fused kernels (same
// schedule, same thread pool, same vector width), so the only difference measured is fusion:
// the number of passes over memory, not threading or code generation. Calls are bound once,
// outside the timed loop, and temporaries are preallocated: no dispatch or allocation cost is
// charged to the baseline (torch pays both), so this baseline is a favourable one.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "optfuse/engine.h"

namespace optfuse::tools {

// A call of `k` on the arrays named by its inputs (`tensors`) and the values named by its scalars;
// each output overwrites the input it replaces unless `out` names another array for it.
KernelCall bind_call(const Kernel& k, const std::map<std::string, float*>& tensors,
                     const std::map<std::string, double>& scalars, int64_t n,
                     const std::map<std::string, float*>& out = {});

class Unfused {
 public:
  // torch's single-tensor AdamW (foreach=False), 8 kernels:
  //   p.mul_(decay); m.lerp_(g, 1-b1); v.mul_(b2); v.addcmul_(g, g, 1-b2);
  //   t = v.sqrt(); t.div_(bias_correction2_sqrt); t.add_(eps); p.addcdiv_(m, t, -step_size)
  // `scalars` are AdamW's host values by the names src/optim/adam.cpp uses; `t` is the temporary.
  static Unfused adamw(Engine& e, float* p, float* g, float* m, float* v, float* t, int64_t n,
                       const std::map<std::string, double>& scalars);

  // torch's SGD with momentum (weight_decay 0), 3 kernels:
  //   b.mul_(momentum); b.add_(g, alpha=1-dampening); p.add_(b, alpha=-lr)
  static Unfused sgd_momentum(Engine& e, float* p, float* g, float* b, int64_t n, double lr,
                              double momentum, double dampening);

  void run() const;
  size_t passes() const { return calls_.size(); }
  // Bytes the passes read plus write per element (e.g. 80 for AdamW against fused 28).
  int64_t traffic_per_element() const { return traffic_; }
  std::string label() const;  // "unfused 8 kernels: mul lerp ..."

 private:
  struct Pass {
    std::shared_ptr<const Kernel> kernel;
    KernelCall call;
  };
  void add(Engine& e, const char* op, const Graph& g, const std::map<std::string, float*>& tensors,
           const std::map<std::string, double>& scalars, int64_t n,
           const std::map<std::string, float*>& out = {});
  std::vector<Pass> calls_;
  std::vector<std::string> ops_;
  int64_t traffic_ = 0;
};

// Torch's unfused AdamW (Unfused::adamw) over a model's tensors, as `optfuse demo` times it
// beside the fused step: each tensor's own copy of its params and fresh state (the model is
// untouched), reading the model's grads. Hyperparameters as the demo's (lr, betas, weight
// decay per tensor), at step 10; the values only matter for what the passes compute.
class UnfusedAdamW {
 public:
  UnfusedAdamW(Engine& e, const std::vector<std::vector<float>>& params,
               const std::vector<std::vector<float>>& grads, const std::vector<bool>& decay,
               double lr, double beta1, double beta2, double weight_decay);
  double timed_step() const;  // seconds
  int64_t bytes_per_step() const { return bytes_; }
  std::string label() const { return steps_.empty() ? "" : steps_.front().label(); }

 private:
  std::vector<std::vector<float>> arrays_;  // per tensor: p, m, v, t
  std::vector<Unfused> steps_;
  int64_t bytes_ = 0;
};

}  // namespace optfuse::tools
