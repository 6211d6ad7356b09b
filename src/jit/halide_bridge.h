#pragma once
// Everything the engine needs from libHalide, behind an interface free of Halide types (so only
// src/lower and src/jit .cpp files include Halide.h). Halide's exceptions become optfuse::Error.
#include <string>
#include <vector>

#include "optfuse/kernel.h"

namespace optfuse::jit {

// "host" (also leading, as in "host-cuda") -> the host's Halide target, or $OPTFUSE_HOST_TARGET
// (include/optfuse/engine.h); any other string must be a valid Halide target string.
// Returns the target's canonical text; throws Error naming `target` otherwise.
std::string resolve_target(const std::string& target);

// Whether resolved target `target` runs kernels on a CUDA device.
bool target_uses_cuda(const std::string& target);

// `s` with defaults filled in for `target` (vector_width 0 -> twice the natural f32 width).
Schedule resolve_schedule(const Schedule& s, const std::string& target);

// The object file of canonical graph `g` compiled for `target` (NoRuntime, UserContext), with
// entry points `fn_name` and `fn_name`_argv. See src/lower/lower.h for the argument order.
std::vector<char> compile_kernel_object(const Graph& canonical, const Schedule& s,
                                        const std::string& target, const std::string& fn_name);

// The target text Halide writes into a kernel object compiled for resolved target `target` (the
// target field of its `<fn_name>_metadata`): the kernel target with the features its code
// generator implies, e.g. "x86-64-linux-avx-avx2-no_runtime-sse41-user_context" for
// "x86-64-linux-avx2". "" if `target` is not a valid target string or Halide has no code
// generator for it. Computed once per target.
std::string kernel_object_target(const std::string& target);

// The Halide runtime for `target` as an object file (compiled once per target by the caller).
std::vector<char> compile_runtime_object(const std::string& target);

// Halide's lowered statement (text) for canonical graph `g`.
std::string lowered_stmt(const Graph& canonical, const Schedule& s, const std::string& target);

// Halide and LLVM versions, e.g. "halide-14 (llvm 140) llvm-14.0.6": part of every kernel key.
std::string toolchain_version();

// What kernels for resolved target `target` use of this CPU beyond the target string
// (lower.h, CpuExtras), as text for the kernel key: "" (nothing: the key is the target's alone)
// or e.g. "+avx512bf16" (AVX512-BF16 narrowing: only for a target string equal to this CPU's
// own, on a CPU that has the extension, so a cache shared with a machine without it never hands
// that machine such an object). A function of the string and this CPU alone, so the key and the
// compiled object always agree. So kernels warmed up on a machine without the extension (or
// for any other target string) are misses on one with it, which compiles its own.
std::string cpu_extras_key(const std::string& target);

// Writes `value` converted (round-to-nearest-even) to dtype `t` at `out` (dtype_size(t) bytes).
void encode_scalar(double value, DType t, void* out);

}  // namespace optfuse::jit
