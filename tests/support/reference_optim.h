#pragma once
// Independent scalar references for torch.optim.SGD, Adam, AdamW, Adagrad, RMSprop, Adamax, NAdam,
// RAdam, Adadelta, ASGD and Rprop (the single-tensor algorithm, written from torch's documentation
// and torch/optim/*.py, never from optfuse) and for Lion (lucidrains/lion-pytorch), run in double
// from float32 inputs, plus a rigorous bound on how far ANY float32 evaluation of the same formulas
// may land from the double result.
//
// The bound (running error analysis, Wilkinson style) is what the tests use as tolerance, per
// element and per step, instead of one hand-picked relative number:
//   * a float32 input (p0, grad) is exact: error 0;
//   * a host scalar (lr, 1 - beta1, lr / bias_correction1, ...) is computed in double and rounded
//     once to float32 by whoever evaluates in float32 (optfuse, torch): error |float(x) - x|;
//   * each float32 +, -, *, / adds the propagated input errors (exact interval arithmetic on the
//     magnitudes) plus the rounding of its own result: u * |result|, u = 2^-24;
//   * sqrt is allowed 4 ulp (optfuse's refined fast_inverse_sqrt; torch's is exact) = 8u *
//   |result|;
//   * every op also adds 2^-126 absolute, covering flush-to-zero of subnormal results;
//   * lerp(a, b, w) = a + w * (b - a) propagates a's error with |1 - w|, not 1 + |w|: the formula
//   is
//     linear in a, and a naive op-by-op bound would grow as (1 + w)^t instead of decaying as
//     (1 - w)^t, overstating Adam's exp_avg error ~50x after 20 steps.
// So |x_f32 - x_ref| <= bound holds for an evaluation in exactly the reference's order; see
// kEvaluationOrderSlack in optim_util.h for other orders.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace optfuse::testing {

// torch.optim.SGD(lr, momentum, dampening, weight_decay, nesterov, maximize).
struct SgdConfig {
  double lr = 1e-3;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  bool maximize = false;
};

// torch.optim.Adam (decoupled_weight_decay = false) or AdamW (true).
struct AdamConfig {
  bool decoupled_weight_decay = false;
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
  bool amsgrad = false;
  bool maximize = false;
};

// torch.optim.Adagrad.
struct AdagradConfig {
  double lr = 1e-2;
  double lr_decay = 0;
  double weight_decay = 0;
  double initial_accumulator_value = 0;
  double eps = 1e-10;
  bool maximize = false;
};

// torch.optim.RMSprop.
struct RmspropConfig {
  double lr = 1e-2;
  double alpha = 0.99;
  double eps = 1e-8;
  double weight_decay = 0;
  double momentum = 0;
  bool centered = false;
  bool maximize = false;
};

// torch.optim.Adamax.
struct AdamaxConfig {
  double lr = 2e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
  bool maximize = false;
};

// torch.optim.NAdam (nadam = true) or RAdam (false); momentum_decay is NAdam's only.
// NAdam's mu_product is tracked as torch keeps it: a float32 0-d tensor multiplied by mu_t each
// step, so its bound covers torch's float32 product (and optfuse's exact double one).
struct NadamRadamConfig {
  bool nadam = true;
  double lr = 2e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
  double momentum_decay = 4e-3;
  bool decoupled_weight_decay = false;
  bool maximize = false;
};

// Lion (lion-pytorch): sign(beta1 m + (1 - beta1) g), decoupled weight decay. sign() is exact
// unless its argument lies within its own bound of 0; then the bound allows the other sign.
struct LionConfig {
  double lr = 1e-4;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double weight_decay = 0;
};

// torch.optim.Adadelta.
struct AdadeltaConfig {
  double lr = 1.0;
  double rho = 0.9;
  double eps = 1e-6;
  double weight_decay = 0;
  bool maximize = false;
};

// torch.optim.ASGD. eta and mu are torch's float32 0-d tensors: the reference keeps them exact and
// charges their float32 rounding to the scalars made from them.
struct AsgdConfig {
  double lr = 1e-2;
  double lambd = 1e-4;
  double alpha = 0.75;
  double t0 = 1e6;
  double weight_decay = 0;
  bool maximize = false;
};

// torch.optim.Rprop. Its decisions (the sign of grad * prev) are exact: grad and prev are float32
// values, and the products of these inputs are normal floats.
struct RpropConfig {
  double lr = 1e-2;
  double etaminus = 0.5;
  double etaplus = 1.2;
  double step_size_min = 1e-6;
  double step_size_max = 50;
  bool maximize = false;
};

// A double value and a bound on |float32 evaluation - value|.
struct Bounded {
  double v = 0;
  double e = 0;
};

// One tensor's optimizer. State buffers are created at the first step under torch's names
// ("momentum_buffer", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"), only where torch has them.
class ReferenceOptimizer {
 public:
  ReferenceOptimizer(const SgdConfig& config, const std::vector<float>& p0);
  ReferenceOptimizer(const AdamConfig& config, const std::vector<float>& p0);
  ReferenceOptimizer(const AdagradConfig& config, const std::vector<float>& p0);
  ReferenceOptimizer(const RmspropConfig& config, const std::vector<float>& p0);
  ReferenceOptimizer(const AdamaxConfig& config, const std::vector<float>& p0);
  ReferenceOptimizer(const NadamRadamConfig& config, const std::vector<float>& p0);
  ReferenceOptimizer(const LionConfig& config, const std::vector<float>& p0);
  ReferenceOptimizer(const AdadeltaConfig& config, const std::vector<float>& p0);
  ReferenceOptimizer(const AsgdConfig& config, const std::vector<float>& p0);
  ReferenceOptimizer(const RpropConfig& config, const std::vector<float>& p0);

  void set_lr(double lr);  // like param_groups[0]["lr"] = lr
  void step(const std::vector<float>& grad);

  int64_t step_count() const { return step_; }
  size_t numel() const { return param_.size(); }
  const std::vector<double>& param() const { return param_; }
  const std::vector<double>& param_bound() const { return param_bound_; }
  // Null when torch would not have this state (yet).
  const std::vector<double>* state(const std::string& name) const;
  const std::vector<double>* state_bound(const std::string& name) const;
  std::vector<std::string> state_names() const;

 private:
  enum class Kind { Sgd, Adam, Adagrad, Rmsprop, Adamax, NadamRadam, Lion, Adadelta, Asgd, Rprop };
  void step_other(const std::vector<float>& grad);  // every kind but Sgd and Adam
  Kind kind_;
  SgdConfig sgd_;
  AdamConfig adam_;
  AdagradConfig adagrad_;
  RmspropConfig rmsprop_;
  AdamaxConfig adamax_;
  NadamRadamConfig nr_;
  LionConfig lion_;
  AdadeltaConfig adadelta_;
  AsgdConfig asgd_;
  RpropConfig rprop_;
  Bounded mu_product_{1.0, 0.0};       // NAdam
  double asgd_eta_ = 0, asgd_mu_ = 1;  // ASGD's eta (set at the first step) and mu, exact
  int64_t step_ = 0;
  std::vector<double> param_, param_bound_;
  std::map<std::string, std::vector<double>> state_, state_bound_;
};

}  // namespace optfuse::testing
