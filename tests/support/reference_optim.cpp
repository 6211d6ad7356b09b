#include "support/reference_optim.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace optfuse::testing {
namespace {

// Bounded arithmetic: `.v` is exactly the double computation (the reference value); `.e` bounds a
// float32 evaluation's distance from it (see the header). Errors are propagated rigorously (no
// first-order truncation); rounding is charged on the perturbed magnitude |v| + e.
constexpr double kU = 0x1p-24;      // float32 unit roundoff
constexpr double kTiny = 0x1p-126;  // smallest normal float: covers flush-to-zero
constexpr double kSqrtUlps = 4;     // optfuse's refined fast sqrt; 1 ulp <= 2u * |x|

double rounded(double v, double e) { return e + kU * (std::fabs(v) + e) + kTiny; }

Bounded input(float x) { return {x, 0.0}; }
Bounded host(double x) { return {x, std::fabs(double(static_cast<float>(x)) - x)}; }

Bounded operator-(Bounded a) { return {-a.v, a.e}; }
Bounded operator+(Bounded a, Bounded b) {
  double v = a.v + b.v;
  return {v, rounded(v, a.e + b.e)};
}
Bounded operator-(Bounded a, Bounded b) { return a + (-b); }
Bounded operator*(Bounded a, Bounded b) {
  double v = a.v * b.v;
  return {v, rounded(v, std::fabs(a.v) * b.e + std::fabs(b.v) * a.e + a.e * b.e)};
}
Bounded operator/(Bounded a, Bounded b) {
  if (!(std::fabs(b.v) > b.e)) throw std::logic_error("reference: divisor may be zero");
  double v = a.v / b.v;
  return {v, rounded(v, (a.e + std::fabs(v) * b.e) / (std::fabs(b.v) - b.e))};
}
Bounded sqrt(Bounded a) {
  double v = std::sqrt(a.v);
  // |sqrt(a') - sqrt(a)| for |a' - a| <= e: e / (sqrt(a) + sqrt(a - e)) when a > e, else sqrt(e).
  double e = a.v > a.e ? a.e / (v + std::sqrt(a.v - a.e)) : std::sqrt(a.e);
  return {v, e + 2 * kSqrtUlps * kU * (v + e) + kTiny};
}
Bounded max(Bounded a, Bounded b) { return {std::max(a.v, b.v), std::max(a.e, b.e)}; }
// a + w * (b - a), linear in a and b: errors propagate with |1 - w| and |w|.
Bounded lerp(Bounded a, Bounded b, Bounded w) {
  double d = b.v - a.v;
  double v = a.v + w.v * d;
  double aw = std::fabs(w.v) + w.e;
  double e = std::fabs(1 - w.v) * a.e + std::fabs(w.v) * b.e + w.e * (std::fabs(d) + a.e + b.e);
  e += aw * kU * (std::fabs(d) + a.e + b.e) + kTiny;    // rounding of b - a, scaled by w
  e += kU * (aw * (std::fabs(d) + a.e + b.e)) + kTiny;  // rounding of w * (b - a)
  return {v, rounded(v, e)};                            // rounding of a + ...
}

// torch.optim.SGD, one element (torch/optim/sgd.py, _single_tensor_sgd):
//   d = maximize ? -grad : grad;  if weight_decay: d = d + weight_decay * p
//   if momentum: buf = (first step) ? clone(d) : momentum * buf + (1 - dampening) * d
//                d = nesterov ? d + momentum * buf : buf
//   p = p - lr * d
void sgd_element(const SgdConfig& c, bool first_step, Bounded* p, Bounded* buf, float grad) {
  Bounded d = c.maximize ? -input(grad) : input(grad);
  if (c.weight_decay != 0) d = d + host(c.weight_decay) * *p;
  if (c.momentum != 0) {
    if (first_step)
      *buf = d;
    else
      *buf = host(c.momentum) * *buf + host(1.0 - c.dampening) * d;
    d = c.nesterov ? d + host(c.momentum) * *buf : *buf;
  }
  *p = *p - host(c.lr) * d;
}

// torch.optim.Adam / AdamW, one element (torch/optim/adam.py, _single_tensor_adam):
//   g = maximize ? -grad : grad
//   if weight_decay: AdamW: p = p * (1 - lr * weight_decay)   Adam: g = g + weight_decay * p
//   m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g * g
//   bias_correction1 = 1 - beta1^t;  bias_correction2 = 1 - beta2^t   (host, double)
//   step_size = lr / bias_correction1;  bc2_sqrt = sqrt(bias_correction2)
//   if amsgrad: v_max = max(v_max, v);  denom = sqrt(v_max) / bc2_sqrt + eps
//   else:                               denom = sqrt(v) / bc2_sqrt + eps
//   p = p - step_size * (m / denom)      (addcdiv_ with value = -step_size)
struct AdamStepScalars {
  double step_size, bias_correction2_sqrt;
};
AdamStepScalars adam_step_scalars(const AdamConfig& c, int64_t t) {
  double bias_correction1 = 1.0 - std::pow(c.beta1, static_cast<double>(t));
  double bias_correction2 = 1.0 - std::pow(c.beta2, static_cast<double>(t));
  return {c.lr / bias_correction1, std::sqrt(bias_correction2)};
}
void adam_element(const AdamConfig& c, const AdamStepScalars& h, Bounded* p, Bounded* m, Bounded* v,
                  Bounded* v_max, float grad) {
  Bounded g = c.maximize ? -input(grad) : input(grad);
  if (c.weight_decay != 0) {
    if (c.decoupled_weight_decay)
      *p = *p * host(1.0 - c.lr * c.weight_decay);
    else
      g = g + host(c.weight_decay) * *p;
  }
  *m = lerp(*m, g, host(1.0 - c.beta1));
  *v = host(c.beta2) * *v + host(1.0 - c.beta2) * (g * g);
  Bounded used = *v;
  if (c.amsgrad) {
    *v_max = max(*v_max, *v);
    used = *v_max;
  }
  Bounded denom = sqrt(used) / host(h.bias_correction2_sqrt) + host(c.eps);
  *p = *p - host(h.step_size) * (*m / denom);
}

std::vector<double> from_floats(const std::vector<float>& x) { return {x.begin(), x.end()}; }

}  // namespace

ReferenceOptimizer::ReferenceOptimizer(const SgdConfig& config, const std::vector<float>& p0)
    : kind_(Kind::Sgd), sgd_(config), param_(from_floats(p0)), param_bound_(p0.size(), 0.0) {}

ReferenceOptimizer::ReferenceOptimizer(const AdamConfig& config, const std::vector<float>& p0)
    : kind_(Kind::Adam), adam_(config), param_(from_floats(p0)), param_bound_(p0.size(), 0.0) {}

void ReferenceOptimizer::set_lr(double lr) {
  sgd_.lr = lr;
  adam_.lr = lr;
}

void ReferenceOptimizer::step(const std::vector<float>& grad) {
  if (grad.size() != param_.size()) throw std::invalid_argument("reference: grad size mismatch");
  const size_t n = param_.size();
  ++step_;
  const bool first = !state_.count("momentum_buffer");  // torch: buf is None
  const AdamStepScalars adam_scalars = adam_step_scalars(adam_, step_);
  for (const std::string& name : state_names())
    if (!state_.count(name)) {
      state_[name].assign(n, 0.0);  // torch: zeros_like (momentum_buffer: replaced below)
      state_bound_[name].assign(n, 0.0);
    }
  // (value, bound) of a state buffer, or nulls where torch has no such state.
  struct Slot {
    double* v = nullptr;
    double* e = nullptr;
    Bounded load(size_t i) const { return v ? Bounded{v[i], e[i]} : Bounded{}; }
    void store(size_t i, Bounded b) const {
      if (v) v[i] = b.v, e[i] = b.e;
    }
  };
  auto slot = [&](const char* name) {
    auto it = state_.find(name);
    if (it == state_.end()) return Slot{};
    return Slot{it->second.data(), state_bound_[name].data()};
  };
  const Slot buf = slot("momentum_buffer"), m_slot = slot("exp_avg"), v_slot = slot("exp_avg_sq"),
             v_max_slot = slot("max_exp_avg_sq");
  for (size_t i = 0; i < n; ++i) {
    Bounded p{param_[i], param_bound_[i]};
    if (kind_ == Kind::Sgd) {
      Bounded b = buf.load(i);
      sgd_element(sgd_, first, &p, &b, grad[i]);
      buf.store(i, b);
    } else {
      Bounded m = m_slot.load(i), v = v_slot.load(i), v_max = v_max_slot.load(i);
      adam_element(adam_, adam_scalars, &p, &m, &v, &v_max, grad[i]);
      m_slot.store(i, m);
      v_slot.store(i, v);
      v_max_slot.store(i, v_max);
    }
    param_[i] = p.v;
    param_bound_[i] = p.e;
  }
}

std::vector<std::string> ReferenceOptimizer::state_names() const {
  if (kind_ == Kind::Sgd) {
    if (sgd_.momentum == 0) return {};
    return {"momentum_buffer"};
  }
  if (adam_.amsgrad) return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  return {"exp_avg", "exp_avg_sq"};
}

const std::vector<double>* ReferenceOptimizer::state(const std::string& name) const {
  auto it = state_.find(name);
  return it == state_.end() ? nullptr : &it->second;
}

const std::vector<double>* ReferenceOptimizer::state_bound(const std::string& name) const {
  auto it = state_bound_.find(name);
  return it == state_bound_.end() ? nullptr : &it->second;
}

}  // namespace optfuse::testing
