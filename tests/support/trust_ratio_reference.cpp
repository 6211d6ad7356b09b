#include "support/trust_ratio_reference.h"

#include <algorithm>
#include <cmath>

namespace optfuse::testing {
namespace {

double norm(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v * v;
  return std::sqrt(s);
}

}  // namespace

LambReference::LambReference(const LambConfig& c, const std::vector<float>& p0)
    : c_(c), p_(p0.begin(), p0.end()), m_(p0.size(), 0.0), v_(p0.size(), 0.0) {}

void LambReference::step(const std::vector<float>& grad) {
  ++t_;
  const size_t n = p_.size();
  std::vector<double> u(n);
  double bc1 = c_.bias_correction ? 1 - std::pow(c_.beta1, double(t_)) : 1.0;
  double bc2 = c_.bias_correction ? 1 - std::pow(c_.beta2, double(t_)) : 1.0;
  for (size_t i = 0; i < n; ++i) {
    double g = grad[i];
    m_[i] = c_.beta1 * m_[i] + (1 - c_.beta1) * g;
    v_[i] = c_.beta2 * v_[i] + (1 - c_.beta2) * g * g;
    u[i] = (m_[i] / bc1) / (std::sqrt(v_[i] / bc2) + c_.eps) + c_.weight_decay * p_[i];
  }
  double pn = norm(p_), un = norm(u);
  trust_ = pn > 0 && un > 0 ? pn / un : 1.0;
  if (c_.max_trust_ratio > 0) trust_ = std::min(trust_, c_.max_trust_ratio);
  for (size_t i = 0; i < n; ++i) p_[i] -= c_.lr * trust_ * u[i];
}

LarsReference::LarsReference(const LarsConfig& c, const std::vector<float>& p0)
    : c_(c), p_(p0.begin(), p0.end()) {}

void LarsReference::step(const std::vector<float>& grad) {
  const size_t n = p_.size();
  std::vector<double> g(grad.begin(), grad.end());
  double pn = norm(p_), gn = norm(g);
  local_lr_ =
      pn > 0 && gn > 0 ? c_.trust_coefficient * pn / (gn + c_.weight_decay * pn + c_.eps) : 1.0;
  std::vector<double> d(n);
  for (size_t i = 0; i < n; ++i) d[i] = local_lr_ * (g[i] + c_.weight_decay * p_[i]);
  if (c_.momentum != 0) {
    if (buf_.empty()) {
      buf_ = d;  // torch SGD: the first buffer is the step's d itself
    } else {
      for (size_t i = 0; i < n; ++i) buf_[i] = c_.momentum * buf_[i] + d[i];
    }
    d = buf_;
  }
  for (size_t i = 0; i < n; ++i) p_[i] -= c_.lr * d[i];
}

}  // namespace optfuse::testing
