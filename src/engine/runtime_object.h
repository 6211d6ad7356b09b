#pragma once
// The Halide runtime object of each target, compiled at most once per process.
#include <memory>
#include <string>
#include <vector>

namespace optfuse::engine_detail {

// The runtime object for `target`, compiled at most once per target per process (~0.8 s) and
// shared by every engine; each engine loads its own copy into its own JIT (~5 ms). Concurrent
// callers wait for one compile, not repeat it. `*compiled` says whether this call compiled it.
std::shared_ptr<const std::vector<char>> runtime_object(const std::string& target, bool* compiled);

}  // namespace optfuse::engine_detail
