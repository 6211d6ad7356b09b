#pragma once
// The loss scale S: static, or dynamic with torch.cuda.amp.GradScaler's update rule
// (torch's _amp_update_scale_):
//   a step whose gradients hold inf/nan:  S *= backoff_factor, growth tracker = 0
//   a clean step:                         tracker += 1; when it reaches growth_interval,
//                                         S *= growth_factor (kept only if finite), tracker = 0
// torch keeps S as a float32 tensor and computes each product in double before storing it:
// S here is always a float32 value held in a double, so the sequence is torch's bit for bit.
#include <cstdint>

#include "optim/step_options.h"

namespace optfuse::optim {

class LossScaler {
 public:
  LossScaler() = default;
  explicit LossScaler(const StepOptions& o);

  // The S the next step's gradients are scaled by (1 without loss scaling).
  double scale() const { return scale_; }
  int64_t growth_tracker() const { return growth_tracker_; }

  // After an update step (found_nonfinite = false) or a skipped one (true).
  void update(bool found_nonfinite);

  // Restores a saved (scale, tracker); Error if they are not a valid state for this scaler.
  void restore(double scale, int64_t growth_tracker);

 private:
  bool dynamic_ = false;
  double scale_ = 1.0;
  double growth_factor_ = 2.0, backoff_factor_ = 0.5;
  int64_t growth_interval_ = 2000;
  int64_t growth_tracker_ = 0;
};

}  // namespace optfuse::optim
