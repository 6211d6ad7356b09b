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

Bounded abs(Bounded a) { return {std::fabs(a.v), a.e}; }
// sign() is exact when the argument's sign is certain; otherwise a float32 evaluation may give
// any of -1, 0, 1 (distance <= 1 from sign(0) = 0, <= 2 from +-1).
Bounded sign(Bounded a) {
  double s = a.v > 0 ? 1.0 : (a.v < 0 ? -1.0 : 0.0);
  if (std::fabs(a.v) > a.e) return {s, 0.0};
  return {s, a.v == 0 ? 1.0 : 2.0};
}
// A host scalar computed in double from the float32-bounded host value x (NAdam's mu_product):
// f(x) for |x' - x| <= x_err deviates by at most `prop` (given), then is rounded once to float32.
Bounded host_of(double v, double prop) { return {v, rounded(v, prop)}; }

// torch.optim.Adagrad, one element (torch/optim/adagrad.py, _single_tensor_adagrad):
//   g = maximize ? -grad : grad;  if weight_decay: g = g + weight_decay * p
//   clr = lr / (1 + (t - 1) * lr_decay)   (host)
//   sum = sum + g * g  (addcmul_, value 1);  std = sqrt(sum) + eps;  p = p - clr * (g / std)
void adagrad_element(const AdagradConfig& c, int64_t t, Bounded* p, Bounded* sum, float grad) {
  Bounded g = c.maximize ? -input(grad) : input(grad);
  if (c.weight_decay != 0) g = g + host(c.weight_decay) * *p;
  double clr = c.lr / (1.0 + static_cast<double>(t - 1) * c.lr_decay);
  *sum = *sum + g * g;
  Bounded std_ = sqrt(*sum) + host(c.eps);
  *p = *p - host(clr) * (g / std_);
}

// torch.optim.RMSprop, one element (torch/optim/rmsprop.py, _single_tensor_rmsprop):
//   g as Adagrad;  v = alpha * v + (1 - alpha) * g * g
//   centered: m = lerp(m, g, 1 - alpha); avg = sqrt(v - m * m) + eps   else avg = sqrt(v) + eps
//   momentum > 0: buf = momentum * buf + g / avg; p = p - lr * buf     else p = p - lr * (g / avg)
void rmsprop_element(const RmspropConfig& c, Bounded* p, Bounded* v, Bounded* m, Bounded* buf,
                     float grad) {
  Bounded g = c.maximize ? -input(grad) : input(grad);
  if (c.weight_decay != 0) g = g + host(c.weight_decay) * *p;
  *v = host(c.alpha) * *v + host(1.0 - c.alpha) * (g * g);
  Bounded avg;
  if (c.centered) {
    *m = lerp(*m, g, host(1.0 - c.alpha));
    avg = sqrt(*v - *m * *m) + host(c.eps);
  } else {
    avg = sqrt(*v) + host(c.eps);
  }
  if (c.momentum > 0) {
    *buf = host(c.momentum) * *buf + g / avg;
    *p = *p - host(c.lr) * *buf;
  } else {
    *p = *p - host(c.lr) * (g / avg);
  }
}

// torch.optim.Adamax, one element (torch/optim/adamax.py, _single_tensor_adamax):
//   g as Adagrad;  m = lerp(m, g, 1 - beta1);  u = max(beta2 * u, |g| + eps)
//   clr = lr / (1 - beta1^t)  (host);  p = p - clr * (m / u)   (addcdiv_, value -clr)
void adamax_element(const AdamaxConfig& c, int64_t t, Bounded* p, Bounded* m, Bounded* u,
                    float grad) {
  Bounded g = c.maximize ? -input(grad) : input(grad);
  if (c.weight_decay != 0) g = g + host(c.weight_decay) * *p;
  *m = lerp(*m, g, host(1.0 - c.beta1));
  *u = max(host(c.beta2) * *u, abs(g) + host(c.eps));
  double clr = c.lr / (1.0 - std::pow(c.beta1, static_cast<double>(t)));
  *p = *p - host(clr) * (*m / *u);
}

// Per-step host scalars of NAdam / RAdam (double), with NAdam's mu_product advanced.
struct NadamRadamScalars {
  double bias_correction1, bias_correction2;
  Bounded nadam_grad_step,
      nadam_exp_avg_step;  // lr(1-mu)/(1-mu_product), lr mu'/(1-mu_product mu')
  bool rectify;
  double rect;
};
NadamRadamScalars nadam_radam_scalars(const NadamRadamConfig& c, int64_t step,
                                      Bounded* mu_product) {
  NadamRadamScalars s{};
  double t = static_cast<double>(step);
  s.bias_correction1 = 1.0 - std::pow(c.beta1, t);
  s.bias_correction2 = 1.0 - std::pow(c.beta2, t);
  if (c.nadam) {
    // torch/optim/nadam.py: mu = beta1 * (1 - 0.5 * 0.96 ** (step * momentum_decay)), likewise
    // mu_next at step + 1; mu_product *= mu (a float32 tensor: rounded like any float32 op).
    double mu = c.beta1 * (1.0 - 0.5 * std::pow(0.96, t * c.momentum_decay));
    double mu_next = c.beta1 * (1.0 - 0.5 * std::pow(0.96, (t + 1.0) * c.momentum_decay));
    *mu_product = *mu_product * host(mu);  // torch rounds the python float mu to float32
    double x = mu_product->v, e = mu_product->e;
    if (!(1.0 - x - e > 0)) throw std::logic_error("reference: 1 - mu_product may be zero");
    double a = c.lr * (1.0 - mu);
    s.nadam_grad_step = host_of(a / (1.0 - x), a * e / ((1.0 - x) * (1.0 - x - e)));
    double b = c.lr * mu_next, y = 1.0 - x * mu_next;
    s.nadam_exp_avg_step = host_of(b / y, b * mu_next * e / (y * (y - mu_next * e)));
  } else {
    // torch/optim/radam.py
    double rho_inf = 2.0 / (1.0 - c.beta2) - 1.0;
    double rho_t = rho_inf - 2.0 * t * std::pow(c.beta2, t) / s.bias_correction2;
    s.rectify = rho_t > 5.0;
    s.rect = s.rectify ? std::sqrt((rho_t - 4) * (rho_t - 2) * rho_inf /
                                   ((rho_inf - 4) * (rho_inf - 2) * rho_t))
                       : 0.0;
  }
  return s;
}

// torch.optim.NAdam / RAdam, one element (_single_tensor_nadam / _single_tensor_radam):
//   g = maximize ? -grad : grad
//   if weight_decay: decoupled ? p = p * (1 - lr * weight_decay) : g = g + weight_decay * p
//   m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g * g
//   NAdam: denom = sqrt(v / bias_correction2) + eps
//          p = p - grad_step * (g / denom);  p = p - exp_avg_step * (m / denom)
//   RAdam: rectified: p = p - ((m / bc1) * lr) * (sqrt(bc2) / (sqrt(v) + eps)) * rect
//          else:      p = p - (m / bc1) * lr
void nadam_radam_element(const NadamRadamConfig& c, const NadamRadamScalars& h, Bounded* p,
                         Bounded* m, Bounded* v, float grad) {
  Bounded g = c.maximize ? -input(grad) : input(grad);
  if (c.weight_decay != 0) {
    if (c.decoupled_weight_decay)
      *p = *p * host(1.0 - c.lr * c.weight_decay);
    else
      g = g + host(c.weight_decay) * *p;
  }
  *m = lerp(*m, g, host(1.0 - c.beta1));
  *v = host(c.beta2) * *v + host(1.0 - c.beta2) * (g * g);
  if (c.nadam) {
    Bounded denom = sqrt(*v / host(h.bias_correction2)) + host(c.eps);
    *p = *p - h.nadam_grad_step * (g / denom);
    *p = *p - h.nadam_exp_avg_step * (*m / denom);
  } else {
    Bounded corrected = (*m / host(h.bias_correction1)) * host(c.lr);
    if (h.rectify)
      corrected = corrected * (host(std::sqrt(h.bias_correction2)) / (sqrt(*v) + host(c.eps))) *
                  host(h.rect);
    *p = *p - corrected;
  }
}

// Lion, one element (lion-pytorch's update_fn):
//   p = p * (1 - lr * wd);  update = sign(m * beta1 + (1 - beta1) * g);  p = p - lr * update
//   m = m * beta2 + (1 - beta2) * g
void lion_element(const LionConfig& c, Bounded* p, Bounded* m, float grad) {
  Bounded g = input(grad);
  *p = *p * host(1.0 - c.lr * c.weight_decay);
  Bounded update = sign(*m * host(c.beta1) + host(1.0 - c.beta1) * g);
  *p = *p - host(c.lr) * update;
  *m = *m * host(c.beta2) + host(1.0 - c.beta2) * g;
}

Bounded min(Bounded a, Bounded b) { return {std::min(a.v, b.v), std::max(a.e, b.e)}; }

// torch.optim.Adadelta, one element (torch/optim/adadelta.py, _single_tensor_adadelta):
//   g as Adagrad;  v = v * rho + (1 - rho) * g * g   (mul_, addcmul_)
//   delta = sqrt(u + eps) / sqrt(v + eps) * g;  u = u * rho + (1 - rho) * delta * delta
//   p = p - lr * delta
void adadelta_element(const AdadeltaConfig& c, Bounded* p, Bounded* v, Bounded* u, float grad) {
  Bounded g = c.maximize ? -input(grad) : input(grad);
  if (c.weight_decay != 0) g = g + host(c.weight_decay) * *p;
  *v = *v * host(c.rho) + host(1.0 - c.rho) * (g * g);
  Bounded delta = sqrt(*u + host(c.eps)) / sqrt(*v + host(c.eps)) * g;
  *u = *u * host(c.rho) + host(1.0 - c.rho) * (delta * delta);
  *p = *p - host(c.lr) * delta;
}

// torch.optim.ASGD's per-step scalars from its (exact) eta and mu: decay = 1 - lambd * eta, which
// torch computes from eta rounded to float32 (the rounding's effect charged to it), and whether
// ax is a copy (torch: mu.item() != 1, in float32).
struct AsgdScalars {
  Bounded decay, eta, mu;
  bool copy;
};
AsgdScalars asgd_scalars(const AsgdConfig& c, double eta, double mu) {
  double eta_rounding = std::fabs(double(static_cast<float>(eta)) - eta);
  return {host_of(1.0 - c.lambd * eta, std::fabs(c.lambd) * eta_rounding), host(eta), host(mu),
          static_cast<float>(mu) == 1.0f};
}

// torch.optim.ASGD, one element (torch/optim/asgd.py, _single_tensor_asgd):
//   g as Adagrad;  p = p * (1 - lambd * eta);  p = p - eta * g
//   ax = copy ? p : ax + (p - ax) * mu
void asgd_element(const AsgdConfig& c, const AsgdScalars& h, Bounded* p, Bounded* ax, float grad) {
  Bounded g = c.maximize ? -input(grad) : input(grad);
  if (c.weight_decay != 0) g = g + host(c.weight_decay) * *p;
  *p = *p * h.decay - h.eta * g;
  *ax = h.copy ? *p : *ax + (*p - *ax) * h.mu;
}

// torch.optim.Rprop, one element (torch/optim/rprop.py, _single_tensor_rprop):
//   g = maximize ? -grad : grad;  s = sign(g * prev) -> etaplus / etaminus / 1
//   step_size = clamp(step_size * s, step_size_min, step_size_max)
//   g = 0 where s == etaminus;  p = p - sign(g) * step_size;  prev = g
void rprop_element(const RpropConfig& c, Bounded* p, Bounded* prev, Bounded* step_size,
                   float grad) {
  const float g = c.maximize ? -grad : grad;
  const float product = g * static_cast<float>(prev->v);  // prev is exact: a gradient or 0
  Bounded factor = product > 0 ? host(c.etaplus) : product < 0 ? host(c.etaminus) : Bounded{1, 0};
  *step_size = min(max(*step_size * factor, host(c.step_size_min)), host(c.step_size_max));
  const float kept = product < 0 ? 0.0f : g;
  *prev = input(kept);
  Bounded s{kept > 0 ? 1.0 : (kept < 0 ? -1.0 : 0.0), 0.0};
  *p = *p - s * *step_size;
}

std::vector<double> from_floats(const std::vector<float>& x) { return {x.begin(), x.end()}; }

}  // namespace

ReferenceOptimizer::ReferenceOptimizer(const SgdConfig& config, const std::vector<float>& p0)
    : kind_(Kind::Sgd), sgd_(config), param_(from_floats(p0)), param_bound_(p0.size(), 0.0) {}

ReferenceOptimizer::ReferenceOptimizer(const AdamConfig& config, const std::vector<float>& p0)
    : kind_(Kind::Adam), adam_(config), param_(from_floats(p0)), param_bound_(p0.size(), 0.0) {}

ReferenceOptimizer::ReferenceOptimizer(const AdagradConfig& config, const std::vector<float>& p0)
    : kind_(Kind::Adagrad),
      adagrad_(config),
      param_(from_floats(p0)),
      param_bound_(p0.size(), 0.0) {}
ReferenceOptimizer::ReferenceOptimizer(const RmspropConfig& config, const std::vector<float>& p0)
    : kind_(Kind::Rmsprop),
      rmsprop_(config),
      param_(from_floats(p0)),
      param_bound_(p0.size(), 0.0) {}
ReferenceOptimizer::ReferenceOptimizer(const AdamaxConfig& config, const std::vector<float>& p0)
    : kind_(Kind::Adamax), adamax_(config), param_(from_floats(p0)), param_bound_(p0.size(), 0.0) {}
ReferenceOptimizer::ReferenceOptimizer(const NadamRadamConfig& config, const std::vector<float>& p0)
    : kind_(Kind::NadamRadam), nr_(config), param_(from_floats(p0)), param_bound_(p0.size(), 0.0) {}
ReferenceOptimizer::ReferenceOptimizer(const LionConfig& config, const std::vector<float>& p0)
    : kind_(Kind::Lion), lion_(config), param_(from_floats(p0)), param_bound_(p0.size(), 0.0) {}

ReferenceOptimizer::ReferenceOptimizer(const AdadeltaConfig& config, const std::vector<float>& p0)
    : kind_(Kind::Adadelta),
      adadelta_(config),
      param_(from_floats(p0)),
      param_bound_(p0.size(), 0.0) {}
ReferenceOptimizer::ReferenceOptimizer(const AsgdConfig& config, const std::vector<float>& p0)
    : kind_(Kind::Asgd), asgd_(config), param_(from_floats(p0)), param_bound_(p0.size(), 0.0) {}
ReferenceOptimizer::ReferenceOptimizer(const RpropConfig& config, const std::vector<float>& p0)
    : kind_(Kind::Rprop), rprop_(config), param_(from_floats(p0)), param_bound_(p0.size(), 0.0) {}

void ReferenceOptimizer::set_lr(double lr) {
  sgd_.lr = lr;
  adam_.lr = lr;
  adagrad_.lr = lr;
  rmsprop_.lr = lr;
  adamax_.lr = lr;
  nr_.lr = lr;
  lion_.lr = lr;
  adadelta_.lr = lr;
  asgd_.lr = lr;
  rprop_.lr = lr;
}

void ReferenceOptimizer::step_other(const std::vector<float>& grad) {
  const size_t n = param_.size();
  const std::vector<std::string> names = state_names();
  for (const std::string& name : names)
    if (!state_.count(name)) {
      // torch: zeros_like, except Adagrad's sum: full_like(p, initial_accumulator_value) and
      // Rprop's step_size: full_like(p, lr), float32 tensors (exact from then on).
      double init = 0.0;
      if (kind_ == Kind::Adagrad)
        init = double(static_cast<float>(adagrad_.initial_accumulator_value));
      if (kind_ == Kind::Rprop && name == "step_size") init = double(static_cast<float>(rprop_.lr));
      state_[name].assign(n, init);
      state_bound_[name].assign(n, 0.0);
    }
  // Up to three state buffers, in state_names() order.
  std::vector<double*> sv, se;
  for (const std::string& name : names) {
    sv.push_back(state_[name].data());
    se.push_back(state_bound_[name].data());
  }
  auto index_of = [&](const char* name) {
    auto it = std::find(names.begin(), names.end(), name);
    return it == names.end() ? -1 : int(it - names.begin());
  };
  const int sq = index_of("square_avg"), ga = index_of("grad_avg"),
            mb = index_of("momentum_buffer");
  NadamRadamScalars nr{};
  if (kind_ == Kind::NadamRadam) nr = nadam_radam_scalars(nr_, step_, &mu_product_);
  if (kind_ == Kind::Asgd && step_ == 1) asgd_eta_ = asgd_.lr;  // torch: tensor(lr) at init
  const AsgdScalars asgd = asgd_scalars(asgd_, asgd_eta_, asgd_mu_);
  for (size_t i = 0; i < n; ++i) {
    Bounded p{param_[i], param_bound_[i]};
    Bounded s[3];
    for (size_t k = 0; k < names.size(); ++k) s[k] = {sv[k][i], se[k][i]};
    Bounded unused;
    switch (kind_) {
      case Kind::Adagrad:
        adagrad_element(adagrad_, step_, &p, &s[0], grad[i]);
        break;
      case Kind::Rmsprop:
        rmsprop_element(rmsprop_, &p, &s[sq], ga >= 0 ? &s[ga] : &unused,
                        mb >= 0 ? &s[mb] : &unused, grad[i]);
        break;
      case Kind::Adamax:
        adamax_element(adamax_, step_, &p, &s[0], &s[1], grad[i]);
        break;
      case Kind::NadamRadam:
        nadam_radam_element(nr_, nr, &p, &s[0], &s[1], grad[i]);
        break;
      case Kind::Lion:
        lion_element(lion_, &p, &s[0], grad[i]);
        break;
      case Kind::Adadelta:
        adadelta_element(adadelta_, &p, &s[0], &s[1], grad[i]);
        break;
      case Kind::Asgd:
        asgd_element(asgd_, asgd, &p, &s[0], grad[i]);
        break;
      case Kind::Rprop:
        rprop_element(rprop_, &p, &s[0], &s[1], grad[i]);
        break;
      default:
        throw std::logic_error("reference: step_other on SGD/Adam");
    }
    for (size_t k = 0; k < names.size(); ++k) sv[k][i] = s[k].v, se[k][i] = s[k].e;
    param_[i] = p.v;
    param_bound_[i] = p.e;
  }
  if (kind_ == Kind::Asgd) {  // torch: for the next step, from this step's count and lr
    const double t = static_cast<double>(step_);
    asgd_eta_ = asgd_.lr / std::pow(1.0 + asgd_.lambd * asgd_.lr * t, asgd_.alpha);
    asgd_mu_ = 1.0 / std::max(1.0, t - asgd_.t0);
  }
}

void ReferenceOptimizer::step(const std::vector<float>& grad) {
  if (grad.size() != param_.size()) throw std::invalid_argument("reference: grad size mismatch");
  if (kind_ != Kind::Sgd && kind_ != Kind::Adam) {
    ++step_;
    step_other(grad);
    return;
  }
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
  switch (kind_) {
    case Kind::Adagrad:
      return {"sum"};
    case Kind::Rmsprop: {
      std::vector<std::string> names = {"square_avg"};
      if (rmsprop_.momentum > 0) names.push_back("momentum_buffer");
      if (rmsprop_.centered) names.push_back("grad_avg");
      return names;
    }
    case Kind::Adamax:
      return {"exp_avg", "exp_inf"};
    case Kind::NadamRadam:
      return {"exp_avg", "exp_avg_sq"};
    case Kind::Lion:
      return {"exp_avg"};
    case Kind::Adadelta:
      return {"square_avg", "acc_delta"};
    case Kind::Asgd:
      return {"ax"};
    case Kind::Rprop:
      return {"prev", "step_size"};
    default:
      break;
  }
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
