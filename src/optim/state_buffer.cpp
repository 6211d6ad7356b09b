#include "optim/state_buffer.h"

#include "optfuse/error.h"
#include "optim/precision.h"

namespace optfuse::optim {

StateBuffer StateBuffer::host(std::vector<float> values) {
  StateBuffer b;
  b.f32_ = std::move(values);
  return b;
}

StateBuffer StateBuffer::host(std::vector<double> values) {
  StateBuffer b;
  b.kind_ = Kind::HostF64;
  b.dtype_ = DType::F64;
  b.f64_ = std::move(values);
  return b;
}

StateBuffer StateBuffer::host(DType dtype, std::vector<uint16_t> bits) {
  StateBuffer b;
  b.kind_ = Kind::Host16;
  b.dtype_ = dtype;
  b.bits_ = std::move(bits);
  return b;
}

StateBuffer StateBuffer::host(std::vector<uint8_t> codes) {
  StateBuffer b;
  b.kind_ = Kind::Host8;
  b.dtype_ = DType::U8;
  b.codes_ = std::move(codes);
  return b;
}

StateBuffer StateBuffer::device(std::shared_ptr<DeviceBuffer> buffer) {
  StateBuffer b;
  b.kind_ = Kind::Device;
  b.dtype_ = buffer->dtype();
  b.device_ = std::move(buffer);
  return b;
}

StateBuffer StateBuffer::caller(const TensorRef& buffer) {
  StateBuffer b;
  b.kind_ = Kind::Caller;
  b.dtype_ = buffer.dtype;
  b.caller_ = buffer;
  return b;
}

bool StateBuffer::on_device() const {
  return kind_ == Kind::Device || (kind_ == Kind::Caller && caller_.memory == Memory::Cuda);
}

void* StateBuffer::data() const {
  switch (kind_) {
    case Kind::HostF32:
      return const_cast<float*>(f32_.data());
    case Kind::HostF64:
      return const_cast<double*>(f64_.data());
    case Kind::Host16:
      return const_cast<uint16_t*>(bits_.data());
    case Kind::Host8:
      return const_cast<uint8_t*>(codes_.data());
    case Kind::Device:
      return device_->data();
    case Kind::Caller:
      return caller_.data;
  }
  return nullptr;
}

int64_t StateBuffer::numel() const {
  switch (kind_) {
    case Kind::HostF32:
      return static_cast<int64_t>(f32_.size());
    case Kind::HostF64:
      return static_cast<int64_t>(f64_.size());
    case Kind::Host16:
      return static_cast<int64_t>(bits_.size());
    case Kind::Host8:
      return static_cast<int64_t>(codes_.size());
    case Kind::Device:
      return device_->numel();
    case Kind::Caller:
      return caller_.numel;
  }
  return 0;
}

std::vector<float> StateBuffer::to_f32() const {
  if (kind_ == Kind::HostF32) return f32_;
  if (!on_device()) return widen_to_f32(data(), dtype_, numel());
  if (!device_) internal_error("a caller's device state is read by its owner");
  std::vector<uint8_t> host(bytes());
  device_->download(host.data());
  return widen_to_f32(host.data(), dtype_, numel());
}

}  // namespace optfuse::optim
