#include "support/reference_gc.h"

#include <cmath>

namespace optfuse::testing {
namespace {

// d -= per-row mean, for tensors with >= 2 dims.
void centralize(std::vector<double>& d, const std::vector<int64_t>& shape) {
  if (shape.size() < 2) return;
  size_t rows = static_cast<size_t>(shape[0]), cols = d.size() / rows;
  for (size_t r = 0; r < rows; ++r) {
    double mean = 0;
    for (size_t i = 0; i < cols; ++i) mean += d[r * cols + i];
    mean /= static_cast<double>(cols);
    for (size_t i = 0; i < cols; ++i) d[r * cols + i] -= mean;
  }
}

}  // namespace

GcReference::GcReference(GcConfig config, std::vector<int64_t> shape, const std::vector<float>& p0)
    : c_(std::move(config)), shape_(std::move(shape)), p_(p0.begin(), p0.end()) {}

void GcReference::step(const std::vector<float>& grad) {
  ++step_;
  const size_t n = p_.size();
  std::vector<double> d(n);
  for (size_t i = 0; i < n; ++i) d[i] = c_.maximize ? -double(grad[i]) : double(grad[i]);
  if (c_.type == "adamw") {
    for (double& p : p_) p *= 1 - c_.lr * c_.weight_decay;
  } else if (c_.weight_decay != 0) {
    for (size_t i = 0; i < n; ++i) d[i] += c_.weight_decay * p_[i];
  }
  centralize(d, shape_);
  if (c_.type == "sgd") {
    if (c_.momentum != 0) {
      auto [it, first] = state_.try_emplace("momentum_buffer", d);
      std::vector<double>& buf = it->second;
      if (!first)
        for (size_t i = 0; i < n; ++i) buf[i] = c_.momentum * buf[i] + (1 - c_.dampening) * d[i];
      for (size_t i = 0; i < n; ++i) d[i] = c_.nesterov ? d[i] + c_.momentum * buf[i] : buf[i];
    }
    for (size_t i = 0; i < n; ++i) p_[i] -= c_.lr * d[i];
    return;
  }
  std::vector<double>& m = state_.try_emplace("exp_avg", n, 0.0).first->second;
  std::vector<double>& v = state_.try_emplace("exp_avg_sq", n, 0.0).first->second;
  double bc1 = 1 - std::pow(c_.beta1, double(step_)), bc2 = 1 - std::pow(c_.beta2, double(step_));
  for (size_t i = 0; i < n; ++i) {
    m[i] = c_.beta1 * m[i] + (1 - c_.beta1) * d[i];
    v[i] = c_.beta2 * v[i] + (1 - c_.beta2) * d[i] * d[i];
    double denom = std::sqrt(v[i]) / std::sqrt(bc2) + c_.eps;
    p_[i] -= c_.lr / bc1 * m[i] / denom;
  }
}

}  // namespace optfuse::testing
