#include "optim/device_buffer.h"

#include <cstring>

#include "jit/cuda_driver.h"
#include "optfuse/error.h"
#include "optim/precision.h"

namespace optfuse::optim {

DeviceBuffer::DeviceBuffer(void* context, int64_t numel, DType dtype, const std::string& what)
    : context_(context), numel_(numel), dtype_(dtype) {
  if (!context) internal_error("DeviceBuffer without a CUDA context");
  const jit::CudaDriver& cu = jit::cuda_driver();
  jit::CudaContextScope scope(context_);
  cu.check(cu.cuMemAlloc(&ptr_, bytes()),
           what + ": cuMemAlloc of " + std::to_string(bytes()) + " bytes for optimizer state");
}

DeviceBuffer::~DeviceBuffer() {
  try {
    const jit::CudaDriver& cu = jit::cuda_driver();
    jit::CudaContextScope scope(context_);
    cu.cuMemFree(ptr_);
  } catch (...) {  // no driver any more: nothing to free it with
  }
}

void* DeviceBuffer::data() const { return reinterpret_cast<void*>(static_cast<uintptr_t>(ptr_)); }

size_t DeviceBuffer::bytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }

void DeviceBuffer::fill(double value, void* stream) {
  const jit::CudaDriver& cu = jit::cuda_driver();
  jit::CudaContextScope scope(context_);
  const size_t n = static_cast<size_t>(numel_);
  if (dtype_ == DType::F32) {
    float f = static_cast<float>(value);
    unsigned bits;
    std::memcpy(&bits, &f, sizeof bits);
    cu.check(cu.cuMemsetD32Async(ptr_, bits, n, stream), "cuMemsetD32Async (optimizer state)");
  } else if (dtype_ == DType::BF16) {
    unsigned short bits = to_bf16_bits(static_cast<float>(value));
    cu.check(cu.cuMemsetD16Async(ptr_, bits, n, stream), "cuMemsetD16Async (optimizer state)");
  } else {
    internal_error("DeviceBuffer::fill: state of dtype " + std::string(dtype_name(dtype_)));
  }
}

void DeviceBuffer::upload(const void* host) {
  const jit::CudaDriver& cu = jit::cuda_driver();
  jit::CudaContextScope scope(context_);
  cu.check(cu.cuMemcpyHtoD(ptr_, host, bytes()), "cuMemcpyHtoD (optimizer state)");
}

void DeviceBuffer::download(void* host) const {
  const jit::CudaDriver& cu = jit::cuda_driver();
  jit::CudaContextScope scope(context_);
  cu.check(cu.cuMemcpyDtoH(host, ptr_, bytes()), "cuMemcpyDtoH (optimizer state)");
}

std::string device_pointer_problem(void* context, const void* ptr) {
  constexpr int kMemoryTypeAttribute = 2;  // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
  constexpr unsigned kHostMemory = 1;      // CU_MEMORYTYPE_HOST
  constexpr int kInvalidValue = 1;         // CUDA_ERROR_INVALID_VALUE: not a CUDA pointer
  const jit::CudaDriver& cu = jit::cuda_driver();
  jit::CudaContextScope scope(context);
  unsigned type = 0;
  int rc = cu.cuPointerGetAttribute(
      &type, kMemoryTypeAttribute, static_cast<jit::CuDevicePtr>(reinterpret_cast<uintptr_t>(ptr)));
  if (rc == kInvalidValue) return "is not CUDA memory (the driver does not know it)";
  if (rc == 0 && type == kHostMemory)
    return "is host memory registered with CUDA, not device memory";
  return "";
}

void synchronize(void* context) {
  const jit::CudaDriver& cu = jit::cuda_driver();
  jit::CudaContextScope scope(context);
  cu.check(cu.cuCtxSynchronize(), "cuCtxSynchronize");
}

}  // namespace optfuse::optim
