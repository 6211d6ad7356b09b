#pragma once
// One state buffer of one tensor (OptimizerState::Tensor::state), whatever its dtype and memory:
// f32 or f64 values, 16-bit bits or 8-bit codes on the host, a device allocation (device_buffer.h),
// or a buffer the caller owns (Optimizer::bind_state). Every reader asks it for what it needs
// (data(), dtype(), the host values) instead of branching on where the buffer lives.
#include <cstdint>
#include <memory>
#include <vector>

#include "optfuse/optim.h"
#include "optim/device_buffer.h"

namespace optfuse::optim {

class StateBuffer {
 public:
  enum class Kind { HostF32, HostF64, Host16, Host8, Device, Caller };

  static StateBuffer host(std::vector<float> values);
  static StateBuffer host(std::vector<double> values);               // f64 params' state
  static StateBuffer host(DType dtype, std::vector<uint16_t> bits);  // bf16 or f16 bits
  static StateBuffer host(std::vector<uint8_t> codes);               // u8: 8-bit state's codes
  static StateBuffer device(std::shared_ptr<DeviceBuffer> buffer);
  static StateBuffer caller(const TensorRef& buffer);  // used in place, never freed here

  Kind kind() const { return kind_; }
  DType dtype() const { return dtype_; }
  bool caller_owned() const { return kind_ == Kind::Caller; }
  // Device memory (the optimizer's own, or a caller's device buffer).
  bool on_device() const;
  void* data() const;  // what a KernelCall input takes
  int64_t numel() const;
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  // The host f32 values (Kind::HostF32), else null.
  std::vector<float>* f32() { return kind_ == Kind::HostF32 ? &f32_ : nullptr; }
  const std::vector<float>* f32() const { return kind_ == Kind::HostF32 ? &f32_ : nullptr; }
  // The host f64 values (Kind::HostF64), else null.
  const std::vector<double>* f64() const { return kind_ == Kind::HostF64 ? &f64_ : nullptr; }
  // The host 16-bit bits (Kind::Host16), else null.
  const std::vector<uint16_t>* bits() const { return kind_ == Kind::Host16 ? &bits_ : nullptr; }
  // The host 8-bit codes (Kind::Host8), else null.
  const std::vector<uint8_t>* codes() const { return kind_ == Kind::Host8 ? &codes_ : nullptr; }
  // The optimizer's device allocation (Kind::Device), else null.
  DeviceBuffer* device_buffer() const { return device_.get(); }

  // The values as f32 (widened exactly; f64 rounded; u8 codes as their numbers, not decoded).
  // Device memory is
  // copied to the host: the caller has synchronized the context first.
  std::vector<float> to_f32() const;

 private:
  Kind kind_ = Kind::HostF32;
  DType dtype_ = DType::F32;
  std::vector<float> f32_;
  std::vector<double> f64_;
  std::vector<uint16_t> bits_;
  std::vector<uint8_t> codes_;
  std::shared_ptr<DeviceBuffer> device_;  // shared: copies of a Tensor (set()) share the memory
  TensorRef caller_;
};

}  // namespace optfuse::optim
