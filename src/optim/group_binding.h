#pragma once
// A param group's binding: its plan (group_plan.h) and each of its tensors' kernel, made once
// per plan and never changed. A tensor records the binding its state was completed for
// (Optimizer's Tensor::bound): a new plan makes a new binding, and its identity is what tells a
// step that a tensor's state must be looked at again.
//
// The kernels compile on a thread of their own, started when the binding is made: a caller
// makes and binds the state buffers (the plan's signatures say which) while they compile, and
// the first step waits for them (kernels()), which also throws a compile's Error, before it
// changes anything. A fresh process's first step thus costs the longer of the two, not both.
#include <cstdint>
#include <future>
#include <memory>
#include <vector>

#include "optfuse/engine.h"
#include "optim/group_plan.h"

namespace optfuse::optim {

// What a binding needs of a tensor to choose its kernel.
struct TensorShape {
  int64_t numel = 0;
  size_t ndim = 0;
};

class GroupBinding {
 public:
  // Chooses each tensor's kernel: the one of its kernel plan (GroupPlan::of), gradient-
  // centralized where GC applies; with tuned schedules, the schedule for its size (a model has
  // few distinct sizes, so this makes few kernels). Every one takes its kernel plan's arguments.
  // Starts compiling them on `engine`, which must outlive the binding: on a thread of its own
  // if `background`, else in the first kernels() call (device kernels load into the CUDA context
  // current on the calling thread).
  GroupBinding(Engine& engine, std::shared_ptr<const GroupPlan> plan,
               const std::vector<TensorShape>& tensors, bool background);
  ~GroupBinding();  // waits for the compile: the engine must not be left compiling for it
  GroupBinding(const GroupBinding&) = delete;
  GroupBinding& operator=(const GroupBinding&) = delete;

  const GroupPlan& plan() const { return *plan_; }
  // Each tensor's kernel, by index in the group: waits for the compile, and throws its Error
  // (at every call: a binding that failed stays failed).
  const std::vector<std::shared_ptr<const Kernel>>& kernels() const { return kernels_.get(); }

 private:
  std::shared_ptr<const GroupPlan> plan_;
  std::shared_future<std::vector<std::shared_ptr<const Kernel>>> kernels_;
};

}  // namespace optfuse::optim
