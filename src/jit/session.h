#pragma once
// A JIT session: one Jit with the Halide runtime loaded, and the kernels loaded next to it. The
// kernels share the runtime's thread pool and error handler. Kernels keep their session alive
// (shared_ptr), so a kernel outliving its Engine stays callable.
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "jit/jit.h"

struct halide_device_interface_t;  // HalideRuntime.h

namespace optfuse::jit {

// Halide's halide_do_par_for_t (HalideRuntime.h), spelled out so this header needs no Halide.
using DoParFor = int (*)(void* user_context, int (*task)(void*, int, uint8_t*), int min, int size,
                         uint8_t* closure);

using ArgvFn = int (*)(void** args);

// Where a CUDA kernel call runs. Halide's CUDA runtime asks for a context and a stream through
// handlers a CUDA session installs (halide_set_cuda_acquire_context / _get_stream); they answer
// from the call's user context, i.e. from this. Null context: device 0's primary context (see
// cuda_primary_context; only the runtime's own calls outside a kernel call, e.g. test
// allocations, have none). Null stream: that context's default stream.
struct CudaPlacement {
  void* context = nullptr;  // CUcontext
  void* stream = nullptr;   // CUstream
};

// What a kernel call passes as Halide's user context: where the runtime's error handler puts its
// text (the call's own buffer, so concurrent calls on other threads never mix messages) and
// where a CUDA kernel runs.
struct CallContext {
  std::string error;
  CudaPlacement cuda;
  const class Session* session = nullptr;  // the runtime the kernel runs in (parallel.cpp)
};

// The runtime's error handler: appends `message` to the CallContext `user_context` points to.
void capture_halide_error(void* user_context, const char* message);

// The runtime functions a Session calls (`cuda`: a CUDA target's runtime, which has more).
const std::vector<std::string>& runtime_entry_points(bool cuda);
// A new Jit with `runtime_object` linked and every entry point found; throws LinkError naming
// what is missing or unresolvable. Nothing of the runtime runs.
std::unique_ptr<Jit> link_runtime(const std::vector<char>& runtime_object, bool cuda);

class Session {
 public:
  // Loads `runtime_object` (compile_runtime_object()) and sets its thread count and error handler
  // before any kernel runs; `cuda`: the runtime is a CUDA target's (cuda_device_interface()).
  // Throws Error.
  static std::shared_ptr<Session> create(const std::vector<char>& runtime_object, int num_threads,
                                         bool cuda = false);
  // Shuts the runtime's thread pool down before the JIT frees the code its workers run.
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Loads a kernel object and returns its `fn_name`_argv entry point. Thread-safe. Throws
  // LinkError if it does not link, leaving the session as it was (Jit::link).
  ArgvFn load_kernel(const std::vector<char>& object, const std::string& fn_name);

  // The address of a symbol of the loaded runtime or kernels (e.g. "halide_device_malloc", for
  // tests that need the runtime's own CUDA context). Thread-safe; throws Error if absent.
  void* lookup(const std::string& symbol);

  // Calls `fn` with `args` (args[0] is filled in here: the user context). If the kernel fails,
  // throws Error naming `kernel` with the runtime's message. `cuda`: where a CUDA kernel runs.
  void call(ArgvFn fn, void** args, const std::string& kernel,
            const CudaPlacement& cuda = {}) const;

  int num_threads() const { return num_threads_; }
  // The runtime's own halide_do_par_for (its thread pool), which jit::do_par_for replaces.
  DoParFor default_do_par_for() const { return default_do_par_for_; }
  // The loaded runtime's halide_cuda_device_interface(); null unless created with `cuda`.
  const halide_device_interface_t* cuda_device_interface() const { return cuda_interface_; }

 private:
  Session(std::unique_ptr<Jit> jit, int num_threads);

  std::mutex mutex_;
  std::unique_ptr<Jit> jit_;
  int num_threads_;
  void (*shutdown_thread_pool_)() = nullptr;
  DoParFor default_do_par_for_ = nullptr;
  const halide_device_interface_t* cuda_interface_ = nullptr;
};

}  // namespace optfuse::jit
