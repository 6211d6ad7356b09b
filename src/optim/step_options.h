#pragma once
// Step-level options: global-norm gradient clipping, loss scaling and gradient accumulation.
// They are optimizer-wide (they look at the gradients of ALL groups at once), so they live in the
// optimizer config next to "type", never in a group's overrides:
//
//   "max_grad_norm": 1.0            torch.nn.utils.clip_grad_norm_(max_norm=1.0) before each update
//   "norm_type": 2 | "inf"          default 2 (JSON has no inf: the string "inf")
//   "error_if_nonfinite": false     as torch: throw (changing nothing) when the total norm is
//   inf/nan "loss_scale": "dynamic" | S     grads arrive multiplied by S; dynamic =
//   torch.cuda.amp.GradScaler "init_scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5,
//   "growth_interval": 2000
//                                   GradScaler's arguments (only with "loss_scale": "dynamic")
//   "accumulation_steps": k         apply the update every k-th step() (optax MultiSteps)
//   "accumulation": "mean" | "sum"  what the k micro-batch gradients become (default "mean")
#include <cstdint>
#include <string>

#include "optfuse/optim.h"

namespace optfuse::optim {

struct StepOptions {
  enum class LossScale { None, Static, Dynamic };

  double max_grad_norm = -1;  // < 0: no clipping
  bool norm_inf = false;      // norm_type inf (else 2)
  bool error_if_nonfinite = false;
  LossScale loss_scale = LossScale::None;
  double static_scale = 1;  // LossScale::Static
  double init_scale = 65536.0, growth_factor = 2.0, backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  int64_t accumulation_steps = 1;
  bool accumulation_mean = true;

  bool clipping() const { return max_grad_norm >= 0; }
  bool loss_scaling() const { return loss_scale != LossScale::None; }
  bool accumulating() const { return accumulation_steps > 1; }
  // A read-only statistics pass over the gradients precedes each update.
  bool needs_stats() const { return clipping() || loss_scaling(); }
  // Anything differs from a plain optimizer (state files then carry a "step" section).
  bool any() const { return clipping() || loss_scaling() || accumulating(); }

  // The options as the config spells them (only those set), for save files and messages.
  Options to_json() const;
};

// True for the names above.
bool is_step_option(const std::string& name);

// Moves the step options out of `config` (an optimizer config) into a validated StepOptions;
// Error with torch-like messages ("optimizer config: Invalid max_grad_norm: -1.0 ...").
StepOptions take_step_options(Options* config);

// Error if a group's overrides (or set()) name a step option: they are optimizer-wide.
void reject_step_options(const Options& overrides, const std::string& where);

}  // namespace optfuse::optim
