#pragma once
// The Halide runtime compiled when optfuse was built, for x86-64 Linux CPUs, and linked into the
// library (runtime_gen/): kernels of every x86-64 CPU target link against it, so no process
// spends the ~0.8 s of compiling one at its first kernel (most of a cold start).
#include <memory>
#include <string>
#include <vector>

namespace optfuse::jit {

// The target the embedded runtime is compiled for: no instruction past SSE4.1, so that it runs
// on every x86-64 CPU. (The runtime's code is glue: buffers, errors, the thread pool; the
// kernels carry the vector code, compiled for the CPU.)
inline constexpr char kEmbeddedRuntimeTarget[] = "x86-64-linux-sse41-user_context";

// The embedded runtime object when it serves kernels of `target` (an x86-64 Linux target whose
// features are instruction sets only), else null (a CUDA target, another architecture, a
// debugging or sanitizer feature, a build without one): such a runtime is compiled as before.
std::shared_ptr<const std::vector<char>> embedded_runtime(const std::string& target);

}  // namespace optfuse::jit
