#pragma once
// Phase 3 of Optimizer::step (optimizer.cpp): every tensor's kernel call, run as ONE parallel
// round over (tensor, slice) pairs for the whole step.
#include <vector>

#include "optim/optimizer_impl.h"

namespace optfuse::optim {

// Runs every group's update: computes each tensor's scalars (advancing its step and host state)
// in group order on the caller, then runs the calls. `created` (sorted) holds the tensors whose
// state was made at this step (the rule's created_now).
void run_groups(Optimizer::Impl& impl, const std::vector<const Optimizer::Impl::Tensor*>& created);

}  // namespace optfuse::optim
