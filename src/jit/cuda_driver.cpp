#include "jit/cuda_driver.h"

#include <dlfcn.h>

#include <map>
#include <mutex>
#include <type_traits>

#include "optfuse/error.h"

namespace optfuse::jit {
namespace {

std::string result_text(int rc, const CudaDriver& cu) {
  const char* name = nullptr;
  std::string text = "CUresult " + std::to_string(rc);
  if (cu.cuGetErrorName && cu.cuGetErrorName(rc, &name) == 0 && name)
    text += " " + std::string(name);
  return text;
}

// The driver, loaded and initialized once; `problem` says why not ("" when usable).
struct LoadedDriver {
  CudaDriver cu;
  std::string problem;
};

LoadedDriver load_driver() {
  LoadedDriver d;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    const char* why = dlerror();
    d.problem = std::string("no CUDA driver found (libcuda.so.1 could not be loaded): ") +
                (why ? why : "unknown dlopen error");
    return d;
  }
  std::string missing;
  auto get = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    if (!fn) missing += (missing.empty() ? "" : ", ") + std::string(name);
  };
  CudaDriver& cu = d.cu;
  get(cu.cuInit, "cuInit");
  get(cu.cuDeviceGetCount, "cuDeviceGetCount");
  get(cu.cuDeviceGet, "cuDeviceGet");
  get(cu.cuDeviceGetName, "cuDeviceGetName");
  get(cu.cuDeviceGetAttribute, "cuDeviceGetAttribute");
  get(cu.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  get(cu.cuCtxPushCurrent, "cuCtxPushCurrent_v2");
  get(cu.cuCtxPopCurrent, "cuCtxPopCurrent_v2");
  get(cu.cuCtxSynchronize, "cuCtxSynchronize");
  get(cu.cuStreamSynchronize, "cuStreamSynchronize");
  get(cu.cuMemGetInfo, "cuMemGetInfo_v2");
  get(cu.cuMemAlloc, "cuMemAlloc_v2");
  get(cu.cuMemFree, "cuMemFree_v2");
  get(cu.cuMemsetD32, "cuMemsetD32_v2");
  get(cu.cuMemsetD16Async, "cuMemsetD16Async");
  get(cu.cuMemsetD32Async, "cuMemsetD32Async");
  get(cu.cuMemcpyHtoD, "cuMemcpyHtoD_v2");
  get(cu.cuMemcpyDtoH, "cuMemcpyDtoH_v2");
  get(cu.cuMemcpyDtoD, "cuMemcpyDtoD_v2");
  get(cu.cuPointerGetAttribute, "cuPointerGetAttribute");
  get(cu.cuGetErrorName, "cuGetErrorName");
  if (!missing.empty()) {
    d.problem = "the CUDA driver (libcuda.so.1) lacks " + missing;
    return d;
  }
  if (int rc = cu.cuInit(0); rc != 0) {
    d.problem = "no CUDA device (cuInit failed: " + result_text(rc, cu) + ")";
    return d;
  }
  int devices = 0;
  if (int rc = cu.cuDeviceGetCount(&devices); rc != 0)
    d.problem = "no CUDA device (cuDeviceGetCount failed: " + result_text(rc, cu) + ")";
  else if (devices <= 0)
    d.problem = "no CUDA device (the driver reports 0 devices)";
  return d;
}

const LoadedDriver& loaded() {
  static const LoadedDriver d = load_driver();
  return d;
}

}  // namespace

void CudaDriver::check(int rc, const std::string& what) const {
  if (rc != 0) throw Error(what + " failed: " + result_text(rc, *this));
}

std::string cuda_device_problem() { return loaded().problem; }

void require_cuda_device(const std::string& target) {
  std::string problem = cuda_device_problem();
  if (!problem.empty())
    throw Error("target " + target + ": " + problem +
                "; kernels for CUDA targets can still be compiled and cached without a device "
                "(EngineOptions::compile_only, `optfuse warmup`)");
}

const CudaDriver& cuda_driver() {
  const LoadedDriver& d = loaded();
  if (!d.problem.empty()) throw Error(d.problem);
  return d.cu;
}

CuContext cuda_primary_context(int ordinal) {
  static std::mutex mutex;
  static std::map<int, CuContext> retained;
  const CudaDriver& cu = cuda_driver();
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = retained.find(ordinal); it != retained.end()) return it->second;
  int device = 0;
  cu.check(cu.cuDeviceGet(&device, ordinal), "cuDeviceGet(" + std::to_string(ordinal) + ")");
  CuContext ctx = nullptr;
  cu.check(cu.cuDevicePrimaryCtxRetain(&ctx, device),
           "cuDevicePrimaryCtxRetain(device " + std::to_string(ordinal) + ")");
  return retained[ordinal] = ctx;
}

CuDevicePtr cuda_scratch(CuContext ctx) {
  static std::mutex mutex;
  static std::map<CuContext, CuDevicePtr> scratch;
  const CudaDriver& cu = cuda_driver();
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = scratch.find(ctx); it != scratch.end()) return it->second;
  CudaContextScope scope(ctx);
  CuDevicePtr p = 0;
  cu.check(cu.cuMemAlloc(&p, 256), "cuMemAlloc(256 bytes of scratch)");
  cu.check(cu.cuMemsetD32(p, 0, 64), "cuMemsetD32(scratch)");
  return scratch[ctx] = p;
}

CudaContextScope::CudaContextScope(CuContext ctx) {
  const CudaDriver& cu = cuda_driver();
  cu.check(cu.cuCtxPushCurrent(ctx), "cuCtxPushCurrent");
}

CudaContextScope::~CudaContextScope() {
  CuContext old = nullptr;
  cuda_driver().cuCtxPopCurrent(&old);
}

}  // namespace optfuse::jit
