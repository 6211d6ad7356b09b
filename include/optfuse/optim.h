#pragma once
// Optimizers with torch.optim names, defaults and semantics, running fused JIT kernels.
//
//   optfuse::Engine engine;
//   auto opt = optfuse::Optimizer::create(engine, {{"type", "adamw"}, {"lr", 1e-3}});
//   opt->add_param_group({{w_ref, w_grad_ref}, ...}, {{"weight_decay", 0.1}});
//   opt->add_param_group({{b_ref, b_grad_ref}, ...}, {{"weight_decay", 0.0}});
//   for (...) { /* fill grads */ opt->step(); }
//
// Parameters and gradients are float32 host buffers owned by the caller; optimizer state
// (exp_avg, momentum_buffer, sum, ...) is owned by the optimizer, created lazily at the first step
// with torch's initial values (zeros; Adagrad's sum: initial_accumulator_value). One compiled kernel serves every tensor of every group whose update has
// the same STRUCTURE (e.g. AdamW without AMSGrad); hyperparameter values and sizes are call
// arguments, so changing lr between steps never recompiles.
//
// Step-level features (optimizer-wide: they go in the config of Optimizer::create, next to "type"):
//   global-norm clipping   {"max_grad_norm": 1.0, "norm_type": 2 | "inf", "error_if_nonfinite": false}
//                          torch.nn.utils.clip_grad_norm_ over ALL params of ALL groups, before
//                          every update: clip_coef = min(1, max_norm / (total_norm + 1e-6));
//   loss scaling           {"loss_scale": S}   grads arrive multiplied by a static S, or
//                          {"loss_scale": "dynamic", "init_scale": 65536.0, "growth_factor": 2.0,
//                           "backoff_factor": 0.5, "growth_interval": 2000} with
//                          torch.cuda.amp.GradScaler's rule; multiply the loss by loss_scale().
//                          A step whose gradients (any of any group) hold inf or nan is SKIPPED:
//                          no param or state byte changes, step counts stay, the scaler backs off,
//                          and step() reports it. (This takes precedence over error_if_nonfinite.)
//   gradient accumulation  {"accumulation_steps": k, "accumulation": "mean" | "sum"}
//                          (optax MultiSteps): step() calls 1..k-1 only accumulate the grads into
//                          an optimizer-owned buffer (state "grad_accum"); the k-th applies the
//                          update with the mean (or sum) of the k gradients. A skipped k-th step
//                          discards the cycle.
// They change only the gradient each rule sees, g_eff = (grad_accum + grad) * grad_scale, with
// grad_scale = clip_coef / (S * k if "mean") one host scalar per step: the scaling happens inside
// each optimizer's fused kernel. Clipping and the overflow check share ONE read-only pass over the
// gradients (sum of squares in double, and max |g| for the inf-norm), run before the update.
//
// Errors are optfuse::Error naming the group, tensor and value at fault; a rejected call changes
// nothing (no param, grad or state byte is written).
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "optfuse/engine.h"

namespace optfuse {

using Options = nlohmann::json;  // torch.optim option names -> values, e.g. {"lr": 1e-3}

// A float32 host tensor owned by the caller.
struct TensorRef {
  float* data = nullptr;
  int64_t numel = 0;
  std::vector<int64_t> shape;  // optional; when given, its product must equal numel
};

struct ParamRef {
  TensorRef param;
  TensorRef grad;
  std::string name;  // optional, used in messages
};

// Which optimizers exist and their defaults (torch.optim's), e.g. {"adamw": {...}, "sgd": {...}}.
std::vector<std::string> optimizer_types();
Options optimizer_defaults(const std::string& type);

// The update graph a parameter group runs: `config` as for Optimizer::create, `overrides` as for
// add_param_group (merged and validated the same way). For warming a cache without tensors.
// With step options in `config` it is the rule's graph with the grad prologue (grad_accum and/or
// grad_scale); the statistics and accumulation micro-step kernels are not included.
Graph update_graph(const Options& config, const Options& overrides = {});

// What one step() did.
struct StepResult {
  enum class Outcome {
    Applied,           // params and state were updated
    Accumulated,       // micro-step 1..k-1 of gradient accumulation: grads added to the buffer
    SkippedNonFinite,  // loss scaling on and some gradient held inf/nan: nothing changed
  };
  Outcome outcome = Outcome::Applied;
  int64_t micro_step = 1;  // which call of the accumulation cycle this was, 1..accumulation_steps
  // The statistics pass ran (clipping or loss scaling on) and total_norm holds its result:
  // clip_grad_norm_'s return value, the norm of the gradients the update uses (unscaled by S,
  // averaged when accumulating with "mean") over all groups; inf or nan when a gradient is.
  bool has_total_norm = false;
  double total_norm = 0;
  double clip_coef = 1;        // the clip factor applied (1 without clipping, or when not clipped)
  double loss_scale = 1;       // the S this step's gradients were divided by (1: no loss scaling)
  double next_loss_scale = 1;  // the S for the next backward, after the scaler's update
  bool applied() const { return outcome == Outcome::Applied; }
};

class Optimizer {
 public:
  // `config` holds "type" (torch.optim's class name in any case: "sgd", "adam", "adamw",
  // "adagrad", "rmsprop", "adamax", "nadam", "radam"; or "lion", which torch lacks) and
  // optional defaults for every group, e.g. {"type":"adamw","lr":1e-3,"betas":[0.9,0.999]}.
  static std::unique_ptr<Optimizer> create(Engine& engine, const Options& config);
  ~Optimizer();

  const std::string& type() const;

  // Adds a group; `overrides` replace the optimizer's defaults for this group only.
  // Rejects an empty group, null pointers, numel/shape mismatches, a grad that overlaps any
  // param, a tensor already in this or another group, and invalid hyperparameters.
  void add_param_group(const std::vector<ParamRef>& params, const Options& overrides = {});

  // One update of every parameter of every group (one fused kernel call per tensor), or one
  // accumulation micro-step, or a skipped step (see StepResult and the step-level features).
  StepResult step();

  // The loss scale S to multiply the next loss by (1 without loss scaling).
  double loss_scale() const;
  // The step-level options in effect, as the config spells them ({} when none).
  Options step_options() const;

  // Hyperparameters per group, validated as torch does (e.g. set(0, "lr", 3e-4)).
  void set(size_t group, const std::string& name, const Options& value);
  Options get(size_t group, const std::string& name) const;
  const Options& group_options(size_t group) const;
  size_t num_groups() const;
  size_t group_size(size_t group) const;

  // Points a parameter at a new gradient buffer (same numel; must not overlap any param).
  void set_grad(size_t group, size_t index, const TensorRef& grad);

  // Per-tensor state, as torch names it ("exp_avg", "momentum_buffer", "sum", "square_avg",
  // "grad_avg", "exp_inf", ...); null if absent. NAdam's scalar mu_product is kept on the host.
  const std::vector<float>* state(size_t group, size_t index, const std::string& name) const;
  int64_t step_count(size_t group, size_t index) const;

  // Writes / reads every group's options, step counts and state to a file (with the loss
  // scaler's state and, in the middle of an accumulation cycle, the accumulation buffers). load_state checks the
  // file (checksum, optimizer type, group and tensor sizes) before changing anything; a restored
  // optimizer continues bit-identically.
  void save_state(const std::string& path) const;
  void load_state(const std::string& path);

  // Which compiled kernels serve which groups and tensors ("lazy inline" made visible).
  struct KernelUse {
    std::string key;
    std::string name;
    int64_t groups = 0;
    int64_t tensors = 0;
    int64_t elements = 0;
  };
  std::vector<KernelUse> kernel_uses() const;

  // Bytes each step() reads plus writes (params, grads, state), for bandwidth figures.
  int64_t bytes_per_step() const;

  struct Impl;

 private:
  explicit Optimizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace optfuse
