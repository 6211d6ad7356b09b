#include "lower/reduce.h"

#include "lower/lower_ops.h"
#include "optfuse/error.h"

namespace optfuse::lower {
namespace {

using Halide::Expr;
using Halide::Func;
using Halide::Var;

enum class Combine { Sum, Max, Min };

Combine combine_of(Op op) {
  switch (op) {
    case Op::ReduceSum:
    case Op::ReduceMean:
    case Op::RowSum:
    case Op::RowMean:
    case Op::ColSum:
    case Op::ColMean:
      return Combine::Sum;
    case Op::ReduceMax:
    case Op::RowMax:
    case Op::ColMax:
      return Combine::Max;
    case Op::ReduceMin:
    case Op::RowMin:
    case Op::ColMin:
      return Combine::Min;
    default:
      internal_error("reduction lowering: " + std::string(op_name(op)) + " is not a reduction");
  }
}

// The identity of `c` in the type the reduction runs in (f64 sums; maxima and minima in their
// operand's float type, where they are exact).
Expr identity(Combine c, const Halide::Type& t) {
  return c == Combine::Sum   ? Halide::Internal::make_zero(t)
         : c == Combine::Max ? t.min()   // -inf
                             : t.max();  // +inf
}

Halide::Type type_of(const Func& f) { return f.output_types().at(0); }

Expr combine(Combine c, const Expr& acc, const Expr& v) {
  if (c == Combine::Sum) return acc + v;
  if (!acc.type().is_float())  // the bits of non-negative floats (lower.cpp): NaN is the largest
    return c == Combine::Min ? Halide::min(acc, v) : Halide::max(acc, v);
  return nan_min_max(c == Combine::Min, acc, v);
}

// One kernel of `block`-thread blocks: block b reduces src(j, b) for j in
// [0, steps * block * vector_width), thread t the vectors t, t + block, t + 2 * block, ...
// (`src` is the identity past the data).
BlockReduce block_reduce(Combine c, const Func& src, const Expr& steps, int block, int vector_width,
                         const std::string& name) {
  const Halide::Type ty = type_of(src);
  BlockReduce k{Func(name + "_lanes"), Func(name + "_threads"), Func(name + "_acc"),
                Func(name + "_blocks"), vector_width};
  Var v("v"), t("t"), b("b");
  Halide::RDom r(0, steps, name + "_r");
  k.lanes(v, t, b) = identity(c, ty);
  k.lanes(v, t, b) = combine(c, k.lanes(v, t, b), src((r * block + t) * vector_width + v, b));
  Halide::RDom rv(0, vector_width, name + "_rv");
  k.threads(t, b) = identity(c, ty);
  k.threads(t, b) = combine(c, k.threads(t, b), k.lanes(rv, t, b));
  Halide::RDom rt(0, block, name + "_rt");
  k.acc(b) = identity(c, ty);
  k.acc(b) = combine(c, k.acc(b), k.threads(rt, b));
  k.out(b) = k.acc(b);
  return k;
}

}  // namespace

WholeReduction reduce_whole(Op op, const Func& value, const Expr& n, const Expr& chunk,
                            int vector_width, const std::string& name) {
  const Combine c = combine_of(op);
  const Halide::Type ty = type_of(value);
  const Expr vw = vector_width;
  // Vectors per task: a task is `chunk` elements, or the whole (smaller) tensor; so at most one
  // ragged vector per task reads past n, where the bounded value is the identity.
  Expr task_vectors = Halide::max((Halide::min(chunk, n) + vw - 1) / vw, 1);
  Expr tasks = (n + task_vectors * vw - 1) / (task_vectors * vw);
  Func bounded = Halide::BoundaryConditions::constant_exterior(value, identity(c, ty), {{0, n}});

  WholeReduction r{Func(name + "_lanes"), Func(name + "_total"), n <= chunk, {}};
  Var l("l"), ch("c");
  Halide::RDom k(0, task_vectors, name + "_k");
  r.lanes(l, ch) = identity(c, ty);
  r.lanes(l, ch) = combine(c, r.lanes(l, ch), bounded((ch * task_vectors + k) * vw + l));
  Halide::RDom t(0, vector_width, 0, tasks, name + "_t");
  r.total() = identity(c, ty);
  r.total() = combine(c, r.total(), r.lanes(t.x, t.y));
  return r;
}

RowReduction reduce_rows(Op op, const Func& value, const Expr& cols, int vector_width,
                         const std::string& name) {
  const Combine c = combine_of(op);
  const Halide::Type ty = type_of(value);
  const Expr vw = vector_width;
  Func bounded = Halide::BoundaryConditions::constant_exterior(value, identity(c, ty),
                                                               {{0, cols}, {Expr(), Expr()}});
  RowReduction r{Func(name + "_lanes"), Func(name + "_row"), {}, {}};
  Var l("l"), y("y");
  // The row's whole vectors are read as they are (dense vector loads); only a ragged last vector,
  // when cols is not a multiple of the vector width, goes through the bounded value (whose
  // clamped, selected loads Halide cannot vectorize as one load).
  const Expr full = cols / vw;
  Halide::RDom k(0, full, name + "_k");
  Halide::RDom ragged(0, Halide::select(cols % vw != 0, 1, 0), name + "_ragged");
  r.lanes(l, y) = identity(c, ty);
  r.lanes(l, y) = combine(c, r.lanes(l, y), value(k * vw + l, y));
  r.lanes(l, y) = combine(c, r.lanes(l, y), bounded((full + ragged) * vw + l, y));
  if ((vector_width & (vector_width - 1)) != 0) {  // a width not a power of two: lane by lane
    Halide::RDom t(0, vector_width, name + "_t");
    r.row(y) = identity(c, ty);
    r.row(y) = combine(c, r.row(y), r.lanes(t, y));
    return r;
  }
  // The lanes combined pairwise, half the lanes at each step: log2(width) vector operations a
  // row where a loop over the lanes made `width` scalar ones (a row of 256 f32 is 8 vectors on
  // AVX-512: the loop cost as much as the row's reduction itself).
  Func prev = r.lanes;
  for (int half = vector_width / 2; half >= 1; half /= 2) {
    Func next(name + "_half" + std::to_string(half));
    next(l, y) = combine(c, prev(l, y), prev(l + half, y));
    r.halves.push_back(next);
    prev = next;
  }
  r.row(y) = prev(0, y);
  return r;
}

WholeReduction reduce_whole_rows(Op op, const Func& value, const Expr& cols, const Expr& rows,
                                 const Expr& rows_per_task, int vector_width,
                                 const std::string& name) {
  const Combine c = combine_of(op);
  const Halide::Type ty = type_of(value);
  const Expr vw = vector_width;
  const Expr tasks = Halide::max((rows + rows_per_task - 1) / rows_per_task, 1);
  Func bounded = Halide::BoundaryConditions::constant_exterior(value, identity(c, ty),
                                                               {{0, cols}, {Expr(), Expr()}});
  WholeReduction r{Func(name + "_lanes"), Func(name + "_total"), tasks <= 1, {}};
  Var l("l"), t("t");
  // Row r of task t, clamped into the tensor; rows past its end add the identity.
  const Expr full = cols / vw;
  Halide::RDom k(0, full, 0, rows_per_task, name + "_k");
  Halide::RDom ragged(0, Halide::select(cols % vw != 0, 1, 0), 0, rows_per_task, name + "_ragged");
  auto row = [&](const Expr& r) { return Halide::min(t * rows_per_task + r, rows - 1); };
  auto inside = [&](const Expr& r) { return t * rows_per_task + r < rows; };
  r.lanes(l, t) = identity(c, ty);
  r.lanes(l, t) =
      combine(c, r.lanes(l, t),
              Halide::select(inside(k.y), value(k.x * vw + l, row(k.y)), identity(c, ty)));
  r.lanes(l, t) =
      combine(c, r.lanes(l, t),
              Halide::select(inside(ragged.y), bounded((full + ragged.x) * vw + l, row(ragged.y)),
                             identity(c, ty)));
  Halide::RDom all(0, vector_width, 0, tasks, name + "_t");
  r.total() = identity(c, ty);
  r.total() = combine(c, r.total(), r.lanes(all.x, all.y));
  return r;
}

namespace {

// Tasks within a batch: a batch of more rows than a task is cut into tasks of this many rows.
Expr rows_of_task(const Expr& rows_per_task, const Expr& batch_rows) {
  return Halide::min(rows_per_task, batch_rows);
}

}  // namespace

ColReduction reduce_cols(Op op, const Func& value, const Expr& batch_rows,
                         const Expr& rows_per_task, const std::string& name) {
  const Combine c = combine_of(op);
  const Halide::Type ty = type_of(value);
  const Expr per_task = rows_of_task(rows_per_task, batch_rows);
  const Expr tasks = Halide::max((batch_rows + per_task - 1) / per_task, 1);
  ColReduction r{Func(name + "_partial"), Func(name + "_col"),
                 Halide::RDom(0, per_task, name + "_k")};
  Var x("x"), t("t"), b("b");
  const Halide::RDom& k = r.rows;
  const Expr in_batch = t * per_task + k;
  const Expr y = b * batch_rows + Halide::min(in_batch, batch_rows - 1);
  r.partial(x, t, b) = identity(c, ty);
  r.partial(x, t, b) = combine(c, r.partial(x, t, b),
                               Halide::select(in_batch < batch_rows, value(x, y), identity(c, ty)));
  Halide::RDom all(0, tasks, name + "_t");
  r.col(x, b) = identity(c, ty);
  r.col(x, b) = combine(c, r.col(x, b), r.partial(x, all, b));
  return r;
}

RowsInCols reduce_rows_in_cols(Op op, const Func& value, const Expr& cols, const Expr& batch_rows,
                               const Expr& rows_per_task, const ColReduction& partner,
                               int vector_width, const std::string& name) {
  const Combine c = combine_of(op);
  const Halide::Type ty = type_of(value);
  const Expr vw = vector_width, per_task = rows_of_task(rows_per_task, batch_rows);
  Func bounded = Halide::BoundaryConditions::constant_exterior(value, identity(c, ty),
                                                               {{0, cols}, {Expr(), Expr()}});
  RowsInCols r{Func(name + "_lanes"), Func(name + "_row")};
  Var l("l"), k("k"), t("t"), b("b"), y("y");
  // The partner's loop over rows, by its name (compute_with fuses loops of the same name); the
  // rows past a batch's end are its last row again (never read back). The row index is written
  // clamped so that Halide counts it as an impure reduction variable, like the partner's.
  const std::string rows = partner.rows.x.name().substr(0, partner.rows.x.name().find('$'));
  Halide::RDom full(0, per_task, 0, cols / vw, rows);
  Halide::RDom ragged(0, per_task, 0, Halide::select(cols % vw != 0, 1, 0), rows);
  auto row = [&](const Expr& in_task) {
    return b * batch_rows + Halide::min(t * per_task + in_task, batch_rows - 1);
  };
  auto at = [&](const Expr& in_task) { return Halide::clamp(in_task, 0, per_task - 1); };
  r.lanes(l, k, t, b) = identity(c, ty);
  r.lanes(l, at(full.x), t, b) =
      combine(c, r.lanes(l, at(full.x), t, b), value(full.y * vw + l, row(full.x)));
  r.lanes(l, at(ragged.x), t, b) = combine(c, r.lanes(l, at(ragged.x), t, b),
                                           bounded((cols / vw + ragged.y) * vw + l, row(ragged.x)));
  const Expr in_batch = y % batch_rows;
  Halide::RDom lanes(0, vector_width, name + "_l");
  r.row(y) = identity(c, ty);
  r.row(y) = combine(c, r.row(y),
                     r.lanes(lanes, in_batch % per_task, in_batch / per_task, y / batch_rows));
  return r;
}

Func reduce_batches(Op op, const Func& value, const Expr& batch_rows, const std::string& name) {
  const Combine c = combine_of(op);
  Func batch(name + "_batch");
  Var b("b");
  Halide::RDom k(0, batch_rows, name + "_k");
  batch(b) = identity(c, type_of(value));
  batch(b) = combine(c, batch(b), value(b * batch_rows + k));
  return batch;
}

WholeReduction reduce_whole_gpu(Op op, const Func& value, const Expr& n, int vector_width,
                                int block, const std::string& name) {
  const Combine c = combine_of(op);
  const Halide::Type ty = type_of(value);
  // Kernel 1: blocks of contiguous ranges, as many as the tensor fills (at most kMaxGpuBlocks:
  // enough to fill any current GPU, few enough for kernel 2), `steps` strides per thread.
  const Expr per_step = block * vector_width;
  Expr strides = (n + per_step - 1) / per_step;  // for one block
  Expr blocks = Halide::clamp(strides, 1, kMaxGpuBlocks);
  Expr steps = (strides + blocks - 1) / blocks;
  Func bounded = Halide::BoundaryConditions::constant_exterior(value, identity(c, ty), {{0, n}});
  Var j("j"), b("b");
  Func range(name + "_range");
  range(j, b) = bounded(b * (steps * per_step) + j);
  WholeReduction r{
      Func(name + "_lanes"), Func(name + "_total"), Halide::Internal::const_true(), {}};
  r.gpu.push_back(block_reduce(c, range, steps, block, vector_width, name));
  // Kernel 2: one block combines the block partials.
  Func partials =
      Halide::BoundaryConditions::constant_exterior(r.gpu[0].out, identity(c, ty), {{0, blocks}});
  Func all(name + "_partials");
  all(j, b) = partials(j);
  r.gpu.push_back(block_reduce(c, all, (blocks + block - 1) / block, block, 1, name + "_final"));
  r.total() = r.gpu[1].out(0);
  return r;
}

RowReduction reduce_rows_gpu(Op op, const Func& value, const Expr& cols, int vector_width,
                             int block, const std::string& name) {
  const Combine c = combine_of(op);
  const Halide::Type ty = type_of(value);
  Func bounded = Halide::BoundaryConditions::constant_exterior(value, identity(c, ty),
                                                               {{0, cols}, {Expr(), Expr()}});
  RowReduction r{Func(name + "_lanes"), Func(name + "_row"), {}, {}};
  const Expr per_step = block * vector_width;
  r.gpu.push_back(
      block_reduce(c, bounded, (cols + per_step - 1) / per_step, block, vector_width, name));
  Var y("y");
  r.row(y) = r.gpu[0].out(y);
  return r;
}

Expr finish(Op op, const Expr& reduced, const Expr& count) {
  if (op == Op::ReduceMean || op == Op::RowMean || op == Op::ColMean)
    return reduced / Halide::cast(Halide::Float(64), count);
  return reduced;
}

void schedule_whole(WholeReduction& r, int vector_width) {
  Var l = r.lanes.args()[0], ch = r.lanes.args()[1];
  r.lanes.compute_root().vectorize(l, vector_width);
  // One chunk: the calling thread does it (no pool wake-up; see apply_cpu_schedule).
  r.lanes.update().specialize(r.single_task).vectorize(l, vector_width);
  r.lanes.update().parallel(ch).vectorize(l, vector_width);
  r.total.compute_root();
}

namespace {

// A row reduction's lanes and halves, one row at a time at `row_loop`.
void schedule_row_lanes(RowReduction& r, const Halide::LoopLevel& row_loop, int vector_width) {
  Var l = r.lanes.args()[0];
  // One row per row loop iteration: fixed-size stages, on the stack, where a size known only at
  // run time was a heap allocation per stage and row (Kernel::run never makes a task of fewer
  // rows than the loop's, so no row past the end is computed).
  Var y = r.lanes.args()[1];
  r.lanes.compute_at(row_loop).vectorize(l, vector_width).bound_extent(y, 1);
  r.lanes.update(0).vectorize(l, vector_width);
  r.lanes.update(1).vectorize(l, vector_width);
  int lanes = vector_width;
  for (Halide::Func& h : r.halves) {
    lanes /= 2;
    Var hl = h.args()[0], hy = h.args()[1];
    h.compute_at(row_loop).bound(hl, 0, lanes).bound_extent(hy, 1);
    if (lanes > 1) h.vectorize(hl, lanes);
  }
}

}  // namespace

void schedule_rows(RowReduction& r, const Halide::LoopLevel& row_loop, int vector_width) {
  schedule_row_lanes(r, row_loop, vector_width);
  r.row.compute_at(row_loop).bound_extent(r.row.args()[0], 1);
}

void schedule_whole_rows(WholeReduction& r, int vector_width) {
  Var l = r.lanes.args()[0], t = r.lanes.args()[1];
  r.lanes.compute_root().vectorize(l, vector_width);
  for (int u = 0; u < 2; ++u)  // the rows' whole vectors, then their ragged last ones
    r.lanes.update(u).parallel(t).vectorize(l, vector_width);
  r.total.compute_root();
}

void schedule_rows_root(RowReduction& r, const Expr& rows, const Expr& rows_per_task,
                        int vector_width) {
  // A row's stages are computed for every row of its loop, guarded or not (reading past the
  // buffers): tasks shifted inwards (rows computed twice), or one task of exactly the rows, over
  // exactly the tensor's rows (one in an empty call, whose stand-in tensors have one).
  Var y = r.row.args()[0], yo("yo"), yi("yi");
  const Expr extent = Halide::max(rows, 1);
  r.row.compute_root()
      .bound(y, 0, extent)
      .split(y, yo, yi, Halide::min(rows_per_task, extent), Halide::TailStrategy::ShiftInwards)
      .parallel(yo);
  schedule_row_lanes(r, Halide::LoopLevel(r.row, yi), vector_width);
}

namespace {

// A column partial's (and its rows in columns') update: row by row, each row's vectors
// innermost, parallel over (task, batch), batches of fewer rows than a task grouped.
void schedule_task_rows(Halide::Stage update, const Var& t, const Var& b, const Expr& batch_rows,
                        const Expr& rows_per_task) {
  Var tb("tb"), tbo("tbo"), tbi("tbi");
  const Expr per_group = Halide::max(rows_per_task / batch_rows, 1);
  update.fuse(t, b, tb)
      .split(tb, tbo, tbi, per_group, Halide::TailStrategy::GuardWithIf)
      .parallel(tbo);
}

}  // namespace

void schedule_cols(ColReduction& r, const Expr& batch_rows, const Expr& rows_per_task,
                   int vector_width) {
  using Halide::TailStrategy;
  Var x = r.partial.args()[0], t = r.partial.args()[1], b = r.partial.args()[2];
  Var xo("xo"), xi("xi");
  r.partial.compute_root().vectorize(x, vector_width, TailStrategy::GuardWithIf);
  Halide::Stage update = r.partial.update();
  update.split(x, xo, xi, vector_width, TailStrategy::GuardWithIf)
      .vectorize(xi)
      .reorder(xi, xo, Halide::VarOrRVar(r.rows.x), t, b);
  schedule_task_rows(update, t, b, batch_rows, rows_per_task);
  Var cx = r.col.args()[0];
  r.col.compute_root().vectorize(cx, vector_width, TailStrategy::GuardWithIf);
  r.col.update().vectorize(cx, vector_width, TailStrategy::GuardWithIf);
}

void schedule_rows_in_cols(RowsInCols& r, ColReduction& partner, const Expr& batch_rows,
                           const Expr& rows_per_task, int vector_width) {
  Var l = r.lanes.args()[0], t = r.lanes.args()[2], b = r.lanes.args()[3];
  r.lanes.compute_root().bound(l, 0, vector_width).vectorize(l);
  for (int u = 0; u < 2; ++u) {
    Halide::Stage update = r.lanes.update(u);
    update.vectorize(l);
    // (The reduction variables by name: rows "$x", then the row's vectors "$y".)
    const std::string rows = partner.rows.x.name().substr(0, partner.rows.x.name().find('$'));
    update.reorder(l, Halide::RVar(rows + "$y"), Halide::RVar(rows + "$x"), t, b);
    schedule_task_rows(update, t, b, batch_rows, rows_per_task);
    update.compute_with(partner.partial.update(), Halide::RVar(rows + "$x"));
  }
  r.row.compute_root();
}

void schedule_gpu(std::vector<BlockReduce>& kernels) {
  for (BlockReduce& k : kernels) {
    Var b = k.out.args()[0], t = k.threads.args()[0], v = k.lanes.args()[0];
    k.out.compute_root().gpu_blocks(b);
    // Block-level code outside a thread loop runs in thread 0 (Halide's FuseGPUThreadLoops), with
    // barriers around it: the thread partials (shared memory) are complete before it reads them.
    k.acc.compute_at(k.out, b);
    k.threads.compute_at(k.out, b).gpu_threads(t);
    k.threads.update().gpu_threads(t);
    // Each thread's lanes live in registers; their loop over the strides is split by Halide's
    // loop partitioning into a steady state of dense vector loads and guarded ends.
    k.lanes.compute_at(k.threads, t);
    if (k.vector_width > 1) {
      k.lanes.vectorize(v);
      k.lanes.update().vectorize(v);
    }
  }
}

}  // namespace optfuse::lower
