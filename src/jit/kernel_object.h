#pragma once
// A Halide module to an object file through LLVM, with one step between Halide's code
// generation and LLVM's: every prefetch is made a prefetch into all cache levels.
//
// Halide 14 emits each Call::prefetch as llvm.prefetch with locality 0, which x86 compiles to
// prefetchnta. For the streaming loops of optfuse's kernels (lower/prefetch.h) that made a fused
// AdamW twice as slow, while prefetcht0 (locality 3) brought it to the memory-bandwidth ceiling.
#include <vector>

namespace Halide {
class Module;
}

namespace optfuse::jit {

std::vector<char> compile_module_to_object(const Halide::Module& m);

}  // namespace optfuse::jit
