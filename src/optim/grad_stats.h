#pragma once
// The read-only statistics pass before an update, over x = grad (or grad_accum + grad, summed in
// float32 exactly as the update kernel sums them) of every tensor of every group:
//   sumsq  = sum x^2, in double   -> the 2-norm, and "some element is inf or nan": a float32
//                                    square cannot overflow a double (nor can 2^30 of them), so
//                                    only inf/nan inputs make sumsq non-finite
//   maxabs = max |x|               -> the inf-norm (only when asked for; nan propagates)
// One pass gives both the clipping norm and the overflow check. It is an Engine kernel built from
// a graph with results (the front end's reductions: sum_squares, max_abs), compiled and cached
// like every update kernel. Like the update (step_round.h), every tensor is cut into slices of a
// fixed size and all slices of the pass run in ONE round of the worker pool, each a serial call;
// the partials are combined on the host in slice order, so the result does not depend on the
// number of threads or on which thread ran what.
#include <cstdint>
#include <vector>

#include "optfuse/engine.h"
#include "optfuse/graph.h"
#include "optim/worker_pool.h"

namespace optfuse::optim {

struct GradStats {
  double sumsq = 0;
  double maxabs = 0;
  bool finite() const;
  // Adds another part's statistics (sums add, the max propagates nan like reduce_max).
  void merge(const GradStats& part);
  // The total norm of the gradients as they are (scaled): norm_inf selects the inf-norm. Like
  // torch: nan if any element is nan, else inf if any is inf.
  double total_norm(bool norm_inf) const;
};

struct StatsInput {
  const Kernel* kernel = nullptr;  // grad_stats_graph's, for this grad's dtype
  const void* grad = nullptr;      // of the kernel's grad dtype
  const float* acc = nullptr;      // null: x = grad
  int64_t n = 0;
};

// The statistics graph: inputs "grad" of dtype `grad` (f32, bf16 or f16: widened exactly to f32)
// and state "grad_accum" (f32) when `accumulated`; results "sumsq" (and "maxabs" when
// `want_maxabs`). No outputs: nothing is written.
Graph grad_stats_graph(bool accumulated, bool want_maxabs, DType grad = DType::F32);

// The pass's scratch, kept between steps so that a step allocates nothing once warm.
struct StatsRound {
  struct Slice {
    const StatsInput* tensor;
    int64_t begin, n;
  };
  std::vector<Slice> slices;
  std::vector<size_t> claims;
  std::vector<GradStats> partial;  // per slice
  std::vector<KernelCall> lanes;   // per thread
};

// Runs each input's kernel (from grad_stats_graph, with `accumulated` iff the input has acc)
// over all inputs, as one round on `pool` (null: on the caller).
GradStats grad_stats(const std::vector<StatsInput>& tensors, WorkerPool* pool, StatsRound* scratch);

}  // namespace optfuse::optim
