#pragma once
// The calling convention of a lowered graph, without Halide (usable anywhere in src/).
#include "optfuse/kernel.h"

namespace optfuse::lower {

// The kernel signature of canonical graph `g`: tensor inputs and scalars in canonical node order
// (canonicalize() numbers them), outputs in kernel_outputs() order.
KernelSignature signature(const Graph& canonical);

// The outputs in the kernel's order: those replacing per-element inputs sorted by the input they
// replace, then those replacing row state, then those replacing column state, each sorted the
// same way (the pipeline's `out`, `row_out` and `col_out` Funcs, lower.h).
std::vector<Output> kernel_outputs(const Graph& g);

}  // namespace optfuse::lower
