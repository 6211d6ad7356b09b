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
  return c == Combine::Sum ? Halide::Internal::make_zero(f64)
         : c == Combine::Max ? f64.min()   // -inf
                             : f64.max();  // +inf
}

Expr combine(Combine c, const Expr& acc, const Expr& v) {
  if (c == Combine::Sum) return acc + v;
  return nan_min_max(c == Combine::Min, acc, v);
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

  WholeReduction r{Func(name + "_lanes"), Func(name + "_total"), n <= chunk};
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
  Func bounded =
      Halide::BoundaryConditions::constant_exterior(value, identity(c), {{0, cols}, {Expr(), Expr()}});
  RowReduction r{Func(name + "_lanes"), Func(name + "_row")};
  Var l("l"), y("y");
  Halide::RDom k(0, (cols + vw - 1) / vw, name + "_k");
  r.lanes(l, y) = identity(c);
  r.lanes(l, y) = combine(c, r.lanes(l, y), bounded(k * vw + l, y));
  Halide::RDom t(0, vector_width, name + "_t");
  r.row(y) = identity(c);
  r.row(y) = combine(c, r.row(y), r.lanes(t, y));
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

}  // namespace optfuse::lower
