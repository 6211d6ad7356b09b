// Reading an optimizer's state: host buffers in place, device buffers as TensorRefs or copied to
// the host (an explicit copy, after waiting for the context: never part of a step).
#include "optfuse/error.h"
#include "optim/device_buffer.h"
#include "optim/optimizer_state.h"
#include "optim/precision.h"
#include "optim/state_buffers.h"

namespace optfuse::optim {

using Impl = OptimizerState;

namespace {

// The buffer `name` of tensor `index` of `group`, or null.
const optim::StateBuffer* find_state(Impl& impl, size_t group, size_t index,
                                     const std::string& name) {
  const Impl::Group& g = group_at(impl, group);
  if (index >= g.tensors.size()) return nullptr;
  auto it = g.tensors[index].state.find(name);
  return it == g.tensors[index].state.end() ? nullptr : &it->second;
}

}  // namespace

const std::vector<float>* state(Impl& impl, size_t group, size_t index, const std::string& name) {
  const optim::StateBuffer* b = find_state(impl, group, index, name);
  return b ? b->f32() : nullptr;
}

const std::vector<uint16_t>* state_bf16(Impl& impl, size_t group, size_t index,
                                        const std::string& name) {
  const optim::StateBuffer* b = find_state(impl, group, index, name);
  return b && b->dtype() == DType::BF16 ? b->bits() : nullptr;
}

std::vector<float> state_values(Impl& impl, size_t group, size_t index, const std::string& name) {
  const optim::StateBuffer* b = find_state(impl, group, index, name);
  if (!b) return {};
  if (b->caller_owned() && b->on_device())
    throw Error(Impl::where(group) + ", tensor " + std::to_string(index) + ": state '" + name +
                "' is caller-owned device memory: read it from its owner");
  if (b->on_device()) optim::synchronize(impl.cuda_context);  // queued steps are done
  return optim::state_values_f32(group_at(impl, group).tensors[index], name, *b);
}

TensorRef state_ref(Impl& impl, size_t group, size_t index, const std::string& name) {
  const Impl::Group& g = group_at(impl, group);
  if (index >= g.tensors.size()) return {};
  const Impl::Tensor& t = g.tensors[index];
  TensorRef r{nullptr, t.ref.param.numel, t.ref.param.shape, DType::F32, impl.memory};
  if (auto it = t.state.find(name); it != t.state.end()) {
    r.data = it->second.data();
    r.dtype = it->second.dtype();
    if (it->second.numel() != r.numel) {  // 8-bit state's scales: one per block
      r.numel = it->second.numel();
      r.shape = {r.numel};
    }
  }
  return r;
}

int64_t step_count(Impl& impl, size_t group, size_t index) {
  const Impl::Group& g = group_at(impl, group);
  return index < g.tensors.size() ? g.tensors[index].step : 0;
}

}  // namespace optfuse::optim
