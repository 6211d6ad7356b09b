#pragma once
// Is there a usable CUDA driver and device? Looked up at run time (dlopen "libcuda.so.1" + dlsym
// cuInit / cuDeviceGetCount), so optfuse has no link-time CUDA dependency and compiling for CUDA
// (precompile, warmup) works on machines without a driver.
#include <string>

namespace optfuse::jit {

// "" if the CUDA driver loads, initializes and reports at least one device; otherwise why not,
// e.g. "no CUDA driver found (libcuda.so.1 could not be loaded): ..." or "no CUDA device (...)".
std::string cuda_device_problem();

// Throws Error "target `target`: <problem>" when cuda_device_problem() is not empty.
void require_cuda_device(const std::string& target);

}  // namespace optfuse::jit
