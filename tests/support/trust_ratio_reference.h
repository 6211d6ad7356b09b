#pragma once
// Independent double-precision references for LAMB and LARS (one tensor, written from the papers
// and from apex FusedLAMB / torchlars, never from optfuse). Inputs are float32 values; everything
// is computed in double with no rounding.
#include <cstdint>
#include <vector>

namespace optfuse::testing {

// LAMB as apex FusedLAMB (adam_w_mode, no global grad clipping): see src/optim/lamb.cpp's header
// for the formulas this re-derives.
struct LambConfig {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-6, weight_decay = 0.01;
  bool bias_correction = true;
  double max_trust_ratio = 0;  // 0: no clamp
};

// LARS as torchlars over torch.optim.SGD (dampening 0, no Nesterov).
struct LarsConfig {
  double lr = 0.1, momentum = 0.9, weight_decay = 0, trust_coefficient = 0.001, eps = 1e-8;
};

class LambReference {
 public:
  LambReference(const LambConfig& c, const std::vector<float>& p0);
  void step(const std::vector<float>& grad);
  const std::vector<double>& param() const { return p_; }
  const std::vector<double>& exp_avg() const { return m_; }
  const std::vector<double>& exp_avg_sq() const { return v_; }
  double last_trust_ratio() const { return trust_; }

 private:
  LambConfig c_;
  int64_t t_ = 0;
  double trust_ = 1;
  std::vector<double> p_, m_, v_;
};

class LarsReference {
 public:
  LarsReference(const LarsConfig& c, const std::vector<float>& p0);
  void step(const std::vector<float>& grad);
  const std::vector<double>& param() const { return p_; }
  const std::vector<double>& momentum_buffer() const { return buf_; }  // empty until step 1
  double last_local_lr() const { return local_lr_; }

 private:
  LarsConfig c_;
  double local_lr_ = 1;
  std::vector<double> p_, buf_;
};

}  // namespace optfuse::testing
