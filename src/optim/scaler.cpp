#include "optim/scaler.h"

#include <cmath>
#include <string>

#include "optfuse/error.h"
#include "optim/options.h"

namespace optfuse::optim {

namespace {
double to_f32(double v) { return static_cast<double>(static_cast<float>(v)); }
}  // namespace

LossScaler::LossScaler(const StepOptions& o)
    : dynamic_(o.loss_scale == StepOptions::LossScale::Dynamic),
      growth_factor_(o.growth_factor),
      backoff_factor_(o.backoff_factor),
      growth_interval_(o.growth_interval) {
  switch (o.loss_scale) {
    case StepOptions::LossScale::None:
      scale_ = 1.0;
      break;
    case StepOptions::LossScale::Static:
      scale_ = o.static_scale;
      break;
    case StepOptions::LossScale::Dynamic:
      scale_ = to_f32(o.init_scale);
      break;
  }
}

void LossScaler::update(bool found_nonfinite) {
  if (!dynamic_) return;
  if (found_nonfinite) {
    scale_ = to_f32(scale_ * backoff_factor_);
    growth_tracker_ = 0;
    return;
  }
  if (++growth_tracker_ == growth_interval_) {
    double grown = to_f32(scale_ * growth_factor_);
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  }
}

void LossScaler::restore(double scale, int64_t growth_tracker) {
  if (!dynamic_) internal_error("restore() on a scaler that is not dynamic");
  if (!std::isfinite(scale) || scale <= 0 || to_f32(scale) != scale)
    throw Error("loss scale " + pyfloat(scale) + " is not a positive float32 value");
  if (growth_tracker < 0 || growth_tracker >= growth_interval_)
    throw Error("growth tracker " + std::to_string(growth_tracker) + " is outside [0, " +
                std::to_string(growth_interval_) + ") (growth_interval of this optimizer)");
  scale_ = scale;
  growth_tracker_ = growth_tracker;
}

}  // namespace optfuse::optim
