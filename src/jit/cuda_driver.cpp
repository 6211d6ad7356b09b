#include "jit/cuda_driver.h"

#include <dlfcn.h>

#include "optfuse/error.h"

namespace optfuse::jit {
namespace {

// The three driver entry points used here (CUresult is an int enum; CUDA_SUCCESS is 0).
using CuInit = int (*)(unsigned int flags);
using CuDeviceGetCount = int (*)(int* count);
using CuGetErrorName = int (*)(int error, const char** name);

std::string result_text(int rc, CuGetErrorName name_of) {
  const char* name = nullptr;
  std::string text = "CUresult " + std::to_string(rc);
  if (name_of && name_of(rc, &name) == 0 && name) text += " " + std::string(name);
  return text;
}

}  // namespace

std::string cuda_device_problem() {
  // Kept loaded: the Halide CUDA runtime opens the same library for the kernels it runs.
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    const char* why = dlerror();
    return std::string("no CUDA driver found (libcuda.so.1 could not be loaded): ") +
           (why ? why : "unknown dlopen error");
  }
  auto init = reinterpret_cast<CuInit>(dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<CuDeviceGetCount>(dlsym(lib, "cuDeviceGetCount"));
  auto name_of = reinterpret_cast<CuGetErrorName>(dlsym(lib, "cuGetErrorName"));
  if (!init || !count)
    return "the CUDA driver (libcuda.so.1) lacks cuInit or cuDeviceGetCount";
  if (int rc = init(0); rc != 0)
    return "no CUDA device (cuInit failed: " + result_text(rc, name_of) + ")";
  int devices = 0;
  if (int rc = count(&devices); rc != 0)
    return "no CUDA device (cuDeviceGetCount failed: " + result_text(rc, name_of) + ")";
  if (devices <= 0) return "no CUDA device (the driver reports 0 devices)";
  return "";
}

void require_cuda_device(const std::string& target) {
  std::string problem = cuda_device_problem();
  if (!problem.empty())
    throw Error("target " + target + ": " + problem +
                "; kernels for CUDA targets can still be compiled and cached without a device "
                "(EngineOptions::compile_only, `optfuse warmup`)");
}

}  // namespace optfuse::jit
