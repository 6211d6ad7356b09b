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

#include "optfuse/graph.h"

namespace optfuse::lower {

// A whole-tensor reduction, split so that it runs near memory bandwidth on the CPU:
//   lanes(l, c): chunk c of the tensor reduced into `vector_width` lane partials (vectorized over
//                l, parallel over c; a chunk is one task of `chunk` elements, as for `out`);
//   total():     the lane partials of every chunk combined (a few hundred values).
struct WholeReduction {
  Halide::Func lanes, total;
  Halide::Expr single_task;  // true when one chunk covers the tensor (no thread pool needed)
};

// Per-row reduction of a [rows, cols] view, computed per row inside the element-wise stage's
// row loop (the row is then read again from cache by the update):
//   lanes(l, y): row y reduced into `vector_width` lane partials (vectorized over l);
//   row(y):      the lanes combined.
struct RowReduction {
  Halide::Func lanes, row;
};

// `value(x)` (f64) over [0, n) reduced with reduction op `op` (reduce_*); mean divides by n.
// `chunk`: elements per task; `vector_width`: lanes.
WholeReduction reduce_whole(Op op, const Halide::Func& value, const Halide::Expr& n,
                            const Halide::Expr& chunk, int vector_width, const std::string& name);

// `value(x, y)` (f64), x over [0, cols), reduced along x for each row y with op `op` (row_*).
RowReduction reduce_rows(Op op, const Halide::Func& value, const Halide::Expr& cols,
                         int vector_width, const std::string& name);

// The value the graph sees: `total` or `row(y)` (f64), divided by the count for a mean.
Halide::Expr finish(Op op, const Halide::Expr& reduced, const Halide::Expr& count);

// CPU schedules: `lanes` root, parallel over chunks and vectorized (one task on the calling
// thread when the tensor fits one), `total` root; row reductions computed at `row_loop` (the
// element-wise stage's loop over rows), their lanes vectorized.
void schedule_whole(WholeReduction& r, int vector_width);
void schedule_rows(RowReduction& r, const Halide::LoopLevel& row_loop, int vector_width);

}  // namespace optfuse::lower
