#include "bench/scalar_ref.h"

#include <cmath>

namespace optfuse::bench {

AdamWConstants adamw_constants(const std::map<std::string, double>& s) {
  AdamWConstants c;
  c.decay = static_cast<float>(s.at("decay"));
  c.one_minus_beta1 = static_cast<float>(s.at("one_minus_beta1"));
  c.beta2 = static_cast<float>(s.at("beta2"));
  c.one_minus_beta2 = static_cast<float>(s.at("one_minus_beta2"));
  c.bias_correction2_sqrt = static_cast<float>(1.0 / s.at("inv_bias_correction2_sqrt"));
  c.eps = static_cast<float>(s.at("eps"));
  c.step_size = static_cast<float>(s.at("step_size"));
  return c;
}

void adamw_scalar(float* p, const float* g, float* m, float* v, int64_t n,
                  const AdamWConstants& c) {
  for (int64_t i = 0; i < n; ++i) {
    float pi = p[i] * c.decay;
    float gi = g[i];
    float mi = m[i] + c.one_minus_beta1 * (gi - m[i]);
    float vi = c.beta2 * v[i] + c.one_minus_beta2 * gi * gi;
    float denom = std::sqrt(vi) / c.bias_correction2_sqrt + c.eps;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi - c.step_size * (mi / denom);
  }
}

void sgd_momentum_scalar(float* p, const float* g, float* b, int64_t n, const SgdConstants& c) {
  for (int64_t i = 0; i < n; ++i) {
    float d = g[i] + c.weight_decay * p[i];
    float bi = c.momentum * b[i] + c.one_minus_dampening * d;
    b[i] = bi;
    p[i] = p[i] - c.lr * bi;
  }
}

}  // namespace optfuse::bench
