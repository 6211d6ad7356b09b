#pragma once
// One engine per test process: the Halide runtime is compiled once (~0.8 s) and every structure
// compiles once, however many tests use it. Its kernels go to the disk cache CTest points
// $OPTFUSE_CACHE_DIR at (tests/CMakeLists.txt), so the run's other test processes load them.
#include "optfuse/engine.h"

namespace optfuse::testing {

inline Engine& shared_engine() {
  static Engine e;
  return e;
}

// For tests that count compilations: an engine that starts with nothing compiled, whatever the
// disk cache holds from other tests or earlier runs.
inline EngineOptions memory_only(EngineOptions o = {}) {
  o.memory_only = true;
  return o;
}

}  // namespace optfuse::testing
