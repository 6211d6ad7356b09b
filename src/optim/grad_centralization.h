#pragma once
// Gradient centralization (Yong et al., "Gradient Centralization: A New Optimization Technique
// for Deep Neural Networks", 2020; MindSpore's `grad_centralization` option): for a tensor with
// >= 2 dims, the gradient minus its mean over all dims but the first, i.e. each row of the
// [shape[0], numel / shape[0]] view minus its mean. 1-D tensors are left alone (MindSpore and the
// paper do the same).
//
// In a graph it is `g - row_mean(g)`: a per-row reduction computed as the prologue of the same
// kernel, so a group with GC still runs ONE kernel per tensor (the row is read twice, the second
// time from cache for rows that fit L2). A group with GC on binds two kernels: this one for its
// tensors with >= 2 dims (KernelCall::cols = numel / shape[0]) and the plain one for 1-D tensors.
#include "optfuse/graph.h"

namespace optfuse::optim {

inline Value centralized(Value g) { return g - row_mean(g); }

}  // namespace optfuse::optim
