#pragma once
// What step() does around the rule's update: gradient accumulation micro-steps, the read-only
// statistics pass (global norm, overflow check), the per-step grad_scale, the loss scaler, and
// their part of the state file.
//
// step() = plan_step -> (update, if planned: the optimizer's three phases) -> finish_step.
//   micro-steps 1..k-1: plan_step runs "grad_accum = grad" (1) or "grad_accum += grad" (2..k-1)
//                       through the Engine and plans no update;
//   the k-th (or every step when k = 1): plan_step runs the statistics pass when clipping or
//                       loss scaling is on, changes nothing, and either plans the update with
//                       grad_scale = clip_coef / (S * k_mean), or a skip (non-finite gradient with
//                       loss scaling); finish_step then updates the scaler and ends the cycle.
// A skipped step discards the whole accumulation cycle (as torch's zero_grad after a skipped
// GradScaler step): the next step() starts a new one.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "optfuse/engine.h"
#include "optfuse/optim.h"
#include "optim/grad_prologue.h"
#include "optim/grad_stats.h"
#include "optim/scaler.h"
#include "optim/step_options.h"

namespace optfuse::optim {

struct OptimizerState;  // optimizer_state.h
struct StepRunner;      // step_round.h

struct StepControl {
  StepOptions options;
  LossScaler scaler;
  int64_t micro = 0;      // micro-steps accumulated in the current cycle, 0..k-1
  double grad_scale = 1;  // the update kernel's "grad_scale" for the step being run
  // Per gradient dtype: resolved at the first micro-step / update that needs them.
  std::map<DType, std::shared_ptr<const Kernel>> acc_init, acc_add, stats;
  StatsRound stats_round;  // the statistics pass's scratch (grad_stats.h)

  explicit StepControl(const StepOptions& o = {}) : options(o), scaler(o) {}
  GradPrologue prologue() const;
};

struct StepPlan {
  bool update = false;           // run the rule's update now
  bool found_nonfinite = false;  // skip: a gradient holds inf or nan (loss scaling on)
  StepResult result;
};

// (The micro-steps and the statistics pass run on the step runner's threads.)
StepPlan plan_step(OptimizerState& impl, StepRunner& runner);
StepResult finish_step(OptimizerState& impl, const StepPlan& plan);

// Error if a group cannot be added now (in the middle of an accumulation cycle).
void check_can_add_group(const OptimizerState& impl, const std::string& where);

// The state file's "step" section; absent (null) when no step option is set.
Options save_step_state(const OptimizerState& impl);
// Checks a file's "step" section (null if the file has none) against `impl`; has_accum[g][t]
// says whether the file holds tensor t of group g's "grad_accum" buffer. Returns the control to
// install. Throws Error (the caller adds the file name).
StepControl load_step_state(const OptimizerState& impl, const Options& step,
                            const std::vector<std::vector<bool>>& has_accum);

}  // namespace optfuse::optim
