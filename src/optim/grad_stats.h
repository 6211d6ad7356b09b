#pragma once
// The read-only statistics pass before an update: over x = grad (or grad_accum + grad, summed in
// float32 exactly as the update kernel sums them) of every tensor of every group,
//   sumsq  = sum x^2 (double)   -> the 2-norm, and "some element is inf/nan" (sumsq non-finite:
//                                  a float32 square cannot overflow a double, so only inf or nan
//                                  inputs make it non-finite)
//   maxabs = max |x|            -> the inf-norm (inf/nan come from sumsq, see total_norm())
// One pass gives both the clipping norm and the overflow check.
//
// Implementation: a multi-threaded C++ pass (fixed chunks of 64K elements, 8 double lanes per
// chunk so the compiler vectorizes it, chunk partials combined in chunk order on the host, so the
// result does not depend on the thread count). The front end's reduction kernels (issue 4) can
// replace it behind this interface.
#include <cstdint>
#include <vector>

#include "optim/worker_pool.h"

namespace optfuse::optim {

struct GradStats {
  double sumsq = 0;
  double maxabs = 0;
  bool finite() const;
  // The total norm of the gradients as they are (scaled): norm_inf selects the inf-norm. Like
  // torch: nan if any element is nan, else inf if any is inf.
  double total_norm(bool norm_inf) const;
};

struct StatsInput {
  const float* grad = nullptr;
  const float* acc = nullptr;  // null: x = grad
  int64_t n = 0;
};

// `pool` may be null (runs on the caller).
GradStats grad_stats(const std::vector<StatsInput>& tensors, bool want_maxabs, WorkerPool* pool);

}  // namespace optfuse::optim
