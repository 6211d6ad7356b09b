#pragma once
// The CUDA driver API, looked up at run time (dlopen "libcuda.so.1" + dlsym), so optfuse has no
// link-time CUDA dependency and compiling for CUDA (precompile, warmup) works on machines without
// a driver. Everything optfuse does with CUDA outside Halide's runtime goes through here.
#include <cstddef>
#include <cstdint>
#include <string>

namespace optfuse::jit {

using CuDevicePtr = unsigned long long;  // CUdeviceptr
using CuContext = void*;                 // CUcontext
using CuStream = void*;                  // CUstream

// The entry points optfuse uses (the _v2 ABI names cuda.h maps the plain names to). Each returns
// a CUresult (0 = CUDA_SUCCESS).
struct CudaDriver {
  int (*cuInit)(unsigned flags) = nullptr;
  int (*cuDeviceGetCount)(int* count) = nullptr;
  int (*cuDeviceGet)(int* device, int ordinal) = nullptr;
  int (*cuDeviceGetName)(char* name, int len, int device) = nullptr;
  int (*cuDeviceGetAttribute)(int* value, int attribute, int device) = nullptr;
  int (*cuDevicePrimaryCtxRetain)(CuContext* ctx, int device) = nullptr;
  int (*cuCtxPushCurrent)(CuContext ctx) = nullptr;
  int (*cuCtxPopCurrent)(CuContext* ctx) = nullptr;
  int (*cuCtxSynchronize)() = nullptr;
  int (*cuStreamSynchronize)(CuStream stream) = nullptr;
  int (*cuMemGetInfo)(size_t* free, size_t* total) = nullptr;
  int (*cuMemAlloc)(CuDevicePtr* ptr, size_t bytes) = nullptr;
  int (*cuMemFree)(CuDevicePtr ptr) = nullptr;
  int (*cuMemsetD32)(CuDevicePtr ptr, unsigned value, size_t count) = nullptr;
  int (*cuMemsetD16Async)(CuDevicePtr ptr, unsigned short value, size_t count,
                          CuStream s) = nullptr;
  int (*cuMemsetD32Async)(CuDevicePtr ptr, unsigned value, size_t count, CuStream s) = nullptr;
  int (*cuMemcpyHtoD)(CuDevicePtr dst, const void* src, size_t bytes) = nullptr;
  int (*cuMemcpyDtoH)(void* dst, CuDevicePtr src, size_t bytes) = nullptr;
  int (*cuMemcpyDtoD)(CuDevicePtr dst, CuDevicePtr src, size_t bytes) = nullptr;
  int (*cuPointerGetAttribute)(void* data, int attribute, CuDevicePtr ptr) = nullptr;
  int (*cuGetErrorName)(int result, const char** name) = nullptr;

  // Throws Error "`what` failed: CUresult <n> <NAME>" unless rc is 0.
  void check(int rc, const std::string& what) const;
};

// "" if the CUDA driver loads, initializes and reports at least one device; otherwise why not,
// e.g. "no CUDA driver found (libcuda.so.1 could not be loaded): ..." or "no CUDA device (...)".
std::string cuda_device_problem();

// Throws Error "target `target`: <problem>" when cuda_device_problem() is not empty.
void require_cuda_device(const std::string& target);

// The loaded, initialized driver (cuInit done, at least one device); throws Error with
// cuda_device_problem()'s text otherwise. Loaded once per process and kept loaded: Halide's CUDA
// runtime finds the same library's symbols in the process.
const CudaDriver& cuda_driver();

// The primary context of device `ordinal`, retained once per process and never released: the
// context the CUDA runtime API (and so PyTorch, JAX, CuPy) uses, so their device pointers are
// valid in it. Throws Error.
CuContext cuda_primary_context(int ordinal);

// 256 zeroed bytes of device memory in context `ctx`, allocated on first use and kept for the
// process (never freed, like the primary contexts): the stand-in tensors of an empty kernel call
// that still computes results (Kernel::run; nothing is read from them). Throws Error.
CuDevicePtr cuda_scratch(CuContext ctx);

// Makes `ctx` current on this thread for the scope (cuCtxPushCurrent / cuCtxPopCurrent).
class CudaContextScope {
 public:
  explicit CudaContextScope(CuContext ctx);
  ~CudaContextScope();
  CudaContextScope(const CudaContextScope&) = delete;
  CudaContextScope& operator=(const CudaContextScope&) = delete;
};

}  // namespace optfuse::jit
