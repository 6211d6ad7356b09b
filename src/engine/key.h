#pragma once
// Cache keys: XXH3-128 over everything that changes the compiled code, as 32 hex digits.
#include <string>

#include "optfuse/engine.h"

namespace optfuse::engine_detail {

// The key of a kernel: the canonical graph's structural hash, the resolved schedule, the resolved
// target, optfuse's version and the Halide/LLVM versions.
std::string kernel_key(const Hash128& graph_hash, const Schedule& resolved,
                       const std::string& target);

// The key of the Halide runtime object for `target` (stored next to kernels in an ObjectStore).
std::string runtime_key(const std::string& target);

}  // namespace optfuse::engine_detail
