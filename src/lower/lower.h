#pragma once
// Lowering: a canonical graph -> ONE Halide pipeline (internal header).
//
// This header includes Halide.h (huge): include it only from src/lower and src/jit .cpp files.
//
// The pipeline, for a canonical graph with tensor inputs I, scalars S and outputs O:
//   * every tensor input is an ImageParam(type, 1): flat, 1-D, stride 1;
//   * every scalar is a Param of its dtype: values are call arguments, never compiled in;
//   * `uniforms()`: a 0-D Func holding, as a Tuple, every maximal scalar/constant-only
//     subexpression that a tensor expression uses; computed once per call (compute_root) on CPU
//     targets, inlined into the kernel on GPU targets (schedule.cpp says why);
//   * `load(x)`: a Tuple of every tensor input at x, computed per vector before any output is
//     stored, so in-place updates (output buffer == input buffer) never read a stored value;
//   * `out(x)`: ONE Func returning a Tuple of all outputs, in canonical output order (sorted by
//     the input they replace): p', m', v' come out of one loop.
//   * reductions (reduce.h): prologue stages computed before `out`; whole-tensor ones are root
//     Funcs read through `uniforms`, per-row ones are computed per row inside `out`'s row loop
//     (CPU) or by a kernel of their own before `out` (CUDA: reduce.h, schedule.cpp);
//   * `results()`: a 0-D Func whose Tuple holds the graph's results as f64, sorted by name (a
//     pipeline output realized before `out`; a graph with results only has no `out`). On CUDA
//     targets it is a host stage: Halide copies the 8-byte totals it reads back from the device
//     (the only device->host copy; tensors never move), and the result buffers stay host memory.
// Graphs with per-row reductions are 2-D: every tensor is [cols, rows] (x along a row) and
// `out(x, y)`; the others are 1-D. Graphs with column reductions or column state are staged
// (staged.h): 2-D, every reduction a root stage, and `batch_rows` (int32) after `cols`.
// Halide argument order (the `_argv` entry point): [user_context, inputs..., scalars..., chunk,
// (cols,) results..., outputs...] (results first: see lower.cpp). Halide always appends output
// buffers after the explicit arguments; `chunk` is the runtime task size in elements (a multiple of
// the vector width), computed per call; chunk == 0 marks an empty call that only computes results
// (its tensors are one-element stand-ins, and reductions see zero elements), and chunk < 0 a call
// of a flat graph without reductions that runs as one prefetching task on the calling thread.
// `cols` (int32) exists only for per-row graphs, `batch_rows` (int32) only for staged ones,
// whose `results` has one more f64 after the graph's (staged.h: the stages' fence). `chunk` is
// CPU-only, but GPU kernels take it too (and ignore it), so every target has the same argv layout.
#include <Halide.h>

#include <vector>

#include "optfuse/kernel.h"

namespace optfuse::lower {

Halide::Type halide_type(DType t);

// GPU schedule defaults: elements per thread (one 128-bit f32 access) and threads per block.
constexpr int kGpuVectorWidth = 4, kGpuBlock = 256;

// `s` with defaults filled in for `target`: on CPU targets vector_width 0 becomes twice the
// natural f32 width and gpu_block is reset to 0; on GPU targets vector_width 0 becomes
// kGpuVectorWidth, gpu_block 0 becomes kGpuBlock and the CPU-only fields get their defaults.
Schedule resolve_schedule(Schedule s, const Halide::Target& target);

struct Lowered {
  Halide::Pipeline pipeline;
  std::vector<Halide::Argument> args;  // [inputs..., scalars..., chunk]
};

// What the CPU that runs the kernels has beyond what a Halide 14 target can say (the jit layer
// decides it, and a kernel key names it when it is not empty: jit::cpu_extras_key).
struct CpuExtras {
  // AVX512-BF16's vcvtne2ps2bf16 for f32 -> bf16 narrowing (bf16.h). Halide 14 knows the
  // extension only as part of avx512_sapphirerapids, which Zen 4 CPUs (no AVX512-FP16) lack.
  bool avx512_bf16 = false;
};

// Lowers canonical graph `g` (canonicalize() output) with resolved schedule `s` for `target`.
// Throws Error for graphs it cannot lower (no outputs, a target without a schedule).
Lowered lower(const Graph& canonical, const Schedule& s, const Halide::Target& target,
              const CpuExtras& extras = {});

}  // namespace optfuse::lower
