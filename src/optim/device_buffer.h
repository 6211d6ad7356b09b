#pragma once
// Optimizer state in CUDA device memory (device tensors, optim.h): one cuMemAlloc'd buffer per
// state tensor, owned by the optimizer and freed with it. All driver calls go through the run-time
// loaded driver table (jit/cuda_driver.h) with the engine's context made current for the call.
// Copies between host and device happen only where this says so: never inside a step.
#include <cstdint>
#include <string>
#include <vector>

#include "optfuse/graph.h"

namespace optfuse::optim {

class DeviceBuffer {
 public:
  // `numel` elements of `dtype` in CUDA context `context`; Error naming `what` (and the CUresult)
  // if the allocation fails.
  DeviceBuffer(void* context, int64_t numel, DType dtype, const std::string& what);
  ~DeviceBuffer();  // cuMemFree (errors ignored: a destructor cannot report them)
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const;  // the CUdeviceptr, as KernelCall::inputs take it
  int64_t numel() const { return numel_; }
  DType dtype() const { return dtype_; }
  size_t bytes() const;

  // Every element set to `value` rounded once to dtype() (f32, or bf16 round-to-nearest-even),
  // asynchronously on `stream` (cuMemsetD32Async / cuMemsetD16Async): ordered before the kernels
  // the step launches on the same stream.
  void fill(double value, void* stream);
  // Synchronous copies of all bytes(); the caller has waited for the device (synchronize()).
  void upload(const void* host);
  void download(void* host) const;

 private:
  void* context_;
  unsigned long long ptr_ = 0;
  int64_t numel_;
  DType dtype_;
};

// cuCtxSynchronize in `context`: every kernel and copy queued on any of its streams is done.
void synchronize(void* context);

// Why `ptr` is certainly not memory a CUDA kernel can use as a device pointer: not known to the
// driver (e.g. a plain host pointer) or host memory registered with CUDA; "" when it is device or
// managed memory, or when the driver cannot tell (no question is answered by guessing).
std::string device_pointer_problem(void* context, const void* ptr);

}  // namespace optfuse::optim
