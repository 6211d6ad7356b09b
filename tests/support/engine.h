#pragma once
// One engine per test process: the Halide runtime is compiled once (~0.8 s) and every structure
// compiles once, however many tests use it.
#include "optfuse/engine.h"

namespace optfuse::testing {

inline Engine& shared_engine() {
  static Engine e;
  return e;
}

}  // namespace optfuse::testing
