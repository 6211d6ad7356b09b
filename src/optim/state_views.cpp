// Reading an optimizer's state: host buffers in place, device buffers as TensorRefs or copied to
// the host (an explicit copy, after waiting for the context: never part of a step).
#include "optfuse/error.h"
#include "optim/optimizer_impl.h"
#include "optim/precision.h"

namespace optfuse {

using Impl = Optimizer::Impl;

const std::vector<float>* Optimizer::state(size_t group, size_t index,
                                           const std::string& name) const {
  const Impl::Group& g = group_at(*impl_, group);
  if (index >= g.tensors.size()) return nullptr;
  auto it = g.tensors[index].state.find(name);
  return it == g.tensors[index].state.end() ? nullptr : &it->second;
}

const std::vector<uint16_t>* Optimizer::state_bf16(size_t group, size_t index,
                                                   const std::string& name) const {
  const Impl::Group& g = group_at(*impl_, group);
  if (index >= g.tensors.size()) return nullptr;
  auto it = g.tensors[index].state16.find(name);
  if (it == g.tensors[index].state16.end() || it->second.dtype != DType::BF16) return nullptr;
  return &it->second.bits;
}

std::vector<float> Optimizer::state_values(size_t group, size_t index,
                                           const std::string& name) const {
  if (group_at(*impl_, group).tensors.size() > index &&
      group_at(*impl_, group).tensors[index].bound.count(name)) {
    TensorRef b = state_ref(group, index, name);
    if (b.memory == Memory::Cuda)
      throw Error(Impl::where(group) + ", tensor " + std::to_string(index) + ": state '" + name +
                  "' is caller-owned device memory: read it from its owner");
    return optim::widen_to_f32(b.data, b.dtype, b.numel);
  }
  if (TensorRef d = state_ref(group, index, name); d.data && d.memory == Memory::Cuda) {
    auto it = group_at(*impl_, group).tensors[index].device.find(name);
    optim::synchronize(impl_->cuda_context);  // the steps queued on any stream are done
    if (d.dtype == DType::F32) {
      std::vector<float> v(static_cast<size_t>(d.numel));
      it->second->download(v.data());
      return v;
    }
    std::vector<uint16_t> bits(static_cast<size_t>(d.numel));
    it->second->download(bits.data());
    return optim::widen_to_f32(bits.data(), d.dtype, d.numel);
  }
  if (const std::vector<float>* f = state(group, index, name)) return *f;
  const Impl::Group& g = group_at(*impl_, group);
  if (index >= g.tensors.size()) return {};
  if (auto b = g.tensors[index].state16.find(name); b != g.tensors[index].state16.end())
    return optim::widen_to_f32(b->second.bits.data(), b->second.dtype,
                               static_cast<int64_t>(b->second.bits.size()));
  return {};
}

TensorRef Optimizer::state_ref(size_t group, size_t index, const std::string& name) const {
  const Impl::Group& g = group_at(*impl_, group);
  if (index >= g.tensors.size()) return {};
  const Impl::Tensor& t = g.tensors[index];
  TensorRef r{nullptr, t.ref.param.numel, t.ref.param.shape, DType::F32, impl_->memory};
  if (auto b = t.bound.find(name); b != t.bound.end()) {
    r.data = b->second.data;
    r.dtype = b->second.dtype;
  } else if (auto it = t.device.find(name); it != t.device.end()) {
    r.data = it->second->data();
    r.dtype = it->second->dtype();
  } else if (auto f = t.state.find(name); f != t.state.end()) {
    r.data = const_cast<float*>(f->second.data());
  } else if (auto b = t.state16.find(name); b != t.state16.end()) {
    r.data = const_cast<uint16_t*>(b->second.bits.data());
    r.dtype = b->second.dtype;
  }
  return r;
}

int64_t Optimizer::step_count(size_t group, size_t index) const {
  const Impl::Group& g = group_at(*impl_, group);
  return index < g.tensors.size() ? g.tensors[index].step : 0;
}

}  // namespace optfuse
