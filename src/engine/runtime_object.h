#pragma once
// The Halide runtime object of each target, compiled at most once per process.
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace optfuse::engine_detail {

// The runtime object for `target`: the one built into the library where it serves the target
// (jit/embedded_runtime.h), else compiled at most once per target per process (~0.8 s) and
// shared by every engine; each engine loads its own copy into its own JIT (~5 ms). Concurrent
// callers wait for one compile, not repeat it. `*compiled` says whether this process compiled
// it for this call (here, or on the thread compile_runtime_soon started).
std::shared_ptr<const std::vector<char>> runtime_object(const std::string& target, bool* compiled);

// Starts compiling `target`'s runtime object on a thread of its own, unless it is built in,
// compiled or compiling, or `stored()` (asked only then: a read of the store) says the caller
// has it already: a cold start then compiles it beside its first kernel (the two take about the
// same time, on two cores). runtime_object() waits for it; an error it meets is thrown there.
void compile_runtime_soon(const std::string& target, const std::function<bool()>& stored);

}  // namespace optfuse::engine_detail
