#pragma once
// Phase 3 of Optimizer::step (optimizer.cpp): every tensor's kernel call, run as ONE parallel
// round over (tensor, slice) pairs for the whole step.
#include <cstdint>
#include <memory>
#include <vector>

#include "optfuse/kernel.h"
#include "optim/optimizer_state.h"
#include "optim/worker_pool.h"

namespace optfuse::optim {

// What runs a step, kept between steps so that a step allocates nothing: the worker pool (made
// at the first round that needs one) and the scratch of the round of kernel calls: each tensor's
// whole call, the slices they are cut into, the runs of slices a thread claims at a time (start
// indices, then the end), and each thread's call for its slice.
struct StepRunner {
  std::unique_ptr<WorkerPool> pool;
  struct Call {
    const Kernel* kernel = nullptr;
    KernelCall call;
  };
  struct Slice {
    uint32_t call;  // index into calls
    int64_t begin, n;
    bool serial;  // KernelCall::serial
  };
  std::vector<Call> calls;
  std::vector<Slice> slices;
  std::vector<size_t> claims;
  std::vector<KernelCall> lanes;
};

// Runs every group's update: computes each tensor's scalars (advancing its step and host state)
// in group order on the caller, then runs the calls. `created` (sorted) holds the tensors whose
// state was made at this step (the rule's created_now).
void run_groups(OptimizerState& impl, StepRunner& runner,
                const std::vector<const OptimizerState::Tensor*>& created);

// The runner's worker pool for a round on the engine's threads (made at the first round that
// needs one, remade if the thread count changed), or null with one thread.
WorkerPool* round_pool(const OptimizerState& impl, StepRunner& runner);

}  // namespace optfuse::optim
