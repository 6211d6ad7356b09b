#include "optim/step_control.h"

#include <algorithm>
#include <cmath>

#include "optfuse/error.h"
#include "optim/grad_stats.h"
#include "optim/optimizer_state.h"
#include "optim/options.h"
#include "optim/step_round.h"

namespace optfuse::optim {

using Impl = OptimizerState;

GradPrologue StepControl::prologue() const {
  GradPrologue p;
  p.accumulated = options.accumulating();
  p.scaled = options.clipping() || options.loss_scaling() ||
             (options.accumulating() && options.accumulation_mean);
  return p;
}

namespace {

// The optimizer's pool when `small` single-task tensors are worth spreading over the threads, else
// null: no threads are started for nothing.
WorkerPool* pool_for(Impl& impl, StepRunner& runner, size_t small) {
  const int threads = impl.engine->num_threads();
  return threads >= 2 && small >= 4 * static_cast<size_t>(threads) ? round_pool(impl, runner)
                                                                   : nullptr;
}

// ---- accumulation micro-steps --------------------------------------------------------------

// The accumulation buffer of `t`: on the device for device tensors, else on the host.
void* accum_pointer(Impl::Tensor& t) { return t.state.at(kGradAccum).data(); }

void run_accumulate(const Impl& impl, const Kernel& k, Impl::Tensor& t, KernelCall* call) {
  const KernelSignature& sig = k.signature();
  call->inputs.resize(sig.inputs.size());
  for (size_t i = 0; i < sig.inputs.size(); ++i)
    call->inputs[i] = sig.inputs[i].role == Role::Grad ? t.ref.grad.data : accum_pointer(t);
  call->outputs.assign(1, accum_pointer(t));
  call->n = t.ref.param.numel;
  call->device = impl.memory == Memory::Cuda;
  call->cuda_stream = impl.cuda_stream;
  k.run(*call);
}

// Accumulation buffers for every tensor lacking one, all made before any is installed: host
// vectors, or device buffers (uninitialized: the first micro-step's kernel writes every element).
void make_accum_buffers(Impl& impl) {
  std::vector<std::pair<Impl::Tensor*, StateBuffer>> made;
  for (size_t gi = 0; gi < impl.groups.size(); ++gi)
    for (size_t ti = 0; ti < impl.groups[gi].tensors.size(); ++ti) {
      Impl::Tensor& t = impl.groups[gi].tensors[ti];
      if (t.state.count(kGradAccum)) continue;
      const auto n = static_cast<size_t>(t.ref.param.numel);
      const bool wide = t.ref.grad.dtype == DType::F64;  // (accumulate_graph: f64 sums in f64)
      if (impl.memory == Memory::Cuda)
        made.emplace_back(&t,
                          StateBuffer::device(std::make_shared<DeviceBuffer>(
                              impl.cuda_context, t.ref.param.numel, wide ? DType::F64 : DType::F32,
                              Impl::where(gi, ti, t.ref) + ": state '" + kGradAccum + "'")));
      else
        made.emplace_back(&t, wide ? StateBuffer::host(std::vector<double>(n))
                                   : StateBuffer::host(std::vector<float>(n)));
    }
  for (auto& [t, buf] : made) t->state.emplace(kGradAccum, std::move(buf));
}

// One micro-step before the k-th: grad_accum = grad (first) or grad_accum += grad, one kernel
// call per tensor; tensors that are a single task each are spread over the threads.
void accumulate(Impl& impl, StepRunner& runner, bool first) {
  StepControl& sc = impl.control;
  // Every kernel first (one per gradient dtype; may throw: nothing changed yet).
  auto& slots = first ? sc.acc_init : sc.acc_add;
  for (auto& g : impl.groups)
    for (auto& t : g.tensors) {
      auto& slot = slots[t.ref.grad.dtype];
      if (!slot) slot = impl.engine->kernel(accumulate_graph(first, t.ref.grad.dtype));
    }
  auto kernel_of = [&](const Impl::Tensor& t) -> const Kernel& {
    return *slots.at(t.ref.grad.dtype);
  };
  if (first) make_accum_buffers(impl);
  // (Device tensors: every launch from this thread, in order, on the step's stream.)
  const int64_t single_task =
      impl.memory == Memory::Cuda ? -1 : impl.engine->options().schedule.min_task;
  std::vector<Impl::Tensor*> small;
  KernelCall call;
  for (auto& g : impl.groups)
    for (auto& t : g.tensors) {
      if (t.ref.param.numel <= single_task)
        small.push_back(&t);
      else
        run_accumulate(impl, kernel_of(t), t, &call);
    }
  WorkerPool* pool = pool_for(impl, runner, small.size());
  if (!pool) {
    for (Impl::Tensor* t : small) run_accumulate(impl, kernel_of(*t), *t, &call);
    return;
  }
  const size_t threads = static_cast<size_t>(pool->threads());
  pool->run([&](int part) {
    KernelCall local;
    size_t p = static_cast<size_t>(part);
    for (size_t i = small.size() * p / threads; i < small.size() * (p + 1) / threads; ++i)
      run_accumulate(impl, kernel_of(*small[i]), *small[i], &local);
  });
}

// ---- the update micro-step -----------------------------------------------------------------

GradStats statistics(Impl& impl, StepRunner& runner) {
  StepControl& sc = impl.control;
  const bool acc = sc.options.accumulating();
  // One kernel per gradient dtype; every tensor in group order, in one round (grad_stats.h).
  std::vector<StatsInput> inputs;
  for (auto& g : impl.groups)
    for (auto& t : g.tensors) {
      const float* a = nullptr;
      if (acc) {
        auto it = t.state.find(kGradAccum);
        if (it == t.state.end()) internal_error("accumulation buffer missing at the update step");
        a = static_cast<const float*>(it->second.data());
      }
      auto& slot = sc.stats[t.ref.grad.dtype];
      if (!slot)
        slot = impl.engine->kernel(grad_stats_graph(acc, sc.options.norm_inf, t.ref.grad.dtype));
      inputs.push_back({slot.get(), t.ref.grad.data, a, t.ref.param.numel});
    }
  return grad_stats(inputs, round_pool(impl, runner), &sc.stats_round);
}

// Plans the update (or the skip) from the statistics; changes nothing but sc.grad_scale.
void plan_update(Impl& impl, StepRunner& runner, StepPlan* plan) {
  StepControl& sc = impl.control;
  const StepOptions& o = sc.options;
  StepResult& r = plan->result;
  const double k_mean =
      o.accumulating() && o.accumulation_mean ? double(o.accumulation_steps) : 1.0;
  const double unscale = r.loss_scale * k_mean;  // the gradients as given are this times too big
  if (o.needs_stats()) {
    GradStats s = statistics(impl, runner);
    r.has_total_norm = true;
    r.total_norm = s.total_norm(o.norm_inf) / unscale;
    if (o.loss_scaling() && !s.finite()) {
      plan->found_nonfinite = true;
      r.outcome = StepResult::Outcome::SkippedNonFinite;
      return;
    }
    if (o.clipping()) {
      if (!s.finite() && o.error_if_nonfinite)
        throw Error(std::string("The total norm of order ") + (o.norm_inf ? "inf" : "2.0") +
                    " for gradients is non-finite, so it cannot be clipped. To disable this "
                    "error and scale the gradients by the non-finite norm anyway, set "
                    "error_if_nonfinite=false");
      // torch: clip_coef = max_norm / (total_norm + 1e-6), clamped to 1 (a nan stays nan).
      double coef = o.max_grad_norm / (r.total_norm + 1e-6);
      r.clip_coef = std::isnan(coef) ? coef : std::min(coef, 1.0);
    }
  }
  sc.grad_scale = r.clip_coef / unscale;
  plan->update = true;
}

}  // namespace

StepPlan plan_step(Impl& impl, StepRunner& runner) {
  StepControl& sc = impl.control;
  StepPlan plan;
  plan.result.micro_step = sc.micro + 1;
  plan.result.loss_scale = sc.scaler.scale();
  if (sc.micro + 1 < sc.options.accumulation_steps) {
    accumulate(impl, runner, sc.micro == 0);
    ++sc.micro;
    plan.result.outcome = StepResult::Outcome::Accumulated;
    return plan;
  }
  plan_update(impl, runner, &plan);
  return plan;
}

StepResult finish_step(Impl& impl, const StepPlan& plan) {
  StepControl& sc = impl.control;
  StepResult r = plan.result;
  if (r.outcome != StepResult::Outcome::Accumulated) {
    sc.scaler.update(plan.found_nonfinite);
    sc.micro = 0;
  }
  r.next_loss_scale = sc.scaler.scale();
  return r;
}

void check_can_add_group(const Impl& impl, const std::string& where) {
  if (impl.control.micro > 0)
    throw Error(where +
                ": cannot add a param group in the middle of a gradient accumulation "
                "cycle (" +
                std::to_string(impl.control.micro) + " of " +
                std::to_string(impl.control.options.accumulation_steps) +
                " micro-steps done); add it after the update step");
}

// ---- state file ----------------------------------------------------------------------------

Options save_step_state(const Impl& impl) {
  const StepControl& sc = impl.control;
  if (!sc.options.any()) return nullptr;
  Options s = {{"options", sc.options.to_json()}, {"micro_step", sc.micro}};
  if (sc.options.loss_scale == StepOptions::LossScale::Dynamic)
    s["scaler"] = {{"scale", sc.scaler.scale()}, {"growth_tracker", sc.scaler.growth_tracker()}};
  return s;
}

StepControl load_step_state(const Impl& impl, const Options& step,
                            const std::vector<std::vector<bool>>& has_accum) {
  StepControl sc(impl.control.options);
  const StepOptions& o = sc.options;
  int64_t micro = 0;
  if (!step.is_null()) {
    micro = step.at("micro_step").get<int64_t>();
    if (micro < 0 || micro >= o.accumulation_steps)
      throw Error(
          "is at micro-step " + std::to_string(micro) + " of a gradient accumulation cycle, " +
          "but this optimizer has accumulation_steps = " + std::to_string(o.accumulation_steps));
    if (step.contains("scaler")) {
      if (o.loss_scale != StepOptions::LossScale::Dynamic)
        throw Error(
            "holds dynamic loss scaler state, but this optimizer has no "
            "\"loss_scale\": \"dynamic\"");
      const Options& s = step.at("scaler");
      sc.scaler.restore(s.at("scale").get<double>(), s.at("growth_tracker").get<int64_t>());
    }
  }
  for (size_t gi = 0; gi < has_accum.size(); ++gi)
    for (size_t ti = 0; ti < has_accum[gi].size(); ++ti) {
      const std::string who = Impl::where(gi, ti, impl.groups[gi].tensors[ti].ref);
      if (has_accum[gi][ti] && !o.accumulating())
        throw Error(who +
                    ": holds a gradient accumulation buffer, but this optimizer has no "
                    "accumulation_steps > 1");
      if (!has_accum[gi][ti] && micro > 0)
        throw Error(who + ": has no gradient accumulation buffer, but the file is at micro-step " +
                    std::to_string(micro));
    }
  sc.micro = micro;
  return sc;
}

}  // namespace optfuse::optim
