#include "engine/kernel_impl.h"

#include <HalideRuntime.h>

#include <algorithm>
#include <climits>
#include <new>

#include "jit/cuda_driver.h"
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
    case DType::U8:
      return halide_type_t(halide_type_uint, 8);
  }
  internal_error("buffer_type: bad dtype");
}

// Makes `*b` a buffer over `data` from element `offset`: host memory, or, with `device`, a CUDA
// device pointer wrapped as Halide's halide_cuda_wrap_device_ptr would (no host copy, never
// dirty, so the pipeline's halide_copy_to_device is a no-op; nothing to free: the caller owns the
// memory). Written in place: building a temporary and copying it costs a store-forwarding stall
// per buffer, a measurable share of a call on a small tensor.
halide_buffer_t* init_buffer(void* slot, void* data, int64_t offset, DType t,
                             halide_dimension_t* dim, const halide_device_interface_t* device,
                             int dimensions = 1) {
  auto* b = new (slot) halide_buffer_t{};
  uint8_t* at = static_cast<uint8_t*>(data) + offset * static_cast<int64_t>(dtype_size(t));
  if (device) {
    b->device = reinterpret_cast<uint64_t>(at);
    b->device_interface = device;
  } else {
    b->host = at;
  }
  b->type = buffer_type(t);
  b->dimensions = dimensions;
  b->dim = dim;
  return b;
}

// Makes `*b` a 0-D f64 buffer over one result slot.
halide_buffer_t* init_result_buffer(void* slot, double* result) {
  auto* b = new (slot) halide_buffer_t{};
  b->host = reinterpret_cast<uint8_t*>(result);
  b->type = halide_type_t(halide_type_float, 64);
  return b;
}

// Stands in for the tensors of an empty call that still has results to compute: Halide takes a
// buffer with no host (and no device) pointer for a bounds query and would compute nothing, and
// a reduction's bounds need one readable element. Such a call passes one-element buffers over
// this memory and chunk = 0, which tells the kernel the tensors are empty (lower.h).
alignas(64) unsigned char empty_tensor[64];

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

void check_call_arguments(const KernelSignature& sig, const std::string& kernel,
                          const KernelCall& call) {
  if (call.inputs.size() != sig.inputs.size())
    throw Error(count_error(kernel, "inputs", call.inputs.size(), sig.inputs.size()));
  if (call.scalars.size() != sig.scalars.size())
    throw Error(count_error(kernel, "scalars", call.scalars.size(), sig.scalars.size()));
  if (call.outputs.size() != sig.outputs.size())
    throw Error(count_error(kernel, "outputs", call.outputs.size(), sig.outputs.size()));
  if (call.n < 0)
    throw Error("kernel \"" + kernel + "\": negative element count " + std::to_string(call.n));
  if (!sig.results.empty() && !call.results)
    throw Error("kernel \"" + kernel + "\" has " + std::to_string(sig.results.size()) +
                " results (first \"" + sig.results[0].name +
                "\"): the call needs KernelCall::results");
  // (Row state makes a kernel per-row: other kernels' calls skip the loop. Staged kernels keep
  // no row on the stack.)
  if (sig.per_row && !sig.per_col && call.cols > kMaxRowStateCols)
    for (const auto& in : sig.inputs)
      if (in.role == Role::RowState)
        throw Error("kernel \"" + kernel + "\" has row state (\"" + in.name +
                    "\"): KernelCall::cols must be at most " + std::to_string(kMaxRowStateCols) +
                    ", got " + std::to_string(call.cols));
  if (sig.per_row && (call.cols <= 0 || call.cols > INT32_MAX || call.n % call.cols != 0))
    throw Error(
        "kernel \"" + kernel + "\" reduces per row: KernelCall::cols must be in [1, 2^31) " +
        "and divide n = " + std::to_string(call.n) + ", got cols = " + std::to_string(call.cols));
  if (sig.per_col && (call.batch_rows < 0 || call.batch_rows > INT32_MAX ||
                      (call.batch_rows > 0 && (call.n / call.cols) % call.batch_rows != 0)))
    throw Error("kernel \"" + kernel + "\" reduces per column: KernelCall::batch_rows must be 0 " +
                "or divide the " + std::to_string(call.n / call.cols) + " rows, got " +
                std::to_string(call.batch_rows));
}

KernelImpl::KernelImpl(KernelSignature signature, std::string key, std::string name,
                       Schedule resolved, std::shared_ptr<jit::Session> session, jit::ArgvFn fn,
                       const halide_device_interface_t* device_interface, void* cuda_context)
    : signature_(std::move(signature)),
      key_(std::move(key)),
      name_(std::move(name)),
      schedule_(resolved),
      session_(std::move(session)),
      fn_(fn),
      device_interface_(device_interface),
      cuda_context_(cuda_context) {
  if (signature_.inputs.size() > kMaxTensors || signature_.outputs.size() > kMaxTensors ||
      signature_.scalars.size() > kMaxScalars || signature_.results.size() > kMaxResults)
    throw Error("graph \"" + name_ + "\" has more than " + std::to_string(kMaxTensors) +
                " tensors, " + std::to_string(kMaxScalars) + " scalars or " +
                std::to_string(kMaxResults) + " results");
}

void KernelImpl::check(const KernelCall& call) const {
  check_call_arguments(signature_, name_, call);
  if (on_device() && !call.device)
    throw Error("kernel \"" + name_ +
                "\" runs on a CUDA device: its call needs CUDA device "
                "pointers (KernelCall::device = true); host pointers are not accepted (optfuse "
                "makes no hidden host<->device copies)");
  if (!on_device() && call.device)
    throw Error("kernel \"" + name_ +
                "\" runs on the CPU: its call needs host pointers, not CUDA "
                "device pointers (KernelCall::device = true)");
  if ((signature_.reduces || signature_.per_col) && call.n > kMaxSlice)
    throw Error("kernel \"" + name_ + "\" reduces " +
                (signature_.reduces ? "whole tensors" : "columns") +
                ": one call covers at most 2^30 elements, got n = " + std::to_string(call.n));
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
  if (call.n == 0 && signature_.results.empty()) return;
  ScalarValue scalars[kMaxScalars];
  for (size_t i = 0; i < signature_.scalars.size(); ++i)
    jit::encode_scalar(call.scalars[i], signature_.scalars[i].dtype, &scalars[i]);
  if (call.n == 0) {
    // Stand-in tensors: host memory, or for a CUDA kernel device memory in its context (the
    // kernel loads nothing from them, but Halide passes them to the device as they are).
    void* stand_in = empty_tensor;
    if (on_device())
      stand_in = reinterpret_cast<void*>(
          jit::cuda_scratch(cuda_context_ ? cuda_context_ : jit::cuda_primary_context(0)));
    KernelCall empty = call;
    for (void*& p : empty.inputs) p = stand_in;
    for (void*& p : empty.outputs) p = stand_in;
    empty.cols = 1;
    empty.batch_rows = 1;
    return run_slice(empty, scalars, 0, 1, /*empty=*/true);
  }
  if (signature_.per_col) return run_slice(call, scalars, 0, call.n);  // one slice, checked
  // Per-row kernels slice on whole rows (rows are independent); reducing kernels are one slice.
  int64_t step =
      signature_.per_row ? std::max<int64_t>(1, kMaxSlice / call.cols) * call.cols : kMaxSlice;
  for (int64_t offset = 0; offset < call.n; offset += step) {
    const int64_t len = std::min(step, call.n - offset);
    if (!signature_.per_row || call.serial || on_device()) {
      run_slice(call, scalars, offset, len);
      continue;
    }
    // A per-row CPU kernel's tasks are rows_per_task = chunk / cols whole rows (schedule.cpp), and
    // a task must not be partial: its row stages are fixed at one row each, which a row past the
    // end would still compute (reading past the buffers). So the rows that fill whole tasks
    // run in one call, and the rest in a second one, as one task of exactly those rows.
    const int64_t chunk = chunk_for(len), rows = len / call.cols;
    const int64_t per_task = std::max<int64_t>(chunk / call.cols, 1);
    const int64_t whole = rows / per_task * per_task;
    if (whole > 0) run_slice(call, scalars, offset, whole * call.cols, false, chunk);
    if (rows > whole)
      run_slice(call, scalars, offset + whole * call.cols, (rows - whole) * call.cols, false,
                (rows - whole) * call.cols);
  }
}

// argv layout (lower.h): [user_context, inputs..., scalars..., chunk, (cols,) results...,
// outputs...]; buffers by pointer, every other argument by the address of its value. The same
// for CUDA kernels (which ignore chunk); their buffers carry device pointers instead of host ones.
// Per-row kernels see every tensor as 2-D: [cols, rows] in Halide's order (x innermost).
void KernelImpl::run_slice(const KernelCall& call, const ScalarValue* scalars, int64_t offset,
                           int64_t n, bool empty, int64_t chunk_elems) const {
  const bool rows = signature_.per_row;
  const int64_t cols = rows ? call.cols : n;
  halide_dimension_t dims[2] = {
      halide_dimension_t(0, static_cast<int32_t>(rows ? cols : n), 1),
      halide_dimension_t(0, static_cast<int32_t>(rows ? n / cols : 1), static_cast<int32_t>(cols))};
  const int dimensions = rows ? 2 : 1;
  // Row state: one value per row, 1-D. Column state (staged kernels, one slice): cols values per
  // batch, [cols, batches].
  halide_dimension_t row_dims[1] = {
      halide_dimension_t(0, static_cast<int32_t>(rows ? n / cols : 1), 1)};
  const int64_t row_offset = rows ? offset / cols : 0;
  const int64_t batch_rows = call.batch_rows > 0 ? call.batch_rows : std::max<int64_t>(n / cols, 1);
  halide_dimension_t col_dims[2] = {
      halide_dimension_t(0, static_cast<int32_t>(cols), 1),
      halide_dimension_t(0, static_cast<int32_t>(std::max<int64_t>(n / cols / batch_rows, 1)),
                         static_cast<int32_t>(cols))};
  // A tensor input's or output's buffer: element, row or column state.
  auto tensor_buffer = [&](void* slot, void* data, DType t, bool row_state, bool col_state) {
    if (row_state) return init_buffer(slot, data, row_offset, t, row_dims, device_interface_, 1);
    if (col_state) return init_buffer(slot, data, 0, t, col_dims, device_interface_, 2);
    return init_buffer(slot, data, offset, t, dims, device_interface_, dimensions);
  };
  // Raw slots, filled as used: an array of halide_buffer_t would run halide_type_t's constructor
  // for all of its slots (about 10 KB of stack written per call, a measurable share of a call on
  // a 1K-element tensor).
  union Slot {
    halide_buffer_t buffer;
    Slot() {}
  } slots[2 * kMaxTensors + kMaxResults + 1];
  size_t b = 0, a = 1;
  auto next_slot = [&]() -> void* { return &slots[b++].buffer; };
  void* args[5 + 2 * kMaxTensors + kMaxScalars + kMaxResults];
  // A serial call is one task: a per-row or reducing kernel's single-task loop (chunk >= n), a
  // flat one's streaming loop (chunk < 0, lower.h).
  int32_t chunk = empty ? 0 : static_cast<int32_t>(chunk_elems > 0 ? chunk_elems : chunk_for(n));
  if (call.serial && !empty) chunk = rows || signature_.reduces ? static_cast<int32_t>(n) : -1;
  int32_t cols32 = static_cast<int32_t>(cols), batch_rows32 = static_cast<int32_t>(batch_rows);
  for (size_t i = 0; i < signature_.inputs.size(); ++i) {
    const Role role = signature_.inputs[i].role;
    args[a++] = tensor_buffer(next_slot(), call.inputs[i], signature_.inputs[i].dtype,
                              role == Role::RowState, role == Role::ColState);
  }
  for (size_t i = 0; i < signature_.scalars.size(); ++i)
    args[a++] = const_cast<ScalarValue*>(&scalars[i]);
  args[a++] = &chunk;
  if (rows) args[a++] = &cols32;
  if (signature_.per_col) args[a++] = &batch_rows32;
  for (size_t i = 0; i < signature_.results.size(); ++i)
    args[a++] = init_result_buffer(next_slot(), call.results + i);
  double fence = 0;  // staged kernels' extra result (lower/staged.h)
  if (signature_.per_col) args[a++] = init_result_buffer(next_slot(), &fence);
  for (size_t i = 0; i < signature_.outputs.size(); ++i) {
    const auto& out = signature_.outputs[i];
    args[a++] =
        tensor_buffer(next_slot(), call.outputs[i], out.dtype, out.row_state, out.col_state);
  }
  session_->call(fn_, args, name_, {cuda_context_, call.cuda_stream});
}

}  // namespace optfuse::engine_detail
