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

Expr identity(Combine c) {
  const Halide::Type f64 = Halide::Float(64);
  return c == Combine::Sum   ? Halide::Internal::make_zero(f64)
         : c == Combine::Max ? f64.min()   // -inf
                             : f64.max();  // +inf
}

Expr combine(Combine c, const Expr& acc, const Expr& v) {
  if (c == Combine::Sum) return acc + v;
  return nan_min_max(c == Combine::Min, acc, v);
}

// One kernel of `block`-thread blocks: block b reduces src(j, b) for j in
// [0, steps * block * vector_width), thread t the vectors t, t + block, t + 2 * block, ...
// (`src` is the identity past the data).
BlockReduce block_reduce(Combine c, const Func& src, const Expr& steps, int block, int vector_width,
                         const std::string& name) {
  BlockReduce k{Func(name + "_lanes"), Func(name + "_threads"), Func(name + "_acc"),
                Func(name + "_blocks"), vector_width};
  Var v("v"), t("t"), b("b");
  Halide::RDom r(0, steps, name + "_r");
  k.lanes(v, t, b) = identity(c);
  k.lanes(v, t, b) = combine(c, k.lanes(v, t, b), src((r * block + t) * vector_width + v, b));
  Halide::RDom rv(0, vector_width, name + "_rv");
  k.threads(t, b) = identity(c);
  k.threads(t, b) = combine(c, k.threads(t, b), k.lanes(rv, t, b));
  Halide::RDom rt(0, block, name + "_rt");
  k.acc(b) = identity(c);
  k.acc(b) = combine(c, k.acc(b), k.threads(rt, b));
  k.out(b) = k.acc(b);
  return k;
}

}  // namespace

WholeReduction reduce_whole(Op op, const Func& value, const Expr& n, const Expr& chunk,
                            int vector_width, const std::string& name) {
  const Combine c = combine_of(op);
  const Expr vw = vector_width;
  // Vectors per task: a task is `chunk` elements, or the whole (smaller) tensor; so at most one
  // ragged vector per task reads past n, where the bounded value is the identity.
  Expr task_vectors = Halide::max((Halide::min(chunk, n) + vw - 1) / vw, 1);
  Expr tasks = (n + task_vectors * vw - 1) / (task_vectors * vw);
  Func bounded = Halide::BoundaryConditions::constant_exterior(value, identity(c), {{0, n}});

  WholeReduction r{Func(name + "_lanes"), Func(name + "_total"), n <= chunk, {}};
  Var l("l"), ch("c");
  Halide::RDom k(0, task_vectors, name + "_k");
  r.lanes(l, ch) = identity(c);
  r.lanes(l, ch) = combine(c, r.lanes(l, ch), bounded((ch * task_vectors + k) * vw + l));
  Halide::RDom t(0, vector_width, 0, tasks, name + "_t");
  r.total() = identity(c);
  r.total() = combine(c, r.total(), r.lanes(t.x, t.y));
  return r;
}

RowReduction reduce_rows(Op op, const Func& value, const Expr& cols, int vector_width,
                         const std::string& name) {
  const Combine c = combine_of(op);
  const Expr vw = vector_width;
  Func bounded = Halide::BoundaryConditions::constant_exterior(value, identity(c),
                                                               {{0, cols}, {Expr(), Expr()}});
  RowReduction r{Func(name + "_lanes"), Func(name + "_row"), {}};
  Var l("l"), y("y");
  Halide::RDom k(0, (cols + vw - 1) / vw, name + "_k");
  r.lanes(l, y) = identity(c);
  r.lanes(l, y) = combine(c, r.lanes(l, y), bounded(k * vw + l, y));
  Halide::RDom t(0, vector_width, name + "_t");
  r.row(y) = identity(c);
  r.row(y) = combine(c, r.row(y), r.lanes(t, y));
  return r;
}

WholeReduction reduce_whole_gpu(Op op, const Func& value, const Expr& n, int vector_width,
                                int block, const std::string& name) {
  const Combine c = combine_of(op);
  // Kernel 1: blocks of contiguous ranges, as many as the tensor fills (at most kMaxGpuBlocks:
  // enough to fill any current GPU, few enough for kernel 2), `steps` strides per thread.
  const Expr per_step = block * vector_width;
  Expr strides = (n + per_step - 1) / per_step;  // for one block
  Expr blocks = Halide::clamp(strides, 1, kMaxGpuBlocks);
  Expr steps = (strides + blocks - 1) / blocks;
  Func bounded = Halide::BoundaryConditions::constant_exterior(value, identity(c), {{0, n}});
  Var j("j"), b("b");
  Func range(name + "_range");
  range(j, b) = bounded(b * (steps * per_step) + j);
  WholeReduction r{
      Func(name + "_lanes"), Func(name + "_total"), Halide::Internal::const_true(), {}};
  r.gpu.push_back(block_reduce(c, range, steps, block, vector_width, name));
  // Kernel 2: one block combines the block partials.
  Func partials =
      Halide::BoundaryConditions::constant_exterior(r.gpu[0].out, identity(c), {{0, blocks}});
  Func all(name + "_partials");
  all(j, b) = partials(j);
  r.gpu.push_back(block_reduce(c, all, (blocks + block - 1) / block, block, 1, name + "_final"));
  r.total() = r.gpu[1].out(0);
  return r;
}

RowReduction reduce_rows_gpu(Op op, const Func& value, const Expr& cols, int vector_width,
                             int block, const std::string& name) {
  const Combine c = combine_of(op);
  Func bounded = Halide::BoundaryConditions::constant_exterior(value, identity(c),
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
  r.lanes.compute_at(row_loop).vectorize(l, vector_width);
  r.lanes.update().vectorize(l, vector_width);
  r.row.compute_at(row_loop);
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
