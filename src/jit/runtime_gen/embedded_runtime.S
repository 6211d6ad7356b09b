// The Halide runtime object runtime_gen wrote (its path: OPTFUSE_RUNTIME_OBJECT, from
// CMakeLists.txt), as read-only bytes between two symbols (jit/embedded_runtime.cpp).
  .section .rodata
  .balign 64
  .globl optfuse_embedded_runtime_begin
  .hidden optfuse_embedded_runtime_begin
optfuse_embedded_runtime_begin:
  .incbin OPTFUSE_RUNTIME_OBJECT
  .globl optfuse_embedded_runtime_end
  .hidden optfuse_embedded_runtime_end
optfuse_embedded_runtime_end:
  .section .note.GNU-stack,"",@progbits
