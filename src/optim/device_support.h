#pragma once
// Where an optimizer's tensors live, and what does not run on device tensors yet.
//
// An optimizer's memory is its engine's: CUDA device memory when the engine's target uses CUDA,
// host memory otherwise; every param and grad must be in it. On device tensors, the features that
// need a reduction kernel on the GPU (clipping, loss scaling, gradient centralization, LAMB, LARS,
// Adafactor, custom rules with reductions) and row-sparse gradients are refused here,
// each with an Error naming it: lifting one is a change to this file (and to the step path it then
// reaches), nowhere else.
#include <functional>
#include <string>
#include <vector>

#include "optfuse/optim.h"
#include "optim/precision.h"
#include "optim/rule.h"
#include "optim/step_options.h"

namespace optfuse::optim {

// Memory::Cuda for an engine whose target uses CUDA (compile-only engines included), else Host.
Memory engine_memory(const Engine& engine);

// The tensors of a group being added (or a new grad): each param and grad in the same memory as
// every other tensor of the optimizer (`existing`: the memory of its tensors so far, if any), and
// that memory the engine's. Error naming the group and tensor (`who(i)`) otherwise.
void check_group_memory(const std::vector<ParamRef>& params, const Memory* existing, Memory engine,
                        const std::string& target, const std::function<std::string(size_t)>& who);
void check_grad_memory(const TensorRef& grad, Memory engine, const std::string& who);
// Device tensors with a CUDA context (not compile-only engines): the driver knows `t.data` as
// device (or managed) memory; Error naming `what` and `who` otherwise. A host pointer mislabelled
// Memory::Cuda would otherwise fault inside a kernel, a sticky error that ends the CUDA context.
void check_device_pointer(void* context, const TensorRef& t, const char* what,
                          const std::string& who);

// Device tensors only (no-ops for Memory::Host):
// the optimizer-wide features (Optimizer::create);
void check_device_config(Memory m, const UpdateRule& rule, const StepOptions& step);
// a group's options, merged (create's defaults, add_param_group, set);
void check_device_group(Memory m, const UpdateRule& rule, const Options& options,
                        const std::string& where);
// a group's param dtype (add_param_group);
void check_device_params(Memory m, DType param, const std::string& where);
// a step's arguments.
void check_step_args(Memory m, const StepArgs& args);

}  // namespace optfuse::optim
