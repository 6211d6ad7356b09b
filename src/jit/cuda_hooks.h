#pragma once
// Halide's CUDA runtime hooks (HalideRuntimeCuda.h: halide_set_cuda_acquire_context, ...),
// installed by every CUDA session: the runtime asks these for a context and a stream, and they
// answer from the call's CallContext (session.h). So kernels run in the caller's context (by
// default device 0's primary context, where PyTorch's tensors live) and on the caller's stream,
// instead of a private context Halide would create, whose pointers no one else could use.
namespace optfuse::jit {

// The call's context; without one (the runtime's own calls outside a kernel call), device 0's
// primary context. On failure reports through capture_halide_error and returns -1.
int acquire_cuda_context(void* user_context, void** ctx, bool create);
// Nothing to unlock: contexts are not ours, and calls on other threads may share them.
int release_cuda_context(void* user_context);
// The call's stream; null (the context's default stream) without one.
int cuda_stream(void* user_context, void* ctx, void** stream);

}  // namespace optfuse::jit
