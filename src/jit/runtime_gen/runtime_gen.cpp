// Build-time tool (CMakeLists.txt): writes the Halide runtime that jit/embedded_runtime.h links
// into the library to the object file named by its one argument.
#include <Halide.h>

#include <cstdio>

#include "jit/embedded_runtime.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT.o\n", argv[0]);
    return 2;
  }
  try {
    Halide::compile_standalone_runtime(argv[1],
                                       Halide::Target(optfuse::jit::kEmbeddedRuntimeTarget));
  } catch (const Halide::Error& e) {
    std::fprintf(stderr, "runtime_gen: %s\n", e.what());
    return 1;
  }
  return 0;
}
