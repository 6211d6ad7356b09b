#pragma once
// The calling convention of a lowered graph, without Halide (usable anywhere in src/).
#include "optfuse/kernel.h"

namespace optfuse::lower {

// The kernel signature of canonical graph `g`: tensor inputs and scalars in canonical node order
// (canonicalize() numbers them), outputs sorted by the input they replace.
KernelSignature signature(const Graph& canonical);

}  // namespace optfuse::lower
