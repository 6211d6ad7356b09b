#pragma once
// optfuse.torch's step in C++: everything a step does between Python's `opt.step()` and the
// kernels, so that its Python work is the same for 10 tensors or 10,000.
//
// A TorchStep is made by the Python binding (python/optfuse/torch/_binding.py) once
// it has built the C++ optimizer over torch's params and bound torch's state tensors. Each
// step() then, in C++ and before any kernel runs:
//   1. checks the binding still holds: the same param_groups, the same params with gradients in
//      each, the same optimizer.state dicts, each param's memory, shape and strides unchanged;
//      otherwise it asks Python to bind again (Outcome::Rebind), changing nothing;
//   2. checks every gradient: its dtype, device, shape, storage (large enough for its shape and
//      strides) and layout; a gradient in another dim order than its param is copied into the
//      param's (the kernels pair elements by memory position); a bad one is ValueError naming
//      the group, index, shape and what differs, and nothing is updated;
//   3. points the C++ optimizer at gradients whose memory moved (zero_grad(set_to_none=True));
//   4. passes each changed hyperparameter of each group (a scheduler's lr) to C++, and asks
//      Python to rebind a group's state if its buffers changed (Outcome::Restate: amsgrad,
//      state_dtype, block_size);
//   5. runs the step with the GIL released; after an applied step, bumps the params' autograd
//      versions (as torch's in-place updates do) and copies staged params back.
// This header has no torch or nanobind types: torch_step.cpp and torch_tensors.cpp are the units
// built against torch's headers (C++20, as they need), module.cpp the one built against nanobind's.
#include <Python.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "optfuse/optim.h"

namespace optfuse::python {

// How a bound param's values reach the kernels.
enum class ParamMode {
  Direct,   // its own memory: contiguous, or dense in another dim order (channels_last, a
            // transpose), its state then in the same strides
  DTensor,  // a DTensor's local shard (FSDP2's fully_shard), its `_local_tensor`
  Staged,   // a contiguous copy (a param that is not dense: a view with gaps), filled before
            // every step and copied back after an applied one
};

struct BoundParam {
  PyObject* param = nullptr;  // as it sits in its group's "params"
  PyObject* work = nullptr;   // what the kernels update: param, its local shard, or the copy
  size_t torch_group = 0;     // its place in optimizer.param_groups and the group's "params"
  size_t position = 0;
  size_t group = 0;  // its C++ group and tensor index there
  size_t index = 0;
  ParamMode mode = ParamMode::Direct;
  DType grad_dtype = DType::F32;  // as bound
  void* grad_ptr = nullptr;       // the gradient memory bound in C++
  std::string name;               // for messages: "param group 0, param 3 (shape ..., dtype)"
};

// One C++ group (the params of one dtype of a torch group), in C++ group order.
struct BoundGroup {
  size_t torch_group = 0;         // the torch group whose options it takes
  std::vector<std::string> keys;  // the options the C++ rule takes
  PyObject* synced = nullptr;     // dict: key -> the value last given to C++ (kept up to date)
};

struct Outcome {
  enum class Kind { Ran, Rebind, Restate } kind = Kind::Ran;
  StepResult result;  // Ran
  size_t group = 0;   // Restate: the C++ group whose state buffers changed ...
  Options old_block;  // ... and the block_size its 8-bit state was held at (null:
                      // the default)
};

// The gradient memory of `param` the kernels read, at binding (it checks the gradient as each
// step does, against `work`, what the kernels update): the gradient's own, or a copy in the
// param's layout (`copy`, a new reference the caller keeps alive while it is bound; else null).
struct BoundGrad {
  void* data = nullptr;
  PyObject* copy = nullptr;
  DType dtype = DType::F32;
};
BoundGrad bind_grad(PyObject* param, PyObject* work, bool dtensor, const std::string& who);

class TorchStep {
 public:
  // `params` with their gradients' C++ binding as Python made it; `idle_steps`: the
  // state['step'] tensors of params that have a gradient but no elements here (an FSDP2 shard
  // that is empty on this rank), advanced by one with every applied step as torch does.
  // `dense_grads` false: Python binds the gradients (SparseAdam). Takes references to every
  // object, and the snapshot of `param_groups` and `state` that step() compares against.
  TorchStep(Optimizer* opt, std::vector<BoundParam> params, std::vector<BoundGroup> groups,
            std::vector<PyObject*> idle_steps, bool dense_grads, PyObject* param_groups,
            PyObject* state);
  ~TorchStep();
  TorchStep(const TorchStep&) = delete;
  TorchStep& operator=(const TorchStep&) = delete;

  // One step (see the top of this file); `cuda_stream` as StepArgs takes it.
  Outcome step(PyObject* param_groups, PyObject* state, void* cuda_stream);
  // Python rebound group `group`'s state after a Restate: take its new buffers as the snapshot.
  void restated(size_t group, PyObject* state);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace optfuse::python
