#pragma once
// Optimizers with torch.optim names, defaults and semantics, running fused JIT kernels.
//
//   optfuse::Engine engine;
//   auto opt = optfuse::Optimizer::create(engine, {{"type", "adamw"}, {"lr", 1e-3}});
//   opt->add_param_group({{w_ref, w_grad_ref}, ...}, {{"weight_decay", 0.1}});
//   opt->add_param_group({{b_ref, b_grad_ref}, ...}, {{"weight_decay", 0.0}});
//   for (...) { /* fill grads */ opt->step(); }
//
// Parameters and gradients are buffers owned by the caller (f32, bf16, f16 or f64), in host memory,
// or in CUDA device memory for an engine with a CUDA target ("Device tensors" below); optimizer
// state (exp_avg, momentum_buffer, sum, ...) is owned by the optimizer, created lazily at the first
// step with torch's initial values (zeros; Adagrad's sum: initial_accumulator_value). One compiled
// kernel serves every tensor of every group whose update has the same STRUCTURE (e.g. AdamW without
// AMSGrad); hyperparameter values and sizes are call arguments, so changing lr between steps never
// recompiles.
//
// Step-level features (optimizer-wide: they go in the config of Optimizer::create, next to "type"):
//   global-norm clipping   {"max_grad_norm": 1.0, "norm_type": 2 | "inf", "error_if_nonfinite":
//   false}
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
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "optfuse/engine.h"

namespace optfuse {

using Options = nlohmann::json;  // torch.optim option names -> values, e.g. {"lr": 1e-3}

// A host tensor owned by the caller: `numel` elements of `dtype` at `data` (f32 by default, so
// TensorRef{float_ptr, n} is an f32 tensor; bf16 and f16 are raw 16-bit words, e.g. uint16_t).
//
// Mixed precision (any optimizer): a group's params may be bf16 or f16, its grads f32, bf16 or
// f16 (one param dtype and one grad dtype per group). f64 params (with f64 grads) are updated in
// f64 throughout, their state f64 ("state_dtype" stays "f32", meaning full precision), as torch
// steps float64 params. A 16-bit param gets an f32 master copy
// owned by the optimizer (state "master", made from the param's values at its first step and
// saved with the state); each step is ONE kernel pass that reads master and grad, computes in
// f32, and writes master, state and the param rounded to its dtype. Group options:
//   "state_dtype": "f32" | "bf16"    optimizer state stored in bf16 (computed in f32, stored RNE)
//                | "int8"            or as 8-bit codes with one f32 scale (the block's absmax) per
//                                    block: the rule's state of tensors of at least
//                                    "min_8bit_size" elements (default 4096; smaller ones keep
//                                    f32 state), in blocks of "block_size" (default 256, a
//                                    multiple of 16 up to 4096). Signed state (exp_avg, momentum)
//                                    uses a linear map, non-negative state (exp_avg_sq, ...) a
//                                    square-root one (docs/int8-state.md). One pass decodes,
//                                    updates in f32 and encodes: AdamW moves ~16 B/element
//                                    instead of 28. The codes are the state: save / load resume
//                                    bit-identically; state_ref() shows the u8 codes under the
//                                    state's name and the scales as "<name>.absmax". Not with
//                                    grad_centralization, updates that reduce (LAMB, LARS),
//                                    sparse gradients, master_weights false, or device tensors.
//   "master_weights": bool           default true. false: torch's way with 16-bit params (what
//                                    torch.optim.AdamW(fused=True) does): no master copy, the
//                                    kernel reads the param itself, the state is stored in the
//                                    param's dtype (bf16 or f16, whatever state_dtype says;
//                                    "bf16" with f16 params is an error), each value computed in
//                                    f32 and rounded once (RNE). AdamW bf16: 14 B/element instead
//                                    of 28 (20 with bf16 state). Adam and AdamW then give torch's
//                                    fused bits (its scalar tail, the last n mod 32 elements with
//                                    AVX-512, within one 16-bit ulp per step). Updates below half
//                                    a 16-bit ulp of the param are lost, which the master copy
//                                    keeps: the default suits training from scratch, false
//                                    matches torch runs and saves memory (and time: 0.7-0.8 of
//                                    its 14-byte ceiling, faster than torch's fused bf16 step;
//                                    bench/README.md).
//                                    No effect on f32 params; not yet on device tensors.
//   "stochastic_rounding": bool      bf16 params rounded stochastically instead of to nearest
//                                    even (unbiased; reproducible: same seed + step -> same bits)
//   "rounding_seed": integer         in [0, 2^32), the seed of those roundings
//
// Device tensors (CUDA): a TensorRef with memory = Memory::Cuda holds a CUdeviceptr in `data`
// (e.g. reinterpret_cast<void*>(torch_tensor.data_ptr())), valid in the engine's CUDA context
// (EngineOptions::cuda_context; by default device 0's primary context, where PyTorch allocates) and
// 16-byte aligned. See "Device tensors" at Optimizer below.
enum class Memory { Host, Cuda };
const char* memory_name(Memory m);  // "host" / "cuda"

struct TensorRef {
  void* data = nullptr;
  int64_t numel = 0;
  std::vector<int64_t> shape;  // optional; when given, its product must equal numel
  DType dtype = DType::F32;
  Memory memory = Memory::Host;  // where `data` lives
};

struct ParamRef {
  TensorRef param;
  TensorRef grad;
  std::string name;  // optional, used in messages
};

// Which optimizers exist and their defaults (torch.optim's), e.g. {"adamw": {...}, "sgd": {...}}.
std::vector<std::string> optimizer_types();
Options optimizer_defaults(const std::string& type);

// 8-bit state ("state_dtype": "int8", docs/int8-state.md) on the host: state `name`'s `n` f32
// values as u8 codes plus one f32 scale per block of `block` (ceil(n / block) of them), with
// the map the kernels use for that name, and back. For frameworks that keep the state
// themselves (bind_state) and convert it when a group's state_dtype or block_size changes.
void encode_8bit_state(const std::string& name, int64_t block, const float* values, int64_t n,
                       uint8_t* codes, float* scales);
void decode_8bit_state(const std::string& name, int64_t block, const uint8_t* codes,
                       const float* scales, int64_t n, float* values);

// Asks the OS for transparent huge pages in host memory at `data` not written yet (the whole
// 2 MiB pages inside the `bytes`): new state then faults in 2 MiB pages, 512 times fewer faults
// on its first write. Advice only: false where it was not taken (no huge pages here, no whole
// page inside), and nothing changed. For frameworks that make the state themselves (bind_state).
bool advise_huge_pages(void* data, size_t bytes);

// Whether the optimizer (C++ and optfuse.torch) advises a new state buffer of `bytes` it makes
// into huge pages: 4 MiB or more, and only with OPTFUSE_HUGE_PAGES=1 in the environment. Whether
// that pays depends on the host: on one 2-core VM GPT-2 small's first step took 0.2-0.3 s less with
// it, on another 0.5 s more, and later steps no faster (bench/README.md, "Huge pages for new
// state").
bool huge_pages_for_new_state(size_t bytes);

// The update graph a parameter group runs: `config` as for Optimizer::create, `overrides` as for
// add_param_group (merged and validated the same way). For warming a cache without tensors.
// `param` and `grad` are the group's tensor dtypes (mixed precision, see TensorRef). With step
// options in `config` it is the rule's graph with the grad prologue (grad_accum and/or
// grad_scale); the statistics and accumulation micro-step kernels are not included. `numel`
// is the tensor's size, which matters only with "state_dtype": "int8": a tensor of at least
// min_8bit_size elements runs the 8-bit graph, a smaller one the f32-state graph; 0 (the
// default) stands for a large tensor. `ndim` is its number of dims, which matters only for a
// rule with a factored update (Adafactor): tensors of 2 or more dims run that graph.
Graph update_graph(const Options& config, const Options& overrides = {}, DType param = DType::F32,
                   DType grad = DType::F32, int64_t numel = 0, int ndim = 1);

// ---- Custom optimizers ----------------------------------------------------------------------
// A user-defined update rule served exactly like the built-ins: its graph is normalized (idioms,
// host scalars: include/optfuse/idioms.h), compiled once per structure, cached, and called once
// per tensor. The graph reads:
//   * tensor inputs: one role-param input (the parameter), one role-grad input (its gradient),
//     and any role-state inputs (the optimizer's state, by those names, starting at zero);
//     all float32; outputs replace the param and state inputs, never the grad;
//   * scalars named after a hyperparameter in `defaults` (numbers, and bools as 1 / 0), or a
//     built-in: "step" (torch's state['step'], from 1), "beta1", "beta2", ... (the entries of
//     "betas") and "bias_correction1", "bias_correction2", ... (1 - betaK^step). Per-step scalar
//     formulas are written in the graph itself (e.g. sub(1, beta1), div(lr, bias_correction1)):
//     normalize() moves them to the host, computed in double, rounded once.
// Validation as torch's: numbers finite, lr >= 0, eps >= 0, weight_decay >= 0, 0 <= betas < 1.
struct CustomOptimizer {
  std::string type;  // the name for Optimizer::create's "type", e.g. "adan"
  Options defaults;  // every hyperparameter with its default, e.g. {"lr": 1e-3, "betas": [...]}
  std::function<Graph(const Options& group)> graph;  // the update for a group's options
  // Differs exactly when graph(group) would (one structure if unset).
  std::function<std::string(const Options& group)> structure;
};

// Makes `def.type` a type for Optimizer::create and update_graph. Error if the name is taken
// or the graph does not follow the rules above (checked with the defaults).
void register_optimizer(const CustomOptimizer& def);

// A custom optimizer from JSON: {"name": "lion", "defaults": {...}, "graph": <JSON graph,
// docs/graph-json.md>}. Optimizer::create also takes {"type": "custom", "rule": <this>, ...}.
CustomOptimizer custom_optimizer_from_json(const Options& def);

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

// Arguments of one step() beyond the optimizer's own state.
struct StepArgs {
  // Optimizers of CUDA engines: the CUstream the step's kernels (and the zero-fill of state created
  // at this step) are launched on, e.g. torch.cuda.current_stream().cuda_stream; null = the
  // context's default stream. The step returns once they are launched: synchronize the stream
  // before reading the params on the host. Must be null for a CPU engine's optimizer.
  void* cuda_stream = nullptr;
};

// Device tensors (optimizers of an engine whose target uses CUDA, e.g. "host-cuda"):
//
//   optfuse::EngineOptions eo;
//   eo.target = "host-cuda";                   // Error at creation without a driver and device
//   optfuse::Engine gpu(eo);
//   auto opt = optfuse::Optimizer::create(gpu, {{"type", "adamw"}, {"lr", 1e-3}});
//   auto dev = [](const at::Tensor& t) {       // e.g. a PyTorch CUDA tensor
//     return optfuse::TensorRef{t.data_ptr(), t.numel(), {}, optfuse::DType::F32,
//                               optfuse::Memory::Cuda};
//   };
//   opt->add_param_group({{dev(w), dev(w.grad())}});
//   optfuse::StepArgs args;
//   args.cuda_stream = at::cuda::getCurrentCUDAStream().stream();
//   opt->step(args);                           // launched on that stream; nothing copied
//
//   * every param and grad is a device tensor (TensorRef::memory = Memory::Cuda) and a CPU
//     engine's optimizer takes host tensors only; the group, tensor and memory at fault are named
//     otherwise (also for mixing host and device tensors in one optimizer);
//   * state is allocated on the device (cuMemAlloc in the engine's context, filled with its
//     initial value by cuMemset*Async on the step's stream; an f16 param's f32 master copy made
//     from it by a kernel on that stream) at the first step, freed with the optimizer (after
//     cuCtxSynchronize); step() passes device pointers to the kernels on StepArgs::cuda_stream
//     and makes no host<->device copy (state(), state_bf16() are null: see state_ref,
//     state_values);
//   * a pointer labelled Memory::Cuda that the driver does not know as device memory (e.g. a host
//     pointer) is an Error at add_param_group / set_grad, not a fault inside a kernel;
//   * save_state / load_state / state_values copy state explicitly between the device and the
//     host, after waiting for all work in the engine's context (cuCtxSynchronize); the file format
//     is the same, so state saved on a GPU loads on the CPU and back;
//   * not yet on device tensors (Error at create / add_param_group / set naming the feature, all
//     in src/optim/device_support.cpp): anything that needs a reduction kernel (clipping, loss
//     scaling, gradient centralization, LAMB, LARS, Adafactor, custom rules with reductions) and
//     row-sparse gradients (sparseadam / lazyadam). Gradient accumulation (its buffers on the
//     device), bf16 and f16 params (master copies made by a kernel on the device), "state_dtype":
//     "bf16" (bf16 stores as integer rounding in the lowering, src/lower/bf16.h) and bf16 / f16
//     grads work as on the CPU (compiled and assembled for sm_80 / sm_90; not yet run on a GPU).
class Optimizer {
 public:
  // `config` holds "type" (torch.optim's class name in any case: "sgd", "adam", "adamw",
  // "adagrad", "rmsprop", "adamax", "nadam", "radam", "adadelta", "asgd", "rprop", "adafactor"
  // (its params of two or more dims factor their second moment over their last two dims: give
  // TensorRef::shape; without one a param is a vector), "muon" (see NewtonSchulz below); or one
  // torch lacks: "lion", "lamb" (apex FusedLAMB), "lars" (torchlars over SGD), whose trust
  // ratios come from per-tensor norms reduced in the same kernel) and optional defaults for every
  // group, e.g. {"type":"adamw","lr":1e-3,"betas":[0.9,0.999]}.
  static std::unique_ptr<Optimizer> create(Engine& engine, const Options& config);
  ~Optimizer();

  const std::string& type() const;

  // Adds a group; `overrides` replace the optimizer's defaults for this group only.
  // Rejects an empty group, null pointers, numel/shape mismatches, a grad that overlaps any
  // param, a tensor already in this or another group, and invalid hyperparameters; unsupported
  // dtypes, and params (or grads) of different dtypes in one group.
  void add_param_group(const std::vector<ParamRef>& params, const Options& overrides = {});
  // Error unless add_param_group would take a group with these overrides (merged with the
  // defaults and validated as it does, e.g. a bad state_dtype); needs no tensors, changes nothing.
  void check_group_options(const Options& overrides) const;

  // One update of every parameter of every group (one fused kernel call per tensor), or one
  // accumulation micro-step, or a skipped step (see StepResult and the step-level features).
  StepResult step();
  StepResult step(const StepArgs& args);  // the same, with a CUDA stream (device tensors)

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
  // "grad_avg", "exp_inf", "ax", "prev", ...); null if absent. Scalars torch keeps per tensor
  // (NAdam's mu_product, ASGD's eta and mu) are kept on the host (bind_scalar).
  // f32 state only (the master copy of a 16-bit param is "master"); bf16 state (state_dtype
  // "bf16", or bf16 params without master weights) is in state_bf16() as raw bits, f16 state (f16
  // params without master weights) in state_ref() only, and state_values() widens any to f32
  // (8-bit state decoded with its scales).
  const std::vector<float>* state(size_t group, size_t index, const std::string& name) const;
  const std::vector<uint16_t>* state_bf16(size_t group, size_t index,
                                          const std::string& name) const;
  // Any state buffer as a TensorRef: host or device memory (as the params), the param's shape
  // (8-bit state's scales: 1-D, one per block), the state's dtype; data null when absent. For
  // device tensors state() and state_bf16() are null, and state_values() copies the state to the
  // host (after cuCtxSynchronize).
  std::vector<float> state_values(size_t group, size_t index, const std::string& name) const;
  TensorRef state_ref(size_t group, size_t index, const std::string& name) const;
  int64_t step_count(size_t group, size_t index) const;

  // ---- Caller-owned state (for frameworks that keep the state themselves) -----------------
  // The Python package keeps torch's `optimizer.state` as the one copy of the state: its tensors
  // are bound here and updated in place by the kernels, so torch's state_dict() and
  // load_state_dict() (and wrappers that use them, such as ZeroRedundancyOptimizer) just work.
  //
  //   for (const StateSpec& s : opt->state_spec(g, i))    // after add_param_group / set()
  //     opt->bind_state(g, i, s.name, my_buffer_for(s), /*fresh=*/true);
  //   opt->bind_scalar(g, i, "step", TensorRef{&my_step, 1});   // torch's f32 state['step']
  //
  // A buffer the step needs that is not bound is created and owned by the optimizer as usual.
  // save_state / load_state refuse an optimizer with caller-owned state (its owner saves it).
  struct StateSpec {
    std::string name;  // torch's state name ("exp_avg", ...; "master" for 16-bit params)
    DType dtype;       // the buffer's dtype (state_dtype, or the param's without master
                       // weights; f32 for "master")
    double initial;    // the value a new buffer holds (rounded to dtype once)
    bool from_param;   // a new buffer holds the param's values instead (the master copy)
    int64_t numel;     // its elements: the param's, or for 8-bit state's scales ("<name>.absmax")
                       // one per block, for Adafactor's row_var (col_var) one per row (column)
                       // of each matrix of the param's last two dims; 0 in the group's spec,
                       // which knows no tensor
    // Its shape, as torch keeps it: the param's; Adafactor's row_var and col_var the param's
    // with the last (second-to-last) dim 1; 8-bit scales {numel}. Empty in the group's spec.
    std::vector<int64_t> shape;
  };
  // The buffers the next step of `group` reads and writes, for its current options and dtypes
  // (it changes when set() changes the structure). It compiles nothing and does not wait: the
  // buffers come from the update graph's signature, and where the group's kernels are new they
  // start compiling on a thread of their own, which the next step waits for (so a caller makes
  // its buffers while they compile). A compile's Error surfaces at that step, before any write.
  // With state_dtype "int8" a tensor of at least min_8bit_size elements has other buffers than
  // the group's: the u8 codes under the state's name and its f32 scales, "<name>.absmax", with
  // one value per block; the per-tensor spec says which.
  std::vector<StateSpec> state_spec(size_t group) const;
  std::vector<StateSpec> state_spec(size_t group, size_t index) const;
  // Tensor `index` of `group` reads and writes `name` in `buffer` from the next step on (the
  // tensor's spec's numel and dtype, the param's memory; 8-bit codes and their scales are bound
  // together; the caller keeps it alive and must not touch it during step()). `fresh`: the buffer
  // holds a new state's initial values, so the next step treats the state as created now (SGD's
  // first momentum step copies the gradient).
  void bind_state(size_t group, size_t index, const std::string& name, const TensorRef& buffer,
                  bool fresh);
  // A per-tensor scalar kept in one element of caller memory (f32 or f64, host): "step" (read
  // before and written after each update, as torch's state['step']) or host state a rule keeps
  // (NAdam's "mu_product", ASGD's "eta" and "mu"). Error for other names.
  void bind_scalar(size_t group, size_t index, const std::string& name, const TensorRef& value);

  // Writes / reads every group's options, step counts and state to a file (with the loss
  // scaler's state and, in the middle of an accumulation cycle, the accumulation buffers).
  // load_state checks the file (checksum, optimizer type, group and tensor sizes) before changing
  // anything; a restored optimizer continues bit-identically.
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
  // dtype; a 16-bit param is written but not read), for bandwidth figures: one pass over each.
  // (Updates that reduce read some of them again: LAMB and LARS their inputs for the norms,
  // Adafactor its grad three times and its param twice.)
  int64_t bytes_per_step() const;

  struct Impl;

 private:
  explicit Optimizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Muon ({"type": "muon"}, torch.optim.Muon) runs two fused kernels per tensor with its
// orthogonalization between them: the opaque op "newton_schulz:<constants>" (engine.h), which
// sees the update as the [shape[0], numel / shape[0]] matrix. Every engine serves it with a CBLAS
// library loaded at first use (libopenblas.so.0, libblas.so.3 or libcblas.so.3; an Error naming
// them if none loads). To run it elsewhere (torch's matmuls, a GPU), register an implementation
// for "newton_schulz" with OpaqueScope::Matrix before the first Muon step; it reads the constants
// of its call from OpaqueCall::callee.
struct NewtonSchulz {
  double a = 3.4445, b = -4.775, c = 2.0315;  // X <- a X + (b A + c A^2) X, A = X X^T
  int steps = 5;                              // iterations
  double eps = 1e-7;                          // X starts as G / max(|G|_F, eps)
  // Every product is rounded to bf16, as torch's bf16 matrices are. false: the products of bf16
  // matrices (torch's own ops, so its bits, where an implementation has them); true: f32
  // products of the same bf16 values, rounded once (the sums in another order: within bf16
  // rounding of torch's, and much faster where the BLAS has no fast bf16 products). The CBLAS
  // implementation always does the latter.
  bool f32_products = false;
};
// The opaque op's callee for `ns`, and its inverse (an Error naming a callee it cannot read).
std::string newton_schulz_callee(const NewtonSchulz& ns);
NewtonSchulz parse_newton_schulz(std::string_view callee);
// The implementation a Muon optimizer gives its engine when "newton_schulz" has none: torch's
// iteration (bf16 products, src/optim/newton_schulz.h) on the CBLAS library; any float dtype.
OpaqueFn newton_schulz_cblas();

}  // namespace optfuse
