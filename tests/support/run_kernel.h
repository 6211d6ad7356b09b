#pragma once
// Runs a compiled kernel on double-valued test data and compares results with the interpreter.
#include <map>
#include <string>
#include <vector>

#include "optfuse/engine.h"

namespace optfuse::testing {

using Tensors = std::map<std::string, std::vector<double>>;
using Scalars = std::map<std::string, double>;

enum class Aliasing { InPlace, OutOfPlace };

// Converts `tensors` to each input's dtype, runs `k` (outputs written over the inputs they replace,
// or to fresh buffers), and returns the outputs, keyed by the input they replace, as doubles.
Tensors run_kernel(const Kernel& k, const Tensors& tensors, const Scalars& scalars,
                   Aliasing aliasing = Aliasing::InPlace);

struct RunOptions {
  Aliasing aliasing = Aliasing::InPlace;
  int64_t cols = 0;        // KernelCall::cols (per-row kernels)
  int64_t batch_rows = 0;  // KernelCall::batch_rows (per-column kernels)
};

// The same, with the kernel's results (KernelCall::results) stored in `*results` by name.
Tensors run_kernel(const Kernel& k, const Tensors& tensors, const Scalars& scalars,
                   const RunOptions& options, Scalars* results);

// Element-wise |got - want| <= abs_tol + rel_tol * |want|; NaN matches NaN and inf matches the
// same inf. Reports the first few mismatches with their index.
void expect_close(const Tensors& got, const Tensors& want, double rel_tol, double abs_tol = 0);

}  // namespace optfuse::testing
