#pragma once
// Step-level features change only the gradient an update rule sees:
//
//   g_eff = (grad_accum + grad) * grad_scale
//
// grad_scale = clip_coef / loss_scale / (k when accumulation averages) is ONE runtime scalar
// computed on the host in double per step and rounded once, so the unscaling, clipping and
// averaging happen inside the optimizer's own kernel: no separate pass over the gradients.
// grad_accum (the sum of the first k-1 micro-batch gradients) is read, never written, by the
// update kernel. Only which terms exist is structure (part of the kernel key); a group with none
// of the features runs the rule's graph unchanged (same key as before).
#include <string>

#include "optfuse/graph.h"

namespace optfuse::optim {

inline constexpr char kGradAccum[] = "grad_accum";  // state name of the accumulation buffer
inline constexpr char kGradScale[] = "grad_scale";  // scalar name

struct GradPrologue {
  bool accumulated = false;  // add the "grad_accum" state to the grad
  bool scaled = false;       // multiply by the runtime scalar "grad_scale"

  bool empty() const { return !accumulated && !scaled; }
  // Appended to the graph's name: "" when empty, else e.g. "|gacc|gscale".
  std::string structure() const;
};

// `rule_graph` with every grad input replaced by g_eff (in the grad's dtype). Throws
// internal_error if the rule already uses the names above.
Graph with_grad_prologue(const Graph& rule_graph, const GradPrologue& p);

// The micro-step kernels of gradient accumulation: "grad_accum" = grad (first micro-step: no
// zeroing pass, the old contents are never read) or "grad_accum" = grad_accum + grad. The buffer
// is f32 whatever the gradients' dtype (`grad`: f32, bf16 or f16, widened exactly).
Graph accumulate_graph(bool first, DType grad = DType::F32);

}  // namespace optfuse::optim
