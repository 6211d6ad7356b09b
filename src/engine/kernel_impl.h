#pragma once
// The compiled kernel behind optfuse::Kernel: a JIT'ed `_argv` entry point plus what a call needs
// to build its arguments (signature, resolved schedule, the session that owns the code).
#include <memory>
#include <string>

#include "jit/session.h"
#include "optfuse/engine.h"

namespace optfuse::engine_detail {

// Error unless `call` has the signature's counts of inputs, scalars and outputs, n >= 0, result
// slots where the kernel has results, and a valid cols for a per-row kernel: the checks every
// Kernel implementation makes first (KernelImpl, CompositeKernel in composite.h).
void check_call_arguments(const KernelSignature& sig, const std::string& kernel,
                          const KernelCall& call);

class KernelImpl final : public Kernel {
 public:
  // Largest tensor or scalar count a kernel may have: call arguments live on the stack.
  static constexpr size_t kMaxTensors = 64, kMaxScalars = 64, kMaxResults = 64;

  // Throws Error if the signature exceeds kMaxTensors / kMaxScalars. `device_interface`: the CUDA
  // device interface for kernels of CUDA targets (calls then take device pointers), else null;
  // `cuda_context`: the CUcontext they run in (EngineOptions::cuda_context, resolved).
  KernelImpl(KernelSignature signature, std::string key, std::string name, Schedule resolved,
             std::shared_ptr<jit::Session> session, jit::ArgvFn fn,
             const halide_device_interface_t* device_interface = nullptr,
             void* cuda_context = nullptr);

  const KernelSignature& signature() const override { return signature_; }
  const std::string& key() const override { return key_; }
  const std::string& name() const override { return name_; }
  const Schedule& schedule() const override { return schedule_; }
  void run(const KernelCall& call) const override;

  // What this kernel was built from (also lets tests build a kernel with a doctored signature).
  const std::shared_ptr<jit::Session>& session() const { return session_; }
  jit::ArgvFn entry() const { return fn_; }
  bool on_device() const { return device_interface_ != nullptr; }

  // The parallel task size for `n` elements: few large tasks, or task_elems (see Schedule), a
  // whole number of unrolled vector steps.
  int64_t chunk_for(int64_t n) const;

 private:
  union ScalarValue {
    double f64;
    float f32;
    uint16_t f16;
    bool b;
  };

  void check(const KernelCall& call) const;
  // `empty`: a call with n == 0 that has results to compute (see empty_tensor in the .cpp).
  // `chunk_elems` > 0: the chunk argument, instead of chunk_for(n).
  void run_slice(const KernelCall& call, const ScalarValue* scalars, int64_t offset, int64_t n,
                 bool empty = false, int64_t chunk_elems = 0) const;

  KernelSignature signature_;
  std::string key_, name_;
  Schedule schedule_;
  std::shared_ptr<jit::Session> session_;
  jit::ArgvFn fn_;
  const halide_device_interface_t* device_interface_;
  void* cuda_context_;
};

}  // namespace optfuse::engine_detail
