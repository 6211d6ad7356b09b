#pragma once
// The `load` stage's stack buffers, forwarded to their readers (internal; LLVM only).
//
// Why: `load` (lower.h) is computed per vector into small stack buffers, so that every input of
// a vector is read before any output of it is stored. Halide keeps those buffers for the whole
// function, and the tail vector's code writes them with a masked store and reads them back
// whole, so LLVM must keep each buffer's last contents: its loop optimizations move the main
// loop's stores to the loop's exit, and the loaded vectors then stay live through every
// iteration. On AVX2 (16 vector registers) the unmastered bf16 AdamW loop spilled each of them
// to the stack every iteration and reloaded them from memory: 7 of its 169 instructions per 16
// elements, and registers that its arithmetic then spilled too (src/lower/README.md,
// "The load stage's buffers").
//
// How: a buffer is a set of slots, each read and written whole (Halide reads a 16-lane f32 buffer
// as two 8-lane halves); a read of a slot takes the value of that slot's write before it in its
// block (a masked store's lanes, zero elsewhere: lanes past the tensor's end, whose outputs are
// never stored), and the buffer is then removed with its writes. A buffer with a read that has no
// such write, with accesses that overlap without covering the same bytes, or with any use but
// loads, stores, masked stores and constant-offset casts of its address, is left as it is. Run
// before passes that split blocks (src/jit/kernel_object.cpp).
namespace llvm {
class Module;
}

namespace optfuse::lower {

// src/jit/kernel_object.cpp runs it on the module Halide makes, before code generation.
void finish_load_stage_pass(llvm::Module& m);

}  // namespace optfuse::lower
