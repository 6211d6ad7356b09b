#pragma once
// Schedules for the lowered pipeline (internal; includes Halide.h — src/lower and src/jit only).
#include <Halide.h>

#include <string>
#include <vector>

#include "lower/reduce.h"
#include "optfuse/kernel.h"

namespace optfuse::lower {

// The Funcs of one lowered pipeline (see lower.h); `load` and `uniforms` may be undefined (no
// tensor inputs, no uniform subexpressions), `out` too (a graph with results only), and
// `results` (a graph without results).
constexpr size_t kMaxCases = 2;

struct PipelineFuncs {
  Halide::Func out, load, uniforms;
  Halide::Func row_out;  // per-row graphs with row state: row_out(y), its new values
  // Per-row graphs: the row-level values per-element code reads, computed once per row, before
  // the row's reductions ([0]) and after them ([1]); either may be undefined.
  Halide::Func row_values[2];
  // Graphs with row state: the per-element values both a row reduction and the update read
  // (row_plan.h, RowPlan::fresh), computed per row; rows of at most kMaxRowStateCols elements.
  Halide::Func fresh;
  Halide::Var x;
  Halide::Expr chunk;  // runtime task size in elements, a multiple of the vector width
  std::vector<Halide::ImageParam> inputs;  // the tensor inputs (handles: constraints apply)
  Halide::Func results;                    // 0-D, a Tuple of f64: the graph's results
  std::vector<WholeReduction> whole;       // prologue stages
  std::vector<RowReduction> rows;          // per-row stages (per_row graphs)
  bool per_row = false;                    // 2-D: out(x, y), x along a row of `cols` elements
  Halide::Var y{"y"};
  // Scalar params (bool) that selects in the element loop branch on: the CPU schedules compile
  // a loop for each of their values, in which the select is gone (the Adam graphs' exact
  // divide by a multiply-add, src/optim/exact_division.h).
  std::vector<Halide::Expr> cases;  // at most kMaxCases
  // Loops that get software prefetches (lower/prefetch.h): those whose name contains one of these.
  std::vector<std::string> prefetch_loops;
};

// The branch point between targets: CUDA targets get apply_cuda_schedule, CPU targets
// apply_cpu_schedule; other GPU APIs (OpenCL, Metal, ...) throw Error.
void apply_schedule(PipelineFuncs& f, const Schedule& s, const Halide::Target& target);

// Parallel chunks of `chunk` elements (few large tasks: Halide's pool costs ~0.1 us per task and
// ~30 us per worker wake-up), each a loop of `vector_width`-lane vectors; the one ragged vector at
// the end is predicated (GuardWithIf: in-place updates must not recompute an element, as
// ShiftInwards would, nor touch memory past n, as RoundUp would).
void apply_cpu_schedule(PipelineFuncs& f, const Schedule& s);
void apply_cpu_flat_schedule(PipelineFuncs& f, const Schedule& s);

// Per-row graphs: `out(x, y)` in parallel tasks of whole rows (about `chunk` elements), each row's
// reductions computed at the start of that row, then its update, vectorized along the row.
void apply_cpu_row_schedule(PipelineFuncs& f, const Schedule& s);

// One CUDA kernel: each thread handles `vector_width` consecutive elements as one vector (128-bit
// global loads/stores for f32), gpu_tile'd in blocks of `gpu_block` threads over a grid that
// covers any n; tails guarded (GuardWithIf). `uniforms` is inlined, `chunk` unused (see .cpp).
// Reductions are kernels of their own before it (reduce.h: schedule_gpu); per-row graphs get one
// block per row; `results` stays a host stage (lower.h).
void apply_cuda_schedule(PipelineFuncs& f, const Schedule& s);

}  // namespace optfuse::lower
