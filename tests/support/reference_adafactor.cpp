#include "support/reference_adafactor.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace optfuse::testing {

AdafactorReference::AdafactorReference(const AdafactorConfig& config, std::vector<int64_t> shape,
                                       const std::vector<float>& p0)
    : c_(config), shape_(std::move(shape)), param_(p0.begin(), p0.end()), bound_(p0.size(), 0.0) {
  if (factored()) {
    cols_ = shape_.back();
    rows_ = shape_[shape_.size() - 2];
    batches_ = static_cast<int64_t>(p0.size()) / (rows_ * cols_);
    row_var_.assign(static_cast<size_t>(batches_ * rows_), 0.0);
    col_var_.assign(static_cast<size_t>(batches_ * cols_), 0.0);
  } else {
    variance_.assign(p0.size(), 0.0);
  }
}

void AdafactorReference::step(const std::vector<float>& grad_in, double lr) {
  const double u = std::ldexp(1.0, -24);
  const size_t n = param_.size();
  std::vector<double> g(grad_in.begin(), grad_in.end());
  if (c_.maximize)
    for (double& x : g) x = -x;
  ++step_;
  const double t = static_cast<double>(step_);
  const double eps1 = c_.eps1 ? *c_.eps1 : std::numeric_limits<float>::epsilon();
  const double one_minus_beta2 = std::pow(t, c_.beta2_decay);
  const double rho = std::min(lr, 1.0 / std::sqrt(t));
  double sumsq = 0;
  for (double p : param_) sumsq += p * p;
  const double alpha = std::max(c_.eps2, std::sqrt(sumsq) / std::sqrt(double(n))) * rho;
  const double decay = 1.0 - lr * c_.weight_decay;
  auto lerp = [&](double start, double end) { return start + one_minus_beta2 * (end - start); };

  std::vector<double> estimate(n);
  if (factored()) {
    for (int64_t b = 0; b < batches_; ++b) {
      for (int64_t r = 0; r < rows_; ++r) {  // row_var.lerp_(mean over the row of g^2)
        double s = 0;
        for (int64_t col = 0; col < cols_; ++col) {
          const double x = g[static_cast<size_t>((b * rows_ + r) * cols_ + col)];
          s += x * x;
        }
        double& rv = row_var_[static_cast<size_t>(b * rows_ + r)];
        rv = lerp(rv, s / double(cols_));
      }
      for (int64_t col = 0; col < cols_; ++col) {  // col_var.lerp_(mean over the column)
        double s = 0;
        for (int64_t r = 0; r < rows_; ++r) {
          const double x = g[static_cast<size_t>((b * rows_ + r) * cols_ + col)];
          s += x * x;
        }
        double& cv = col_var_[static_cast<size_t>(b * cols_ + col)];
        cv = lerp(cv, s / double(rows_));
      }
      double mean = 0;  // row_var.mean(dim=-2), clamped
      for (int64_t r = 0; r < rows_; ++r) mean += row_var_[static_cast<size_t>(b * rows_ + r)];
      mean = std::max(mean / double(rows_), eps1);
      for (int64_t r = 0; r < rows_; ++r)
        for (int64_t col = 0; col < cols_; ++col)
          estimate[static_cast<size_t>((b * rows_ + r) * cols_ + col)] =
              row_var_[static_cast<size_t>(b * rows_ + r)] *
              col_var_[static_cast<size_t>(b * cols_ + col)] / mean;
    }
  } else {
    for (size_t i = 0; i < n; ++i) estimate[i] = variance_[i] = lerp(variance_[i], g[i] * g[i]);
  }
  std::vector<double> update(n);
  double usq = 0;
  for (size_t i = 0; i < n; ++i) {
    update[i] = g[i] / std::sqrt(std::max(estimate[i], eps1 * eps1));
    usq += update[i] * update[i];
  }
  const double rms = std::sqrt(usq) / std::sqrt(double(n));
  const double denom = std::max(1.0, rms / c_.d);
  clipped_ = rms / c_.d > 1.0;
  for (size_t i = 0; i < n; ++i) {
    const double decayed = param_[i] * decay;
    const double term = alpha / denom * update[i];
    const double next = decayed - term;
    bound_[i] = bound_[i] * std::fabs(decay) + u * (std::fabs(decayed) + std::fabs(next)) +
                12 * u * std::fabs(term);
    param_[i] = next;
  }
}

}  // namespace optfuse::testing
