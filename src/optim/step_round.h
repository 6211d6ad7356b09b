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

// The optimizer's worker pool for a round on the engine's threads (made at the first round that
// needs one, remade if the thread count changed), or null with one thread.
WorkerPool* round_pool(Optimizer::Impl& impl);

}  // namespace optfuse::optim
