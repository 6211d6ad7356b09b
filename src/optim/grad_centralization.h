#pragma once
// Gradient centralization (Yong et al., "Gradient Centralization: A New Optimization Technique
// for Deep Neural Networks", 2020; MindSpore's `grad_centralization` option): for a tensor with
// >= 2 dims, the gradient minus its mean over all dims but the first, i.e. each row of the
// [shape[0], numel / shape[0]] view minus its mean. 1-D tensors are left alone (MindSpore and the
// paper do the same).
//
// It is a transform of a group's graph (group_plan.cpp's list), where the rule says: a rule that
// offers the option labels its effective gradient (effective_grad(): the gradient as its update
// reads it, after the sign and a coupled weight decay, as MindSpore's optimizers centralize it),
// and centralize() rewrites that value to `g - row_mean(g)`: a per-row reduction computed as the
// prologue of the same kernel, so a group with GC still runs ONE kernel per tensor (the row is
// read twice, the second time from cache for rows that fit L2). A group with GC on binds two
// kernels: this one for its tensors with >= 2 dims (KernelCall::cols = numel / shape[0]) and
// the plain one for 1-D tensors.
#include "optfuse/graph.h"

namespace optfuse::optim {

// The label of a rule's effective gradient.
inline constexpr const char* kEffectiveGrad = "effective_grad";

// In a rule's graph: labels `g` as its effective gradient and returns it.
inline Value effective_grad(Value g) {
  g.graph()->label(kEffectiveGrad, g);
  return g;
}

// `g` with its effective gradient centralized, named "<name>_gc". Error naming the graph if it
// labels none (its rule does not offer grad_centralization).
Graph centralize(const Graph& g);

}  // namespace optfuse::optim
