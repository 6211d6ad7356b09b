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

// Staged graphs (column reductions or column state, staged.h): a tensor is [cols, rows] cut
// into batches of batch_rows rows, and each reduction is a root stage, parallel over tasks of
// `rows_per_task` rows (the last task's rows past the end are clamped to the last row and
// contribute the identity, so every load stays inside the buffers):
//   whole:   lanes(l, t): task t's rows reduced into `vector_width` lane partials (vectorized
//            over l: the rows' whole vectors, then each row's ragged last one); total();
//   columns: partial(x, t, b): task t of batch b's rows reduced per column (vectorized over x),
//            tasks never crossing a batch; col(x, b): the tasks' partials combined;
//   batches: of a value the same along a row, value(y): batch(b) over its batch_rows rows.
struct ColReduction {
  Halide::Func partial, col;
  Halide::RDom rows;  // partial's rows of a task
};
//   rows in columns: a row reduction of the same value, in the column partials' loop over rows
//            (compute_with: one pass over the value for both): lanes(l, k, t, b), row k of task
//            t of batch b in `vector_width` lanes; row(y): the lanes combined.
struct RowsInCols {
  Halide::Func lanes, row;
};
WholeReduction reduce_whole_rows(Op op, const Halide::Func& value, const Halide::Expr& cols,
                                 const Halide::Expr& rows, const Halide::Expr& rows_per_task,
                                 int vector_width, const std::string& name);
ColReduction reduce_cols(Op op, const Halide::Func& value, const Halide::Expr& batch_rows,
                         const Halide::Expr& rows_per_task, const std::string& name);
Halide::Func reduce_batches(Op op, const Halide::Func& value, const Halide::Expr& batch_rows,
                            const std::string& name);
RowsInCols reduce_rows_in_cols(Op op, const Halide::Func& value, const Halide::Expr& cols,
                               const Halide::Expr& batch_rows, const Halide::Expr& rows_per_task,
                               const ColReduction& partner, int vector_width,
                               const std::string& name);

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

// The value the graph sees: `total`, `row(y)`, `col(x, b)` or `batch(b)` (value's type),
// divided by the count for a mean.
Halide::Expr finish(Op op, const Halide::Expr& reduced, const Halide::Expr& count);

// CPU schedules: `lanes` root, parallel over chunks and vectorized (one task on the calling
// thread when the tensor fits one), `total` root; row reductions computed at `row_loop` (the
// element-wise stage's loop over rows), their lanes vectorized.
void schedule_whole(WholeReduction& r, int vector_width);
void schedule_rows(RowReduction& r, const Halide::LoopLevel& row_loop, int vector_width);
// Staged graphs (a parallel loop of one task runs on the calling thread: jit/parallel.h):
// whole reductions as schedule_whole, over tasks of rows; row reductions root, parallel over
// tasks of `rows_per_task` of the `rows` rows, each row's lanes computed in the task's row loop;
// column partials root, vectorized along the row, parallel over (task, batch) in groups of
// about `rows_per_task` rows, `col` root; rows in columns fused into their partner's loop over
// rows, `row` root.
void schedule_whole_rows(WholeReduction& r, int vector_width);
void schedule_rows_root(RowReduction& r, const Halide::Expr& rows,
                        const Halide::Expr& rows_per_task, int vector_width);
void schedule_cols(ColReduction& r, const Halide::Expr& batch_rows,
                   const Halide::Expr& rows_per_task, int vector_width);
void schedule_rows_in_cols(RowsInCols& r, ColReduction& partner, const Halide::Expr& batch_rows,
                           const Halide::Expr& rows_per_task, int vector_width);

// CUDA schedules: every BlockReduce `out` root with gpu_blocks over b, its `threads` at the block
// (gpu_threads over t, both stages), `lanes` per thread (vectorized), its `acc` at the block
// (Halide runs block-level code in thread 0 only); `total` / `row` are inlined reads of the last
// kernel's output.
void schedule_gpu(std::vector<BlockReduce>& kernels);

}  // namespace optfuse::lower
