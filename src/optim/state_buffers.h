#pragma once
// The Optimizer's per-tensor buffers under mixed precision (precision.h): which dtype each state
// buffer has, creating it (or converting it when the group's state_dtype changed), and the
// group-wide dtype rules. Used by optimizer.cpp (step) and state_io.cpp (load).
#include <memory>
#include <string>
#include <vector>

#include "optim/optimizer_state.h"

namespace optfuse::optim {

// The group's precision from its options and its tensors, which must all have one param dtype
// and one grad dtype (each f32, bf16 or f16). Throws Error naming the tensor at fault.
Precision tensors_precision(const Options& h, const std::vector<ParamRef>& refs, size_t group);
Precision group_precision(const OptimizerState::Group& g, size_t group);
// The precision group `g` would have with options `h` (set() checks a change with it).
Precision group_precision(const Options& h, const OptimizerState::Group& g, size_t group);

// A state buffer made (or converted) for a step but not yet installed: phase 2 of step() builds
// all of them before changing anything.
struct PendingState {
  OptimizerState::Tensor* tensor;
  std::string name;
  DType dtype;
  std::vector<float> f32;
  std::vector<double> f64;  // f64 params' state
  std::vector<uint16_t> bf16;
  std::shared_ptr<DeviceBuffer> device;  // device tensors: the buffer, already filled
  std::vector<uint8_t> u8;               // 8-bit state's codes
  int64_t block = 0;                     // their block size (Tensor::state_block)
};

// Appends the buffers `t` lacks for group `g`'s kernel: the master copy from the param's values,
// rule state filled with its initial value, and state held in another dtype (state_dtype or
// master_weights was changed) converted (RNE to 16 bits, exact to f32, 8-bit state decoded or
// encoded with its per-block scales; a changed block_size re-encodes).
// Buffers the caller bound (Optimizer::bind_state) are used as they are; `who` names the tensor.
void plan_state(const UpdateRule& rule, const OptimizerState::Group& g, OptimizerState::Tensor& t,
                const std::string& who, std::vector<PendingState>* out);
// The same for device tensors: buffers allocated in the optimizer's CUDA context and filled with
// the rule's initial value on the step's stream (no master copies: 16-bit params are refused on
// the device, device_support.h). Error if a buffer exists in the other dtype.
void plan_device_state(const OptimizerState& impl, const OptimizerState::Group& g,
                       OptimizerState::Tensor& t, const std::string& who,
                       std::vector<PendingState>* out);
void install(PendingState& p);

// The f32 values of `t`'s buffer `held` (named `name`): widened, or for 8-bit codes decoded with
// their scales at the block size they were made with (Tensor::state_block). Device memory is
// copied to the host: the caller has synchronized the context first.
std::vector<float> state_values_f32(const OptimizerState::Tensor& t, const std::string& name,
                                    const StateBuffer& held);

// The state buffer a kernel input reads (it exists: step() made it).
void* state_pointer(OptimizerState::Tensor& t, const std::string& name, DType dtype);

// Bytes one step moves for a tensor of `numel` elements with `states` rule state buffers; with
// `block` > 0, those are 8-bit codes with one f32 scale per block.
int64_t bytes_per_step(int64_t numel, const Precision& p, int64_t states, int64_t block = 0);

}  // namespace optfuse::optim
