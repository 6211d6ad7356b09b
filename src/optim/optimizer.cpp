// Optimizer: parameter groups, validation, and step() as three phases so that a failure changes
// nothing: (1) resolve every group's plan and wait for its kernels (compiling since the plan was
// made), (2) allocate missing state, (3) run.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <utility>

#include "optfuse/error.h"
#include "optim/config.h"
#include "optim/device_support.h"
#include "optim/optimizer_state.h"
#include "optim/options.h"
#include "optim/state_buffers.h"
#include "optim/step_round.h"
#include "optim/tensor_checks.h"

namespace optfuse {

// What an Optimizer holds (optimizer_state.h) and what runs its steps (step_round.h): the other
// files of src/optim work on the state alone.
struct Optimizer::Impl : optim::OptimizerState {
  optim::StepRunner runner;
};

using Impl = Optimizer::Impl;
using optim::all_spans;
using optim::check_gc_shapes;
using optim::check_overlaps;
using optim::check_tensor;
using optim::Span;
using optim::span_of;

std::string optim::OptimizerState::where(size_t group, size_t index, const ParamRef& ref) {
  std::string s = where(group) + ", tensor " + std::to_string(index);
  if (!ref.name.empty()) s += " ('" + ref.name + "')";
  return s;
}

void optim::resolve_plan(optim::OptimizerState& impl, Impl::Group& g, size_t group) {
  const optim::Precision precision = optim::group_precision(g, group);
  const optim::GradPrologue prologue = impl.control.prologue();
  const optim::GroupPlan* plan = g.plan();
  const bool checked = plan && g.plan_options == g.options && plan->recipe.precision == precision &&
                       plan->recipe.prologue.accumulated == prologue.accumulated &&
                       plan->recipe.prologue.scaled == prologue.scaled;
  if (checked) return;
  // Options changed (a scheduler's lr, or a structural flag): a new plan only if the structure
  // did, so that a value the kernel takes as a scalar builds no graph and recompiles nothing.
  optim::GraphRecipe recipe{impl.rule.get(), g.options, precision, prologue};
  if (!plan || !optim::same_structure(*plan, recipe)) {
    auto made = optim::plan_group(*impl.engine, std::move(recipe), Impl::where(group));
    std::vector<optim::TensorShape> shapes;
    for (const auto& t : g.tensors) shapes.push_back({t.ref.param.numel, t.ref.param.shape.size()});
    // Every tensor is bound to the new binding at the next step (Tensor::bound).
    g.binding = std::make_shared<optim::GroupBinding>(*impl.engine, std::move(made), shapes,
                                                      impl.memory == Memory::Host);
  }
  g.plan_options = g.options;
}

namespace {

// Each kernel input's state buffer for `t` (Tensor::inputs), once its state is complete.
void bind_state(Impl::Tensor& t, const Impl::Group& g) {
  const KernelSignature& sig = g.plan_of(t).signature;
  t.inputs.assign(sig.inputs.size(), nullptr);
  for (size_t i = 0; i < sig.inputs.size(); ++i)
    if (sig.inputs[i].role == Role::State || sig.inputs[i].role == Role::RowState ||
        sig.inputs[i].role == Role::ColState)
      t.inputs[i] = optim::state_pointer(t, sig.inputs[i].name, sig.inputs[i].dtype);
  t.bound = g.binding;
}

std::string no_dense_grads(const std::string& type) {
  return type + " does not support dense gradients, please consider Adam instead (give " +
         "row-sparse gradients with Optimizer::set_sparse_grad; the ParamRef's grad data stays " +
         "null)";
}

}  // namespace

Optimizer::Optimizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Optimizer::~Optimizer() {
  // Device state is freed with the Impl: not while a step queued on the caller's stream still
  // uses it (cuMemFree does not promise to wait for other streams).
  if (impl_->memory != Memory::Cuda || !impl_->cuda_context) return;
  for (const auto& g : impl_->groups)
    for (const auto& t : g.tensors)
      if (std::any_of(t.state.begin(), t.state.end(), [](const auto& s) {
            return s.second.kind() == optim::StateBuffer::Kind::Device;
          })) {
        try {
          optim::synchronize(impl_->cuda_context);
        } catch (...) {  // a destructor cannot report it; the memory is freed all the same
        }
        return;
      }
}

std::unique_ptr<Optimizer> Optimizer::create(Engine& engine, const Options& config) {
  optim::ParsedConfig parsed = optim::parse_config(config);
  auto impl = std::make_unique<Impl>();
  impl->engine = &engine;
  impl->memory = optim::engine_memory(engine);
  // (Null for a compile-only engine: it has no context, and its optimizers never run.)
  impl->cuda_context = engine.options().compile_only ? nullptr : engine.options().cuda_context;
  optim::check_device_config(impl->memory, *parsed.rule, parsed.step);
  optim::check_device_group(impl->memory, *parsed.rule, parsed.defaults, "optimizer config");
  for (const auto& op : parsed.rule->default_opaques())
    engine.register_default_opaque(op.callee, op.fn, op.scope);
  impl->rule = std::move(parsed.rule);
  impl->control = optim::StepControl(parsed.step);
  impl->defaults = std::move(parsed.defaults);
  return std::unique_ptr<Optimizer>(new Optimizer(std::move(impl)));
}

const std::string& Optimizer::type() const { return impl_->rule->type(); }
size_t Optimizer::num_groups() const { return impl_->groups.size(); }

Impl::Group& optim::group_at(optim::OptimizerState& impl, size_t group) {
  if (group >= impl.groups.size())
    throw Error("param group " + std::to_string(group) + " does not exist (there are " +
                std::to_string(impl.groups.size()) + ")");
  return impl.groups[group];
}

size_t Optimizer::group_size(size_t group) const {
  return optim::group_at(*impl_, group).tensors.size();
}
const Options& Optimizer::group_options(size_t group) const {
  return optim::group_at(*impl_, group).options;
}

// The options of a new group with `overrides`, merged and validated; Error naming `where`.
static Options new_group_options(const Impl& impl, const Options& overrides,
                                 const std::string& where) {
  optim::reject_step_options(overrides, where);
  Options options = optim::merge(impl.defaults, overrides, impl.rule->type(), where);
  impl.rule->validate(options, where);
  optim::validate_precision(options, where);
  optim::check_device_group(impl.memory, *impl.rule, options, where);
  return options;
}

void Optimizer::check_group_options(const Options& overrides) const {
  new_group_options(*impl_, overrides, Impl::where(impl_->groups.size()));
}

void Optimizer::add_param_group(const std::vector<ParamRef>& params, const Options& overrides) {
  size_t gi = impl_->groups.size();
  std::string where = Impl::where(gi);
  if (params.empty()) throw Error(where + ": optimizer got an empty parameter list");
  optim::check_can_add_group(*impl_, where);
  Impl::Group g;
  g.options = new_group_options(*impl_, overrides, where);
  for (size_t ti = 0; ti < params.size(); ++ti) {
    const ParamRef& r = params[ti];
    std::string who = Impl::where(gi, ti, r);
    check_tensor(r.param, "param", who);
    if (impl_->rule->sparse_grads()) {
      if (r.grad.data != nullptr || r.grad.dtype != DType::F32)  // its numel is ignored
        throw Error(who + ": " + no_dense_grads(impl_->rule->type()));
    } else {
      check_tensor(r.grad, "grad", who);
    }
    if (!impl_->rule->sparse_grads() && r.grad.numel != r.param.numel)
      throw Error(who + ": grad has " + std::to_string(r.grad.numel) + " elements but param has " +
                  std::to_string(r.param.numel));
    g.tensors.emplace_back();
    g.tensors.back().ref = r;
    g.tensors.back().stream = optim::tensor_stream(gi, ti);
  }
  optim::check_group_memory(params, impl_->groups.empty() ? nullptr : &impl_->memory, impl_->memory,
                            impl_->engine->target_string(),
                            [&](size_t ti) { return Impl::where(gi, ti, params[ti]); });
  for (size_t ti = 0; ti < params.size(); ++ti) {
    optim::check_device_pointer(impl_->cuda_context, params[ti].param, "param",
                                Impl::where(gi, ti, params[ti]));
    optim::check_device_pointer(impl_->cuda_context, params[ti].grad, "grad",
                                Impl::where(gi, ti, params[ti]));
  }
  optim::check_device_params(impl_->memory, optim::tensors_precision(g.options, params, gi).param,
                             where);
  std::vector<Span> spans = all_spans(impl_->groups);
  for (size_t ti = 0; ti < g.tensors.size(); ++ti) {
    const ParamRef& r = g.tensors[ti].ref;
    spans.push_back(span_of(r.param, true, Impl::where(gi, ti, r)));
    spans.push_back(span_of(r.grad, false, Impl::where(gi, ti, r)));
  }
  check_overlaps(std::move(spans));
  check_gc_shapes(g.options, g.tensors, gi);
  impl_->groups.push_back(std::move(g));
  impl_->params.add_group(params, gi);
}

// `who`'s new gradient (or sparse gradient values) against every param.
static void check_grad_disjoint(const Impl& impl, const TensorRef& grad, const std::string& who) {
  impl.params.check_disjoint(grad, who, [&](size_t gi, size_t ti) {
    return Impl::where(gi, ti, impl.groups[gi].tensors[ti].ref);
  });
}

void Optimizer::set(size_t group, const std::string& name, const Options& value) {
  Impl::Group& g = optim::group_at(*impl_, group);
  optim::reject_step_options(Options{{name, value}}, Impl::where(group));
  Options merged =
      optim::merge(g.options, Options{{name, value}}, impl_->rule->type(), Impl::where(group));
  impl_->rule->validate(merged, Impl::where(group));
  optim::validate_precision(merged, Impl::where(group));
  optim::check_device_group(impl_->memory, *impl_->rule, merged, Impl::where(group));
  optim::group_precision(merged, g, group);  // e.g. stochastic_rounding on f32 params
  check_gc_shapes(merged, g.tensors, group);
  g.options = std::move(merged);  // a structural change is picked up at the next step
}

Options Optimizer::get(size_t group, const std::string& name) const {
  const Impl::Group& g = optim::group_at(*impl_, group);
  auto it = g.options.find(name);
  if (it == g.options.end())
    throw Error(Impl::where(group) + ": unknown option '" + name + "' for " + impl_->rule->type());
  return *it;
}

void Optimizer::set_grad(size_t group, size_t index, const TensorRef& grad) {
  Impl::Group& g = optim::group_at(*impl_, group);
  if (index >= g.tensors.size())
    throw Error(Impl::where(group) + ": tensor " + std::to_string(index) + " does not exist");
  Impl::Tensor& t = g.tensors[index];
  std::string who = Impl::where(group, index, t.ref);
  if (impl_->rule->sparse_grads()) throw Error(who + ": " + no_dense_grads(impl_->rule->type()));
  check_tensor(grad, "grad", who);
  optim::check_grad_memory(grad, impl_->memory, who);
  optim::check_device_pointer(impl_->cuda_context, grad, "grad", who);
  if (grad.dtype != t.ref.grad.dtype)
    throw Error(who + ": the new grad's dtype " + std::string(dtype_name(grad.dtype)) +
                " differs from the group's grad dtype " +
                std::string(dtype_name(t.ref.grad.dtype)));
  if (grad.numel != t.ref.param.numel)
    throw Error(who + ": grad has " + std::to_string(grad.numel) + " elements but param has " +
                std::to_string(t.ref.param.numel));
  check_grad_disjoint(*impl_, grad, who);
  t.ref.grad = grad;
}

void Optimizer::set_sparse_grad(size_t group, size_t index, const std::vector<int64_t>& rows,
                                const TensorRef& values) {
  Impl::Group& g = optim::group_at(*impl_, group);
  if (index >= g.tensors.size())
    throw Error(Impl::where(group) + ": tensor " + std::to_string(index) + " does not exist");
  Impl::Tensor& t = g.tensors[index];
  std::string who = Impl::where(group, index, t.ref);
  if (!impl_->rule->sparse_grads())
    throw Error(who + ": " + impl_->rule->type() + " does not support sparse gradients (use " +
                "sparseadam / lazyadam, or a dense gradient)");
  optim::SparseGrad sparse = optim::make_sparse_grad(t.ref.param, rows, values, who);
  if (values.numel > 0) check_grad_disjoint(*impl_, values, who);
  t.sparse = std::move(sparse);
}

// Every tensor of a sparse-gradient optimizer has its gradient.
static void check_sparse_grads(const Impl& impl) {
  if (!impl.rule->sparse_grads()) return;
  for (size_t gi = 0; gi < impl.groups.size(); ++gi)
    for (size_t ti = 0; ti < impl.groups[gi].tensors.size(); ++ti)
      if (!impl.groups[gi].tensors[ti].sparse.set)
        throw Error(Impl::where(gi, ti, impl.groups[gi].tensors[ti].ref) +
                    ": no sparse gradient was given (set_sparse_grad); " +
                    no_dense_grads(impl.rule->type()));
}

// The rule's update of every tensor, with this step's grad_scale (impl.control).
static void update(Impl& impl) {
  Impl* const impl_ = &impl;
  // Phase 1: kernels (compilation errors surface here, before any write; a binding compiles on
  // a thread of its own from when it is made, group_binding.h).
  for (size_t gi = 0; gi < impl_->groups.size(); ++gi)
    optim::resolve_plan(*impl_, impl_->groups[gi], gi);
  for (auto& g : impl_->groups) {
    try {
      g.kernels();
    } catch (...) {
      g.binding.reset();  // the next step plans and compiles again
      throw;
    }
  }

  // Phase 2: state (and master copies), allocated completely before any is installed.
  std::vector<optim::PendingState> pending;
  for (size_t gi = 0; gi < impl_->groups.size(); ++gi)
    for (size_t ti = 0; ti < impl_->groups[gi].tensors.size(); ++ti) {
      Impl::Group& g = impl_->groups[gi];
      Impl::Tensor& t = g.tensors[ti];
      if (t.bound == g.binding) continue;  // complete since the group's binding was made
      const std::string who = Impl::where(gi, ti, t.ref);
      if (impl_->memory == Memory::Cuda)
        optim::plan_device_state(*impl_, g, t, who, &pending);
      else
        optim::plan_state(*impl_->rule, g, t, who, &pending);
    }
  std::vector<const Impl::Tensor*> created;
  for (auto& g : impl_->groups)
    for (auto& t : g.tensors)
      if (t.bound_fresh) created.push_back(&t);
  for (auto& p : pending) {
    // A converted buffer (state_dtype changed) or a master copy is not new state for the rule.
    bool fresh = !p.tensor->state.count(p.name) && p.name != optim::kMasterState;
    optim::install(p);
    if (fresh) created.push_back(p.tensor);
  }
  for (auto& g : impl_->groups)
    for (auto& t : g.tensors)
      if (t.bound != g.binding) {
        // Without master weights the param is the value: a copy kept from before would be stale
        // if master weights were turned on again.
        if (auto m = t.state.find(optim::kMasterState); g.plan()->recipe.precision.unmastered() &&
                                                        m != t.state.end() &&
                                                        !m->second.caller_owned())
          t.state.erase(m);
        bind_state(t, g);
      }
  // Host state: a tensor that has none yet (its first step) starts with the rule's initial one
  // for its group's options now.
  for (auto& g : impl_->groups) {
    const optim::HostState initial_host = impl_->rule->initial_host_state(g.options);
    for (auto& t : g.tensors)
      for (const auto& [name, value] : initial_host) t.host.emplace(name, value);
  }

  // Phase 3: one fused kernel call per tensor, in slices (step_round.h).
  std::sort(created.begin(), created.end());
  created.erase(std::unique(created.begin(), created.end()), created.end());
  optim::run_groups(*impl_, impl_->runner, created);
  for (auto& g : impl_->groups)
    for (auto& t : g.tensors) t.bound_fresh = false;
}

StepResult Optimizer::step() { return step(StepArgs{}); }

StepResult Optimizer::step(const StepArgs& args) {
  optim::check_step_args(impl_->memory, args);
  impl_->cuda_stream = args.cuda_stream;
  check_sparse_grads(*impl_);
  optim::StepPlan plan =
      optim::plan_step(*impl_, impl_->runner);  // accumulation, statistics (step_control.h)
  if (plan.update) update(*impl_);
  return optim::finish_step(*impl_, plan);
}

std::vector<Optimizer::StateSpec> Optimizer::state_spec(size_t group) const {
  return optim::state_spec(*impl_, group);
}
std::vector<Optimizer::StateSpec> Optimizer::state_spec(size_t group, size_t index) const {
  return optim::state_spec(*impl_, group, index);
}
void Optimizer::bind_state(size_t group, size_t index, const std::string& name,
                           const TensorRef& buffer, bool fresh) {
  optim::bind_state(*impl_, group, index, name, buffer, fresh);
}
void Optimizer::bind_scalar(size_t group, size_t index, const std::string& name,
                            const TensorRef& value) {
  optim::bind_scalar(*impl_, group, index, name, value);
}

const std::vector<float>* Optimizer::state(size_t group, size_t index,
                                           const std::string& name) const {
  return optim::state(*impl_, group, index, name);
}
const std::vector<uint16_t>* Optimizer::state_bf16(size_t group, size_t index,
                                                   const std::string& name) const {
  return optim::state_bf16(*impl_, group, index, name);
}
std::vector<float> Optimizer::state_values(size_t group, size_t index,
                                           const std::string& name) const {
  return optim::state_values(*impl_, group, index, name);
}
TensorRef Optimizer::state_ref(size_t group, size_t index, const std::string& name) const {
  return optim::state_ref(*impl_, group, index, name);
}
int64_t Optimizer::step_count(size_t group, size_t index) const {
  return optim::step_count(*impl_, group, index);
}

void Optimizer::save_state(const std::string& path) const { optim::save_state(*impl_, path); }
void Optimizer::load_state(const std::string& path) { optim::load_state(*impl_, path); }

double Optimizer::loss_scale() const { return impl_->control.scaler.scale(); }
Options Optimizer::step_options() const { return impl_->control.options.to_json(); }

std::vector<Optimizer::KernelUse> Optimizer::kernel_uses() const {
  std::vector<KernelUse> uses;
  for (const auto& g : impl_->groups) {
    if (!g.binding) continue;
    std::vector<const Kernel*> counted;  // this group's kernels (several with tuned schedules)
    for (size_t ti = 0; ti < g.tensors.size(); ++ti) {
      const Impl::Tensor& t = g.tensors[ti];
      const Kernel* k = g.kernels()[ti].get();
      auto it = std::find_if(uses.begin(), uses.end(),
                             [&](const KernelUse& u) { return u.key == k->key(); });
      if (it == uses.end()) {
        uses.push_back({k->key(), k->name(), 0, 0, 0});
        it = uses.end() - 1;
      }
      if (std::find(counted.begin(), counted.end(), k) == counted.end()) {
        counted.push_back(k);
        it->groups += 1;
      }
      it->tensors += 1;
      it->elements += t.ref.param.numel;
    }
  }
  return uses;
}

int64_t Optimizer::bytes_per_step() const {
  int64_t bytes = 0;
  for (size_t gi = 0; gi < impl_->groups.size(); ++gi) {
    const Impl::Group& g = impl_->groups[gi];
    optim::Precision p = optim::group_precision(g, gi);
    const int64_t states = optim::rule_state_count({impl_->rule.get(), g.options, p, {}});
    // grad_accum (f32) is read once more when accumulating
    const int64_t accum = impl_->control.options.accumulating() ? 4 : 0;
    const optim::Blocking blocking = optim::group_blocking(g.options);
    const bool factors = static_cast<bool>(impl_->rule->factored_graph(g.options));
    for (const auto& t : g.tensors) {
      int64_t n =
          impl_->rule->sparse_grads() ? optim::touched_elements(t.sparse) : t.ref.param.numel;
      const int64_t block = blocking.applies(n) ? blocking.block : 0;
      // (A factored tensor's state is a row and a column per matrix: none per element.)
      const int64_t per_element = factors && t.matrix() ? 0 : states;
      bytes += optim::bytes_per_step(n, p, per_element, block) + accum * n;
    }
  }
  return bytes;
}

}  // namespace optfuse
