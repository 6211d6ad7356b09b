#pragma once
// Lowering of staged graphs: those with column reductions or column state (uses_cols; internal,
// includes Halide.h). The pipeline, for a tensor viewed as [cols, rows] cut into batches of
// batch_rows rows (argv: lower.h, with `batch_rows` after `cols`):
//   * every reduction is a root stage of its own, parallel over tasks of rows (a call of one
//     task runs on the calling thread: jit/parallel.h), computed before the stages that read
//     it, in dependency order: row reductions per row, column reductions per column of each
//     batch (per-task partials, then combined), whole-tensor reductions over the rows
//     (reduce.h); so a whole-tensor reduction may read column reductions (Adafactor's update
//     RMS reads the new column variances). A row reduction of a value a column reduction
//     reduces too is computed in that one's loop over rows: one pass for both (Adafactor's row
//     and column means of g^2);
//   * the row-, column- and batch-level values that other levels read (staged_plan.h) are root
//     Funcs too: one value per row, per column of a batch, per batch;
//   * `out(x, y)`: the per-element outputs, in parallel tasks of whole rows, vectorized along a
//     row, reading its inputs through `load`, the level values from their Funcs;
//   * `row_out(y)` and `col_out(x, b)`: the new row and column state, from the root Funcs;
//   * every stage is realized before any output is written: the `results` Func (always
//     present, realized first) carries one more f64, read from every stage, after the graph's
//     results (argv: one more result buffer, which Kernel::run passes). In-place outputs are
//     then safe: the outputs themselves read only their own element (out, through `load`) or
//     root Funcs computed before.
// CPU targets only (CUDA refuses such graphs before this).
#include <Halide.h>

#include "lower/lower.h"

namespace optfuse::lower {

Lowered lower_staged(const Graph& canonical, const Schedule& s, const Halide::Target& target,
                     const CpuExtras& extras);

}  // namespace optfuse::lower
