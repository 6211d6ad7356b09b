#include "jit/cuda_hooks.h"

#include <exception>

#include "jit/cuda_driver.h"
#include "jit/session.h"

namespace optfuse::jit {

int acquire_cuda_context(void* user_context, void** ctx, bool /*create*/) {
  auto* call = static_cast<CallContext*>(user_context);
  if (call && call->cuda.context) {
    *ctx = call->cuda.context;
    return 0;
  }
  try {
    *ctx = cuda_primary_context(0);
    return 0;
  } catch (const std::exception& e) {
    capture_halide_error(user_context, e.what());
    return -1;  // halide_error_code_generic_error
  }
}

int release_cuda_context(void*) { return 0; }

int cuda_stream(void* user_context, void*, void** stream) {
  auto* call = static_cast<CallContext*>(user_context);
  *stream = call ? call->cuda.stream : nullptr;
  return 0;
}

}  // namespace optfuse::jit
