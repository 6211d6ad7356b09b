// Caller-owned state (Optimizer::state_spec / bind_state / bind_scalar): a framework that keeps
// the optimizer state itself (the Python package keeps torch's optimizer.state) hands its
// buffers to the optimizer, which reads and writes them in place instead of its own.
#include <algorithm>
#include <cmath>

#include "optfuse/error.h"
#include "optim/block_state.h"
#include "optim/device_buffer.h"
#include "optim/device_support.h"
#include "optim/grad_prologue.h"
#include "optim/optimizer_state.h"
#include "optim/precision.h"

namespace optfuse::optim {

using Impl = OptimizerState;

namespace {

Impl::Tensor& tensor_at(Impl& impl, size_t group, size_t index) {
  Impl::Group& g = group_at(impl, group);
  if (index >= g.tensors.size())
    throw Error(Impl::where(group) + ": tensor " + std::to_string(index) +
                " does not exist (there are " + std::to_string(g.tensors.size()) + ")");
  return g.tensors[index];
}

}  // namespace

namespace {

// The buffers tensor `t` of kernel plan `kp` binds (block > 0: with 8-bit state of that block);
// the group's, with no tensor.
std::vector<Optimizer::StateSpec> spec_of(const Impl& impl, const Impl::Group& g,
                                          const optim::KernelPlan& kp, const Impl::Tensor* t,
                                          int64_t block) {
  std::vector<Optimizer::StateSpec> spec;
  for (const auto& s : kp.state) {
    if (s.name == optim::kGradAccum) continue;  // the accumulation buffer is the optimizer's own
    const bool codes = s.dtype == DType::U8;
    const bool scales = s.rows;
    const std::string rule_name = optim::block_state_of(s.name);
    double initial = impl.rule->initial_state_value(g.options, rule_name);
    if (codes || scales) {  // a constant block's code and scale
      const float x = static_cast<float>(initial);
      uint8_t code = 0;
      float absmax = 0;
      optim::encode_blocks(&x, 1, 1, optim::block_map(rule_name), &code, &absmax);
      initial = codes ? code : absmax;
    }
    spec.push_back({s.name, s.dtype, initial, s.name == optim::kMasterState,
                    t ? t->state_numel(s, block) : 0,
                    t ? t->state_shape(s, block) : std::vector<int64_t>{}});
  }
  return spec;
}

}  // namespace

std::vector<Optimizer::StateSpec> state_spec(Impl& impl, size_t group) {
  Impl::Group& g = group_at(impl, group);
  resolve_plan(impl, g, group);
  return spec_of(impl, g, g.plan()->dense, nullptr, 0);
}

std::vector<Optimizer::StateSpec> state_spec(Impl& impl, size_t group, size_t index) {
  Impl::Tensor& t = tensor_at(impl, group, index);
  Impl::Group& g = group_at(impl, group);
  resolve_plan(impl, g, group);
  return spec_of(impl, g, g.plan_of(t), &t, g.block_of(t));
}

void bind_state(Impl& impl, size_t group, size_t index, const std::string& name,
                const TensorRef& buffer, bool fresh) {
  Impl::Tensor& t = tensor_at(impl, group, index);
  const std::string who = Impl::where(group, index, t.ref) + ": state '" + name + "'";
  // The tensor's kernel plan says which buffers exist; the spec's names are listed only for the
  // error.
  Impl::Group& g = group_at(impl, group);
  resolve_plan(impl, g, group);
  const std::vector<Optimizer::StateSpec> specs = state_spec(impl, group, index);
  auto slot = std::find_if(specs.begin(), specs.end(),
                           [&](const Optimizer::StateSpec& s) { return s.name == name; });
  if (slot == specs.end()) {
    std::string known;
    for (const auto& e : specs) known += (known.empty() ? "" : ", ") + e.name;
    throw Error(who + ": this tensor's step has no such state (it has: " + known + ")");
  }
  const DType want = slot->dtype;
  if (!buffer.data) throw Error(who + ": null buffer");
  if (buffer.numel != slot->numel)
    throw Error(who + ": buffer has " + std::to_string(buffer.numel) + " elements but " +
                (slot->numel == t.ref.param.numel ? "param has " + std::to_string(t.ref.param.numel)
                 : g.block_of(t) > 0
                     ? "the state has " + std::to_string(slot->numel) + " (one per block of " +
                           std::to_string(g.plan()->blocking.block) + ")"
                     : "the state has " + std::to_string(slot->numel) +
                           " (one per row or column of each matrix of the param's last two dims)"));
  if (buffer.dtype != want)
    throw Error(who + ": buffer dtype " + std::string(dtype_name(buffer.dtype)) +
                " but the state is " + std::string(dtype_name(want)));
  if (buffer.memory != impl.memory)
    throw Error(who + ": buffer in " + memory_name(buffer.memory) +
                " memory but the params are in " + memory_name(impl.memory) + " memory");
  optim::check_device_pointer(impl.cuda_context, buffer, "state buffer", who);
  // (A device buffer of the optimizer's own may still be read by steps queued on a stream.)
  if (auto own = t.state.find(name);
      own != t.state.end() && own->second.kind() == optim::StateBuffer::Kind::Device)
    optim::synchronize(impl.cuda_context);
  // (A tensor's 8-bit buffers share one block size, Tensor::state_block: its own ones of another
  // block size would be read with the new one.)
  if (want == DType::U8 && t.state_block != 0 && t.state_block != g.plan()->blocking.block)
    for (const auto& [held, b] : t.state)
      if (b.dtype() == DType::U8 && !b.caller_owned() && held != name)
        throw Error(who + ": the tensor holds its own 8-bit state '" + held + "' in blocks of " +
                    std::to_string(t.state_block) + ": step once with block_size " +
                    std::to_string(g.plan()->blocking.block) +
                    " before binding 8-bit buffers, or bind all of them");
  t.state.insert_or_assign(name, optim::StateBuffer::caller(buffer));
  if (want == DType::U8) t.state_block = g.plan()->blocking.block;
  t.bound_fresh = t.bound_fresh || fresh;
  t.bound.reset();  // the next step looks its state buffers up again
}

void bind_scalar(Impl& impl, size_t group, size_t index, const std::string& name,
                 const TensorRef& value) {
  Impl::Tensor& t = tensor_at(impl, group, index);
  const std::string who = Impl::where(group, index, t.ref) + ": scalar '" + name + "'";
  const optim::HostState host = impl.rule->initial_host_state(impl.groups[group].options);
  if (name != "step" && !host.count(name)) {
    std::string known = "step";
    for (const auto& [n, v] : host) known += ", " + n;
    throw Error(who + ": " + impl.rule->type() +
                " keeps no such per-tensor scalar (it has: " + known + ")");
  }
  if (!value.data || value.numel != 1 || value.memory != Memory::Host ||
      (value.dtype != DType::F32 && value.dtype != DType::F64))
    throw Error(who + ": needs one f32 or f64 element in host memory");
  t.bound_scalars[name] = value;
}

namespace {

double read(const TensorRef& r) {
  return r.dtype == DType::F64 ? *static_cast<const double*>(r.data)
                               : static_cast<double>(*static_cast<const float*>(r.data));
}

void write(const TensorRef& r, double v) {
  if (r.dtype == DType::F64)
    *static_cast<double*>(r.data) = v;
  else
    *static_cast<float*>(r.data) = static_cast<float>(v);
}

}  // namespace

void load_bound_scalars(Impl::Tensor& t) {
  for (const auto& [name, ref] : t.bound_scalars) {
    if (name == "step")
      t.step = static_cast<int64_t>(std::llround(read(ref)));
    else
      t.host[name] = read(ref);
  }
}

void store_bound_scalars(const Impl::Tensor& t) {
  for (const auto& [name, ref] : t.bound_scalars)
    write(ref, name == "step" ? static_cast<double>(t.step) : t.host.at(name));
}

}  // namespace optfuse::optim
