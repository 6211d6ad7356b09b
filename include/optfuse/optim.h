#pragma once
// Optimizers with torch.optim names, defaults and semantics, running fused JIT kernels.
//
//   optfuse::Engine engine;
//   auto opt = optfuse::Optimizer::create(engine, {{"type", "adamw"}, {"lr", 1e-3}});
//   opt->add_param_group({{w_ref, w_grad_ref}, ...}, {{"weight_decay", 0.1}});
//   opt->add_param_group({{b_ref, b_grad_ref}, ...}, {{"weight_decay", 0.0}});
//   for (...) { /* fill grads */ opt->step(); }
//
// Parameters and gradients are host buffers owned by the caller (f32, bf16 or f16); optimizer state
// (exp_avg, momentum_buffer, sum, ...) is owned by the optimizer, created lazily at the first step
// with torch's initial values (zeros; Adagrad's sum: initial_accumulator_value). One compiled kernel serves every tensor of every group whose update has
// the same STRUCTURE (e.g. AdamW without AMSGrad); hyperparameter values and sizes are call
// arguments, so changing lr between steps never recompiles.
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

// A host tensor owned by the caller: `numel` elements of `dtype` at `data` (f32 by default, so
// TensorRef{float_ptr, n} is an f32 tensor; bf16 and f16 are raw 16-bit words, e.g. uint16_t).
//
// Mixed precision (any optimizer): a group's params may be bf16 or f16, its grads f32, bf16 or
// f16 (one param dtype and one grad dtype per group). A 16-bit param gets an f32 master copy
// owned by the optimizer (state "master", made from the param's values at its first step and
// saved with the state); each step is ONE kernel pass that reads master and grad, computes in
// f32, and writes master, state and the param rounded to its dtype. Group options:
//   "state_dtype": "f32" | "bf16"    optimizer state stored in bf16 (computed in f32, stored RNE)
//   "stochastic_rounding": bool      bf16 params rounded stochastically instead of to nearest
//                                    even (unbiased; reproducible: same seed + step -> same bits)
//   "rounding_seed": integer         in [0, 2^32), the seed of those roundings
struct TensorRef {
  void* data = nullptr;
  int64_t numel = 0;
  std::vector<int64_t> shape;  // optional; when given, its product must equal numel
  DType dtype = DType::F32;
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
// `param` and `grad` are the group's tensor dtypes (mixed precision, see TensorRef).
Graph update_graph(const Options& config, const Options& overrides = {},
                   DType param = DType::F32, DType grad = DType::F32);

class Optimizer {
 public:
  // `config` holds "type" (torch.optim's class name in any case: "sgd", "adam", "adamw",
  // "adagrad", "rmsprop", "adamax", "nadam", "radam"; or one torch lacks: "lion", "lamb" (apex
  // FusedLAMB), "lars" (torchlars over SGD), whose trust ratios come from per-tensor norms
  // reduced in the same kernel) and
  // optional defaults for every group, e.g. {"type":"adamw","lr":1e-3,"betas":[0.9,0.999]}.
  static std::unique_ptr<Optimizer> create(Engine& engine, const Options& config);
  ~Optimizer();

  const std::string& type() const;

  // Adds a group; `overrides` replace the optimizer's defaults for this group only.
  // Rejects an empty group, null pointers, numel/shape mismatches, a grad that overlaps any
  // param, a tensor already in this or another group, and invalid hyperparameters; unsupported
  // dtypes, and params (or grads) of different dtypes in one group.
  void add_param_group(const std::vector<ParamRef>& params, const Options& overrides = {});

  // One update of every parameter of every group (one fused kernel call per tensor).
  void step();

  // Hyperparameters per group, validated as torch does (e.g. set(0, "lr", 3e-4)).
  void set(size_t group, const std::string& name, const Options& value);
  Options get(size_t group, const std::string& name) const;
  const Options& group_options(size_t group) const;
  size_t num_groups() const;
  size_t group_size(size_t group) const;

  // Row-sparse gradient (only "sparseadam" / "lazyadam", like torch.optim.SparseAdam; other
  // optimizers throw "... does not support sparse gradients"). The param is viewed as
  // [rows, row_len] with row_len = numel / shape[0] (1 when it has no shape); `rows` names the
  // rows present (any order, each at most once: coalesce first), `values` holds their f32
  // gradients packed row after row (rows.size() * row_len elements, caller-owned, read at each
  // step until replaced). A step updates only those rows of param, exp_avg and exp_avg_sq, at a
  // cost proportional to the rows touched. Sparse-gradient optimizers take ParamRefs whose grad
  // is {nullptr, any numel} and reject dense gradients.
  void set_sparse_grad(size_t group, size_t index, const std::vector<int64_t>& rows,
                       const TensorRef& values);

  // Points a parameter at a new gradient buffer (same numel and dtype; must not overlap any param).
  void set_grad(size_t group, size_t index, const TensorRef& grad);

  // Per-tensor state, as torch names it ("exp_avg", "momentum_buffer", "sum", "square_avg",
  // "grad_avg", "exp_inf", ...); null if absent. NAdam's scalar mu_product is kept on the host.
  // f32 state only (the master copy of a 16-bit param is "master"); bf16 state (state_dtype
  // "bf16") is in state_bf16() as raw bits, and state_values() widens either kind to f32.
  const std::vector<float>* state(size_t group, size_t index, const std::string& name) const;
  const std::vector<uint16_t>* state_bf16(size_t group, size_t index, const std::string& name) const;
  std::vector<float> state_values(size_t group, size_t index, const std::string& name) const;
  int64_t step_count(size_t group, size_t index) const;

  // Writes / reads every group's options, step counts and state to a file. load_state checks the
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

  // Bytes each step() reads plus writes (params, grads, state, master copies, each in its own
  // dtype; a 16-bit param is written but not read), for bandwidth figures.
  int64_t bytes_per_step() const;

  struct Impl;

 private:
  explicit Optimizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace optfuse
