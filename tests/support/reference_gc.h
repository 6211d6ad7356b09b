#pragma once
// An independent double-precision reference for gradient centralization with SGD, Adam and AdamW,
// written from the GC paper's code (Yong et al. 2020,
// github.com/Yonghongwei/Gradient-Centralization: SGD_GC, Adam_GC, AdamW_GC) and MindSpore's
// grad_centralization, never from optfuse:
//   d = maximize ? -grad : grad; L2 decay (SGD, Adam): d += weight_decay * p
//   if the tensor has >= 2 dims: d -= mean of d over all dims but the first (per row)
//   then the optimizer's usual update with d (AdamW: p *= 1 - lr * weight_decay first).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace optfuse::testing {

struct GcConfig {
  std::string type = "sgd";  // "sgd", "adam" or "adamw"
  double lr = 1e-2;
  double momentum = 0, dampening = 0;             // SGD
  bool nesterov = false;                          // SGD
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // Adam, AdamW
  double weight_decay = 0;
  bool maximize = false;
};

// One tensor of shape `shape` (row-major; rows = shape[0]).
class GcReference {
 public:
  GcReference(GcConfig config, std::vector<int64_t> shape, const std::vector<float>& p0);
  void step(const std::vector<float>& grad);
  const std::vector<double>& param() const { return p_; }
  // "momentum_buffer" (SGD with momentum), "exp_avg", "exp_avg_sq" (Adam, AdamW).
  const std::vector<double>& state(const std::string& name) const { return state_.at(name); }

 private:
  GcConfig c_;
  std::vector<int64_t> shape_;
  int64_t step_ = 0;
  std::vector<double> p_;
  std::map<std::string, std::vector<double>> state_;
};

}  // namespace optfuse::testing
