#include "engine/kernel_impl.h"

#include <HalideRuntime.h>

#include <algorithm>
#include <climits>

#include "jit/halide_bridge.h"
#include "optfuse/error.h"

namespace optfuse::engine_detail {
namespace {

// Halide extents are int32: longer calls run as several slices of this many elements (a multiple
// of every power-of-two vector width).
constexpr int64_t kMaxSlice = int64_t(1) << 30;

halide_type_t buffer_type(DType t) {
  switch (t) {
    case DType::F32:
      return halide_type_t(halide_type_float, 32);
    case DType::F64:
      return halide_type_t(halide_type_float, 64);
    case DType::F16:
      return halide_type_t(halide_type_float, 16);
    case DType::BF16:
      return halide_type_t(halide_type_bfloat, 16);
    case DType::Bool:
      return halide_type_t(halide_type_uint, 1);
  }
  internal_error("buffer_type: bad dtype");
}

// A buffer over `data` from element `offset`: host memory, or, with `device`, a CUDA device
// pointer wrapped as Halide's halide_cuda_wrap_device_ptr would (no host copy, never dirty, so
// the pipeline's halide_copy_to_device is a no-op; nothing to free: the caller owns the memory).
halide_buffer_t call_buffer(void* data, int64_t offset, DType t, halide_dimension_t* dim,
                            const halide_device_interface_t* device) {
  halide_buffer_t b{};
  uint8_t* at = static_cast<uint8_t*>(data) + offset * static_cast<int64_t>(dtype_size(t));
  if (device) {
    b.device = reinterpret_cast<uint64_t>(at);
    b.device_interface = device;
  } else {
    b.host = at;
  }
  b.type = buffer_type(t);
  b.dimensions = 1;
  b.dim = dim;
  return b;
}

// The alignment the CUDA schedule assumes for a buffer of `t` (schedule.cpp: one vector of
// `vector_width` elements, capped at 16 bytes, at least one element).
size_t device_alignment(DType t, int vector_width) {
  size_t bytes = dtype_size(t) * static_cast<size_t>(vector_width), align = 1;
  while (align < 16 && bytes % (2 * align) == 0) align *= 2;
  return std::max(align, dtype_size(t));
}

std::string count_error(const std::string& kernel, const char* what, size_t got, size_t want) {
  return "kernel \"" + kernel + "\": the call has " + std::to_string(got) + " " + what +
         ", the signature " + std::to_string(want);
}

}  // namespace

KernelImpl::KernelImpl(KernelSignature signature, std::string key, std::string name,
                       Schedule resolved, std::shared_ptr<jit::Session> session, jit::ArgvFn fn,
                       const halide_device_interface_t* device_interface)
    : signature_(std::move(signature)),
      key_(std::move(key)),
      name_(std::move(name)),
      schedule_(resolved),
      session_(std::move(session)),
      fn_(fn),
      device_interface_(device_interface) {
  if (signature_.inputs.size() > kMaxTensors || signature_.outputs.size() > kMaxTensors ||
      signature_.scalars.size() > kMaxScalars)
    throw Error("graph \"" + name_ + "\" has more than " + std::to_string(kMaxTensors) +
                " tensors or " + std::to_string(kMaxScalars) + " scalars");
}

void KernelImpl::check(const KernelCall& call) const {
  if (call.inputs.size() != signature_.inputs.size())
    throw Error(count_error(name_, "inputs", call.inputs.size(), signature_.inputs.size()));
  if (call.scalars.size() != signature_.scalars.size())
    throw Error(count_error(name_, "scalars", call.scalars.size(), signature_.scalars.size()));
  if (call.outputs.size() != signature_.outputs.size())
    throw Error(count_error(name_, "outputs", call.outputs.size(), signature_.outputs.size()));
  if (call.n < 0)
    throw Error("kernel \"" + name_ + "\": negative element count " + std::to_string(call.n));
  if (on_device() && !call.device)
    throw Error("kernel \"" + name_ + "\" runs on a CUDA device: its call needs CUDA device "
                "pointers (KernelCall::device = true); host pointers are not accepted (optfuse "
                "makes no hidden host<->device copies)");
  if (!on_device() && call.device)
    throw Error("kernel \"" + name_ + "\" runs on the CPU: its call needs host pointers, not CUDA "
                "device pointers (KernelCall::device = true)");
  if (call.n == 0) return;
  for (size_t i = 0; i < call.inputs.size(); ++i)
    if (!call.inputs[i])
      throw Error("kernel \"" + name_ + "\": input \"" + signature_.inputs[i].name + "\" is null");
  for (size_t i = 0; i < call.outputs.size(); ++i)
    if (!call.outputs[i])
      throw Error("kernel \"" + name_ + "\": output for \"" + signature_.outputs[i].replaces +
                  "\" is null");
  if (!call.device) return;
  auto check_aligned = [&](const void* p, DType t, const std::string& what) {
    size_t align = device_alignment(t, schedule_.vector_width);
    if (reinterpret_cast<uintptr_t>(p) % align != 0)
      throw Error("kernel \"" + name_ + "\": device pointer for " + what + " is not " +
                  std::to_string(align) + "-byte aligned");
  };
  for (size_t i = 0; i < call.inputs.size(); ++i)
    check_aligned(call.inputs[i], signature_.inputs[i].dtype,
                  "input \"" + signature_.inputs[i].name + "\"");
  for (size_t i = 0; i < call.outputs.size(); ++i)
    check_aligned(call.outputs[i], signature_.outputs[i].dtype,
                  "output for \"" + signature_.outputs[i].replaces + "\"");
}

int64_t KernelImpl::chunk_for(int64_t n) const {
  int64_t tasks = int64_t(session_->num_threads()) * schedule_.tasks_per_thread;
  int64_t share = schedule_.task_elems > 0 ? schedule_.task_elems : (n + tasks - 1) / tasks;
  int64_t chunk = std::max(schedule_.min_task, share);
  // The lowered loop unrolls `unroll` vectors per step (schedule.cpp): whole steps per task.
  int64_t step = int64_t(schedule_.vector_width) * std::max(schedule_.unroll, 1);
  chunk = (chunk + step - 1) / step * step;
  return std::min(chunk, (kMaxSlice + step - 1) / step * step);
}

void KernelImpl::run(const KernelCall& call) const {
  check(call);
  if (call.n == 0) return;
  ScalarValue scalars[kMaxScalars];
  for (size_t i = 0; i < signature_.scalars.size(); ++i)
    jit::encode_scalar(call.scalars[i], signature_.scalars[i].dtype, &scalars[i]);
  for (int64_t offset = 0; offset < call.n; offset += kMaxSlice)
    run_slice(call, scalars, offset, std::min(kMaxSlice, call.n - offset));
}

// argv layout (lower.h): [user_context, inputs..., scalars..., chunk, outputs...]; buffers by
// pointer, every other argument by the address of its value. The same for CUDA kernels (which
// ignore chunk); their buffers carry device pointers instead of host ones.
void KernelImpl::run_slice(const KernelCall& call, const ScalarValue* scalars, int64_t offset,
                           int64_t n) const {
  halide_dimension_t dim(0, static_cast<int32_t>(n), 1);
  halide_buffer_t buffers[2 * kMaxTensors];
  void* args[2 + 2 * kMaxTensors + kMaxScalars];
  int32_t chunk = static_cast<int32_t>(chunk_for(n));
  size_t b = 0, a = 1;
  for (size_t i = 0; i < signature_.inputs.size(); ++i) {
    buffers[b] = call_buffer(call.inputs[i], offset, signature_.inputs[i].dtype, &dim,
                             device_interface_);
    args[a++] = &buffers[b++];
  }
  for (size_t i = 0; i < signature_.scalars.size(); ++i)
    args[a++] = const_cast<ScalarValue*>(&scalars[i]);
  args[a++] = &chunk;
  for (size_t i = 0; i < signature_.outputs.size(); ++i) {
    buffers[b] = call_buffer(call.outputs[i], offset, signature_.outputs[i].dtype, &dim,
                             device_interface_);
    args[a++] = &buffers[b++];
  }
  jit::Session::call(fn_, args, name_);
}

}  // namespace optfuse::engine_detail
