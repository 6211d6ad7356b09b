#pragma once
// Reduction stages of a lowered pipeline (internal; includes Halide.h — src/lower and src/jit
// only). A reduction is computed before the element-wise stage that uses it (a prologue), into a
// small root or per-row Func; the element-wise stage then reads it like any uniform value.
//
// Accumulation is in double for every float dtype (the caller widens the operand), with the
// identity of the combine (0, -inf, +inf) outside the tensor. No stage relies on Halide's
// associativity proof (rfactor): the lane and chunk partials are written out explicitly, so the
// NaN-propagating max/min reduce as easily as the sum.
#include <Halide.h>

#include <string>
#include <vector>

#include "optfuse/graph.h"

namespace optfuse::lower {

// One GPU kernel of a reduction (CUDA targets): block b reduces its own range of elements.
//   lanes(v, t, b): thread t's `vector_width` lane partials (registers), striding over the
//                   block's range one vector at a time (consecutive threads read consecutive
//                   vectors: coalesced, and one 128-bit load per f32 vector);
//   threads(t, b):  thread t's lanes combined; shared memory;
//   acc(b):         the block's `block` thread partials combined in order by one thread;
//   out(b):         acc(b), the kernel's output (a root Func in device memory).
struct BlockReduce {
  Halide::Func lanes, threads, acc, out;
  int vector_width = 1;
};

// A whole-tensor reduction, split so that it runs near memory bandwidth on the CPU:
//   lanes(l, c): chunk c of the tensor reduced into `vector_width` lane partials (vectorized over
//                l, parallel over c; a chunk is one task of `chunk` elements, as for `out`);
//   total():     the lane partials of every chunk combined (a few hundred values).
struct WholeReduction {
  Halide::Func lanes, total;
  Halide::Expr single_task;      // true when one chunk covers the tensor (no thread pool needed)
  std::vector<BlockReduce> gpu;  // CUDA only (reduce_whole_gpu): its two kernels
};

// Per-row reduction of a [rows, cols] view, computed per row inside the element-wise stage's
// row loop (the row is then read again from cache by the update):
//   lanes(l, y): row y reduced into `vector_width` lane partials (vectorized over l): its whole
//                vectors, then a ragged last one;
//   row(y):      the lanes combined.
//   halves:      (power-of-two widths) the lanes combined pairwise, half as many at each step.
struct RowReduction {
  Halide::Func lanes, row;
  std::vector<Halide::Func> halves;
  std::vector<BlockReduce> gpu;  // CUDA only (reduce_rows_gpu): its kernel
};

// `value(x)` (f64; f32 for a max or min of a narrower operand) over [0, n) reduced with reduction
// op `op` (reduce_*); mean divides by n. `chunk`: elements per task; `vector_width`: lanes.
WholeReduction reduce_whole(Op op, const Halide::Func& value, const Halide::Expr& n,
                            const Halide::Expr& chunk, int vector_width, const std::string& name);

// `value(x, y)` (as above), x over [0, cols), reduced along x for each row y with op `op` (row_*).
RowReduction reduce_rows(Op op, const Halide::Func& value, const Halide::Expr& cols,
                         int vector_width, const std::string& name);

// CUDA definitions of the same reductions (same operand, same f64 accumulation and identity, so
// the same NaN semantics; the combine order differs from the CPU's, so sums may differ in the
// last bits of the f64 accumulator):
//   whole: kernel 1, gpu[0], blocks(b) over min(ceil(n / (block * vector_width)), kMaxGpuBlocks)
//          blocks, each a contiguous range of the tensor; kernel 2, gpu[1], one block that
//          combines those partials; `total()` reads gpu[1].out(0).
//   rows:  one kernel, gpu[0], one block per row (y); `row(y)` reads gpu[0].out(y).
// `n` / `cols` may be 0 (an empty call): every partial is the identity and nothing is loaded.
constexpr int kMaxGpuBlocks = 1024;
WholeReduction reduce_whole_gpu(Op op, const Halide::Func& value, const Halide::Expr& n,
                                int vector_width, int block, const std::string& name);
RowReduction reduce_rows_gpu(Op op, const Halide::Func& value, const Halide::Expr& cols,
                             int vector_width, int block, const std::string& name);

// The value the graph sees: `total` or `row(y)` (value's type), divided by the count for a mean.
Halide::Expr finish(Op op, const Halide::Expr& reduced, const Halide::Expr& count);

// CPU schedules: `lanes` root, parallel over chunks and vectorized (one task on the calling
// thread when the tensor fits one), `total` root; row reductions computed at `row_loop` (the
// element-wise stage's loop over rows), their lanes vectorized.
void schedule_whole(WholeReduction& r, int vector_width);
void schedule_rows(RowReduction& r, const Halide::LoopLevel& row_loop, int vector_width);

// CUDA schedules: every BlockReduce `out` root with gpu_blocks over b, its `threads` at the block
// (gpu_threads over t, both stages), `lanes` per thread (vectorized), its `acc` at the block
// (Halide runs block-level code in thread 0 only); `total` / `row` are inlined reads of the last
// kernel's output.
void schedule_gpu(std::vector<BlockReduce>& kernels);

}  // namespace optfuse::lower
