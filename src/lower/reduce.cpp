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
      return Combine::Sum;
    case Op::ReduceMax:
    case Op::RowMax:
      return Combine::Max;
    case Op::ReduceMin:
    case Op::RowMin:
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
  RowReduction r{Func(name + "_lanes"), Func(name + "_row"), {}};
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
  RowReduction r{Func(name + "_lanes"), Func(name + "_row"), {}};
  const Expr per_step = block * vector_width;
  r.gpu.push_back(
      block_reduce(c, bounded, (cols + per_step - 1) / per_step, block, vector_width, name));
  Var y("y");
  r.row(y) = r.gpu[0].out(y);
  return r;
}

Expr finish(Op op, const Expr& reduced, const Expr& count) {
  if (op == Op::ReduceMean || op == Op::RowMean)
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

void schedule_rows(RowReduction& r, const Halide::LoopLevel& row_loop, int vector_width) {
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
  r.row.compute_at(row_loop).bound_extent(r.row.args()[0], 1);
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
