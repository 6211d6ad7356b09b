#pragma once
// Plain scalar C++ update loops, written per element exactly as torch's single-tensor formulas
// read (std::sqrt, true divides), in fp32. Built in their own file with the build type's flags
// only (Release: -O3 -DNDEBUG, baseline x86-64, no -march=native): what a user's own loop gets.
// Single-threaded, as a plain loop is.
#include <cstdint>
#include <map>
#include <string>

namespace optfuse::bench {

// AdamW's per-step host constants, rounded once from double (the names src/optim/adam.cpp uses).
struct AdamWConstants {
  float decay;  // 1 - lr * weight_decay
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  float eps;
  float step_size;  // lr / (1 - beta1^t)
};
AdamWConstants adamw_constants(const std::map<std::string, double>& scalars);

// p *= decay; m = lerp(m, g, 1-b1); v = b2*v + (1-b2)*g*g;
// p -= step_size * m / (sqrt(v) / bias_correction2_sqrt + eps)
void adamw_scalar(float* p, const float* g, float* m, float* v, int64_t n, const AdamWConstants& c);

struct SgdConstants {
  float lr, weight_decay, momentum, one_minus_dampening;
};

// d = g + weight_decay*p; b = momentum*b + (1-dampening)*d; p -= lr*b
void sgd_momentum_scalar(float* p, const float* g, float* b, int64_t n, const SgdConstants& c);

}  // namespace optfuse::bench
