#pragma once
// An independent reference for torch.optim.Adafactor: its single-tensor algorithm
// (torch/optim/_adafactor.py, _single_tensor_adafactor), written from torch's source and
// documentation, never from optfuse, run in double from float32 inputs, for one tensor of any
// shape (factored over its last two dims when it has two or more, the leading dims batches).
//
// With each step it carries a bound on how far a float32 evaluation may land from its param
// (running error analysis, as reference_optim.h does for the element-wise optimizers), per
// element, u = 2^-24: the param's own roundings (the decay's multiply and the update's add, u
// of each magnitude) and the update term's relative error, 12u of |alpha / denom * u|: the
// state's lerps (a few u: a lerp contracts its operands' errors), the variance estimate's
// product and divide and the clamp's (2u), 1 / sqrt (2u, or 4 ulp for the estimate), the
// multiply by g and by the f32 factor (2u), the f32 rounding of the weight w, and the
// reductions (accumulated in double: far below u). Thresholds (the eps1 clamps, the clip's
// max(1, .)) are continuous, so either side of them keeps the error proportional.
#include <cstdint>
#include <optional>
#include <vector>

namespace optfuse::testing {

struct AdafactorConfig {
  double lr = 1e-2;
  double beta2_decay = -0.8;
  std::optional<double> eps1;  // null: float32's machine epsilon (the params are f32)
  double eps2 = 1e-3;
  double d = 1.0;
  double weight_decay = 0;
  bool maximize = false;
};

class AdafactorReference {
 public:
  AdafactorReference(const AdafactorConfig& config, std::vector<int64_t> shape,
                     const std::vector<float>& p0);

  // One torch step with learning rate `lr` (torch's param_groups[0]["lr"]) and gradient `grad`.
  void step(const std::vector<float>& grad, double lr);

  const std::vector<double>& param() const { return param_; }
  const std::vector<double>& bound() const { return bound_; }  // per element, see the top
  // torch's state: row_var and col_var (flattened; one per row and column of each matrix), or
  // variance (fewer than two dims).
  const std::vector<double>& row_var() const { return row_var_; }
  const std::vector<double>& col_var() const { return col_var_; }
  const std::vector<double>& variance() const { return variance_; }
  bool factored() const { return shape_.size() >= 2; }
  // Whether the last step clipped its update (RMS(u) > d).
  bool clipped() const { return clipped_; }

 private:
  AdafactorConfig c_;
  std::vector<int64_t> shape_;
  int64_t rows_ = 1, cols_ = 1, batches_ = 1;  // the matrices of a factored tensor
  int64_t step_ = 0;
  bool clipped_ = false;
  std::vector<double> param_, bound_, row_var_, col_var_, variance_;
};

}  // namespace optfuse::testing
