// Lowering of staged graphs (staged.h): one root Func per stage of staged_plan.h, the element-wise
// stage `out` over whole rows, and the row and column state outputs from the root Funcs.
#include "lower/staged.h"

#include <algorithm>
#include <map>
#include <string>

#include "lower/bf16.h"
#include "lower/f16c.h"
#include "lower/fma.h"
#include "lower/lower_ops.h"
#include "lower/prefetch.h"
#include "lower/reduce.h"
#include "lower/row_plan.h"
#include "lower/staged_plan.h"
#include "optfuse/error.h"

namespace optfuse::lower {
namespace {

using Halide::Expr;
using Halide::Func;
using Halide::TailStrategy;
using Halide::Var;

// Where an expression is built: the element-wise stage (`out`, which reads tensor inputs through
// `load` and uniforms from the `uniforms` Func), a reduction's per-element operand (inputs and
// uniforms read directly), and the three level contexts of the root Funcs: a row (y), a column
// of a batch (x, b), a batch (b).
enum Ctx { kMain = 0, kElement, kRow, kColumn, kBatch, kContexts };

class StagedBuilder {
 public:
  explicit StagedBuilder(const Graph& g) : g_(g), plan_(plan_staged(g)) {
    for (auto& memo : memo_) memo.resize(g.nodes().size());
    uexpr_.resize(g.nodes().size());
    stage_.resize(g.nodes().size());
  }

  Lowered build(const Schedule& s, const Halide::Target& target, const CpuExtras& extras) {
    if (g_.outputs().empty() && g_.results().empty())
      throw Error("graph \"" + g_.name() + "\" has no outputs or results to compute");
    s_ = s;
    exact_fma_ = target_has_exact_fma(target);
    make_leaves();
    make_uniforms();
    std::vector<Func> pipeline_outputs = {make_results()};
    std::vector<Expr> outs, row_outs, col_outs;
    for (const Output& o : element_outputs(g_)) outs.push_back(value(o.value, kMain));
    for (const Output& o : row_state_outputs(g_)) row_outs.push_back(value(o.value, kRow));
    for (const Output& o : col_state_outputs(g_)) col_outs.push_back(value(o.value, kColumn));
    // (The fence reads every stage, so it is completed after all the outputs are built.)
    finish_results();
    if (!outs.empty()) define_output(out_, {x_, y_}, outs, pipeline_outputs);
    if (!row_outs.empty()) define_output(row_out_, {y_}, row_outs, pipeline_outputs);
    if (!col_outs.empty()) define_output(col_out_, {x_, b_}, col_outs, pipeline_outputs);
    schedule();
    Halide::Pipeline pipeline(pipeline_outputs);
    std::vector<std::string> prefetch_loops;
    if (out_.defined() && (s.prefetch > 0 || s.prefetch_l2 > 0)) prefetch_loops.push_back(".ysi");
    add_prefetch_pass(pipeline, prefetch_loops, write_only_output_buffers(), s.prefetch,
                      s.prefetch_l2);
    add_f16c_pass(pipeline, target);
    add_bf16_pass(pipeline, target, extras.avx512_bf16);
    return Lowered{pipeline, arguments()};
  }

 private:
  // ---- Leaves, uniforms, results ---------------------------------------------------------

  void make_leaves() {
    const std::vector<bool> in_main = staged_main_nodes(g_, plan_);
    std::vector<Expr> loads;
    for (size_t id = 0; id < g_.nodes().size(); ++id) {
      const Node& n = g_.nodes()[id];
      if (n.op == Op::Input) {
        const int dims = n.role == Role::RowState ? 1 : 2;  // column state: [cols, batches]
        inputs_.emplace_back(halide_type(n.dtype), dims, identifier("in", inputs_.size(), n.name));
        input_of_.emplace(static_cast<NodeId>(id), inputs_.size() - 1);
        const bool element_input = n.role != Role::RowState && n.role != Role::ColState;
        if (element_input && in_main[id] && !g_.outputs().empty()) {
          loaded_.emplace(static_cast<NodeId>(id), static_cast<int>(loads.size()));
          loads.push_back(inputs_.back()(x_, y_));
        }
      } else if (n.op == Op::Scalar) {
        scalars_.emplace_back(halide_type(n.dtype), identifier("s", scalars_.size(), n.name));
        uexpr_[id] = scalars_.back();
      } else if (n.op == Op::Const) {
        uexpr_[id] = constant(n.value, n.dtype);
      }
    }
    // The view: rows from the first per-element input (or row state); none in an empty call.
    Expr extent;
    for (const Node& n : g_.nodes()) {
      if (n.op != Op::Input || n.role == Role::ColState || extent.defined()) continue;
      const Halide::ImageParam& in = inputs_.at(input_of_.at(g_.find_input(n.name)));
      extent = n.role == Role::RowState ? in.dim(0).extent() : in.dim(1).extent();
    }
    if (!extent.defined())
      throw Error("graph \"" + g_.name() + "\": column state needs a per-element tensor input " +
                  "or row state (they give the rows)");
    rows_ = Halide::select(chunk_ > 0, extent, 0);
    rows_per_task_ = Halide::max(chunk_ / cols_, 1);
    if (loads.empty()) return;
    load_ = Func("load");
    define(load_, {x_, y_}, loads);
    for (auto [id, slot] : loaded_) memo_[kMain][id] = element(load_(x_, y_), slot, loads.size());
  }

  // The maximal scalar-only subexpressions `out` reads, computed once per call.
  void make_uniforms() {
    const std::vector<bool> in_main = staged_main_nodes(g_, plan_);
    auto want = [&](NodeId id) {
      const Node& n = g_.node(id);
      return !n.is_tensor && !op_has(n.op, kLeaf) &&
             std::find(uniform_ids_.begin(), uniform_ids_.end(), id) == uniform_ids_.end();
    };
    for (size_t id = 0; id < g_.nodes().size(); ++id)
      if (in_main[id])
        for (NodeId a : g_.nodes()[id].args)
          if (want(a)) uniform_ids_.push_back(a);
    for (const Output& o : element_outputs(g_))
      if (want(o.value)) uniform_ids_.push_back(o.value);
    if (uniform_ids_.empty()) return;
    std::vector<Expr> values;
    for (NodeId id : uniform_ids_) values.push_back(uniform(id));
    uniforms_ = Func("uniforms");
    define(uniforms_, {}, values);
  }

  Func make_results() {
    results_ = Func("results");
    std::vector<Result> rs = g_.results();
    std::stable_sort(rs.begin(), rs.end(),
                     [](const Result& a, const Result& b) { return a.name < b.name; });
    for (const Result& r : rs)
      result_values_.push_back(Halide::cast(Halide::Float(64), uniform(r.value)));
    return results_;
  }

  // The graph's results, then the fence: one f64 that reads every stage at its first point, so
  // that all of them are computed before `results`, the first output realized.
  void finish_results() {
    Expr fence = Halide::Internal::make_zero(Halide::Float(64));
    for (const Expr& at : fence_reads_) fence = fence + Halide::cast(Halide::Float(64), at);
    std::vector<Expr> values = result_values_;
    values.push_back(fence);
    define(results_, {}, values);
  }

  void define_output(Func& f, const std::vector<Var>& vars, const std::vector<Expr>& values,
                     std::vector<Func>& outputs) {
    define(f, vars, values);
    outputs.push_back(f);
  }

  // ---- Values in a context -----------------------------------------------------------------

  Expr uniform(NodeId id) {
    if (uexpr_[id].defined()) return uexpr_[id];
    const Node& n = g_.node(id);
    if (op_has(n.op, kReduce)) return uexpr_[id] = whole_reduction(id);
    std::vector<Expr> args;
    for (NodeId a : n.args) args.push_back(uniform(a));
    return uexpr_[id] = lower_op(n.op, n.dtype, args, Precision::Exact);
  }

  Expr main_uniform(NodeId id) {
    if (op_has(g_.node(id).op, kLeaf)) return uniform(id);
    auto it = std::find(uniform_ids_.begin(), uniform_ids_.end(), id);
    if (it == uniform_ids_.end()) internal_error("staged lowering: uniform node without a slot");
    return element(uniforms_(), static_cast<int>(it - uniform_ids_.begin()), uniform_ids_.size());
  }

  // Node `id` as an expression in context `ctx`: a uniform, a read of its stage, or its op.
  Expr value(NodeId id, Ctx ctx) {
    const Node& n = g_.node(id);
    if (!n.is_tensor) return ctx == kMain ? main_uniform(id) : uniform(id);
    if (plan_.stage[id]) return read_stage(id, ctx);
    return compute(id, ctx);
  }

  Expr compute(NodeId id, Ctx ctx) {
    Expr& memo = memo_[ctx][id];
    if (memo.defined()) return memo;
    const Node& n = g_.node(id);
    if (n.op == Op::Input) return memo = read_input(id, ctx);
    std::vector<Expr> args;
    for (NodeId a : n.args) args.push_back(value(a, ctx));
    if (n.op == Op::RoundSR) return memo = round_sr_bf16(args[0], args[1], x_ + y_ * cols_);
    if (n.op == Op::Sqrt && n.dtype == DType::F32 && exact_fma_ &&
        args[0].type().element_of() == Halide::Float(32))
      return memo = vector_sqrt_f32(args[0]);
    if (n.op == Op::Cast && n.dtype == DType::F32 && exact_fma_) {
      Expr fma = exact_fma_f32(args[0]);
      if (fma.defined()) return memo = fma;
    }
    return memo = lower_op(n.op, n.dtype, args, Precision::Fast);
  }

  // The batch of the current row, or the batch itself.
  Expr batch(Ctx ctx) const {
    return ctx == kColumn || ctx == kBatch ? Expr(b_) : y_ / batch_rows_;
  }

  Expr read_input(NodeId id, Ctx ctx) {
    const Node& n = g_.node(id);
    const Halide::ImageParam& in = inputs_.at(input_of_.at(id));
    if (n.role == Role::RowState) {
      if (ctx == kColumn || ctx == kBatch)
        internal_error("staged lowering: row state in " + n.name);
      return in(y_);
    }
    if (n.role == Role::ColState) {
      if (ctx == kRow || ctx == kBatch)
        internal_error("staged lowering: column state in " + n.name);
      return in(x_, batch(ctx));
    }
    if (ctx != kElement && ctx != kMain) internal_error("staged lowering: a tensor in " + n.name);
    return in(x_, y_);  // (kMain reads its loads, memoized by make_leaves)
  }

  // A stage's Func at the current point of context `ctx`.
  Expr read_stage(NodeId id, Ctx ctx) {
    Func& f = stage(id);
    switch (*plan_.stage[id]) {
      case Domain::Row:
        return ctx == kColumn || ctx == kBatch ? f(b_ * batch_rows_) : f(y_);
      case Domain::Column:
        if (ctx == kRow || ctx == kBatch)
          internal_error("staged lowering: a column value in a row");
        return f(x_, batch(ctx));
      case Domain::Batch:
        return f(batch(ctx));
    }
    internal_error("staged lowering: bad domain");
  }

  // ---- Stages --------------------------------------------------------------------------------

  Func& stage(NodeId id) {
    Func& f = stage_[id];
    if (f.defined()) return f;
    const Node& n = g_.node(id);
    const std::string name = "stage" + std::to_string(stages_named_++);
    Func made(name);
    const Domain d = *plan_.stage[id];
    if (op_has(n.op, kRowReduce)) {
      made(y_) = Halide::cast(halide_type(n.dtype), row_reduction(id, name));
    } else if (op_has(n.op, kColReduce) && d == Domain::Column) {
      made(x_, b_) = Halide::cast(halide_type(n.dtype), col_reduction(id, name));
    } else if (op_has(n.op, kColReduce)) {
      made(b_) = Halide::cast(halide_type(n.dtype), batch_reduction(id, name));
    } else {  // a level value, computed once per row, column or batch
      const Ctx ctx = d == Domain::Row ? kRow : d == Domain::Column ? kColumn : kBatch;
      if (d == Domain::Column)
        made(x_, b_) = compute(id, ctx);
      else
        made(d == Domain::Row ? y_ : b_) = compute(id, ctx);
      levels_.push_back(made);
    }
    fence_reads_.push_back(d == Domain::Column ? made(0, 0) : made(0));
    return f = made;
  }

  // A reduction's operand as a Func over (x, y): f64 for sums and means, f32 for maxima and
  // minima of narrower operands (exact in any float type).
  Func operand(NodeId id, const std::string& name, Ctx ctx) {
    const Node& n = g_.node(id);
    const bool exact = n.op == Op::RowMax || n.op == Op::RowMin || n.op == Op::ColMax ||
                       n.op == Op::ColMin || n.op == Op::ReduceMax || n.op == Op::ReduceMin;
    const bool narrow = g_.node(n.args[0]).dtype != DType::F64;
    Func f(name + "_in");
    const Expr v = Halide::cast(exact && narrow ? Halide::Float(32) : Halide::Float(64),
                                value(n.args[0], ctx));
    if (ctx == kRow)
      f(y_) = v;
    else
      f(x_, y_) = v;
    return f;
  }

  // A row reduction of a value a column reduction reduces too is computed in that one's loop
  // over rows (reduce.h, rows in columns): one pass over the value for both (Adafactor's row
  // and column means of g^2).
  Expr row_reduction(NodeId id, const std::string& name) {
    const Op op = g_.node(id).op;
    const NodeId value = g_.node(id).args[0];
    for (size_t c = 0; c < g_.nodes().size(); ++c) {
      const Node& other = g_.nodes()[c];
      if (!op_has(other.op, kColReduce) || other.args[0] != value ||
          plan_.stage[c] != Domain::Column)
        continue;
      stage(static_cast<NodeId>(c));  // the partner
      const size_t partner = col_index_.at(static_cast<NodeId>(c));
      rows_in_cols_.push_back(
          {reduce_rows_in_cols(op, operand(id, name, kElement), cols_, batch_rows_, rows_per_task_,
                               cols_stages_.at(partner), s_.vector_width, name),
           partner});
      return finish(op, rows_in_cols_.back().first.row(y_), cols_);
    }
    rows_stages_.push_back(
        reduce_rows(op, operand(id, name, kElement), cols_, s_.vector_width, name));
    return finish(op, rows_stages_.back().row(y_), cols_);
  }

  Expr col_reduction(NodeId id, const std::string& name) {
    const Op op = g_.node(id).op;
    col_index_[id] = cols_stages_.size();
    cols_stages_.push_back(
        reduce_cols(op, operand(id, name, kElement), batch_rows_, rows_per_task_, name));
    return finish(op, cols_stages_.back().col(x_, b_), batch_rows_);
  }

  Expr batch_reduction(NodeId id, const std::string& name) {
    const Op op = g_.node(id).op;
    batch_stages_.push_back(reduce_batches(op, operand(id, name, kRow), batch_rows_, name));
    return finish(op, batch_stages_.back()(b_), batch_rows_);
  }

  Expr whole_reduction(NodeId id) {
    const Op op = g_.node(id).op;
    const std::string name = "stage" + std::to_string(stages_named_++);
    whole_stages_.push_back(reduce_whole_rows(op, operand(id, name, kElement), cols_, rows_,
                                              rows_per_task_, s_.vector_width, name));
    fence_reads_.push_back(whole_stages_.back().total());
    return Halide::cast(halide_type(g_.node(id).dtype),
                        finish(op, whole_stages_.back().total(), rows_ * cols_));
  }

  // ---- Schedule ------------------------------------------------------------------------------

  void schedule() {
    const int vw = s_.vector_width;
    for (WholeReduction& r : whole_stages_) schedule_whole_rows(r, vw);
    for (RowReduction& r : rows_stages_) schedule_rows_root(r, rows_, rows_per_task_, vw);
    for (ColReduction& r : cols_stages_) schedule_cols(r, batch_rows_, rows_per_task_, vw);
    for (auto& [r, partner] : rows_in_cols_)
      schedule_rows_in_cols(r, cols_stages_.at(partner), batch_rows_, rows_per_task_, vw);
    for (Func& f : batch_stages_) f.compute_root();
    for (Func& f : levels_) f.compute_root().vectorize(f.args()[0], vw, TailStrategy::GuardWithIf);
    if (uniforms_.defined()) uniforms_.compute_root();
    if (row_out_.defined()) row_out_.vectorize(y_, vw, TailStrategy::GuardWithIf);
    if (col_out_.defined()) col_out_.vectorize(x_, vw, TailStrategy::GuardWithIf);
    if (!out_.defined()) return;
    // Tasks of whole rows, each row's vectors innermost (one predicated ragged vector a row).
    Var xvo("xvo"), xv("xv"), yso("yso"), ysi("ysi");
    out_.split(x_, xvo, xv, vw, TailStrategy::GuardWithIf)
        .vectorize(xv)
        .split(y_, yso, ysi, rows_per_task_, TailStrategy::GuardWithIf)
        .parallel(yso);
    if (load_.defined()) load_.compute_at(out_, xv);
  }

  // The buffers of outputs whose input `out` never loads: their stores are the only accesses
  // to those lines (prefetch.h).
  std::vector<std::string> write_only_output_buffers() const {
    std::vector<std::string> names;
    if (!out_.defined()) return names;
    const std::vector<Output> outs = element_outputs(g_);
    const std::vector<Halide::OutputImageParam> buffers = out_.output_buffers();
    for (size_t k = 0; k < outs.size(); ++k)
      if (!loaded_.count(g_.find_input(outs[k].replaces))) names.push_back(buffers.at(k).name());
    return names;
  }

  std::vector<Halide::Argument> arguments() const {
    std::vector<Halide::Argument> args(inputs_.begin(), inputs_.end());
    args.insert(args.end(), scalars_.begin(), scalars_.end());
    args.push_back(chunk_);
    args.push_back(cols_);
    args.push_back(batch_rows_);
    return args;
  }

  const Graph& g_;
  const StagedPlan plan_;
  Schedule s_;
  bool exact_fma_ = false;
  Var x_{"x"}, y_{"y"}, b_{"b"};
  Halide::Param<int32_t> chunk_{"chunk"}, cols_{"cols"}, batch_rows_{"batch_rows"};
  Expr rows_, rows_per_task_;
  std::vector<Halide::ImageParam> inputs_;
  std::map<NodeId, size_t> input_of_;  // input node -> its ImageParam
  std::map<NodeId, int> loaded_;       // input node -> its slot in `load`
  std::vector<Halide::Param<>> scalars_;
  std::vector<Expr> uexpr_;
  std::vector<Expr> memo_[kContexts];
  std::vector<NodeId> uniform_ids_;
  std::vector<Func> stage_;  // by node
  std::vector<Func> levels_;
  std::vector<RowReduction> rows_stages_;
  std::vector<ColReduction> cols_stages_;
  std::map<NodeId, size_t> col_index_;  // column reduction node -> its entry in cols_stages_
  std::vector<std::pair<RowsInCols, size_t>> rows_in_cols_;  // and their partner's entry
  std::vector<Func> batch_stages_;
  std::vector<WholeReduction> whole_stages_;
  std::vector<Expr> fence_reads_, result_values_;
  Func load_, uniforms_, results_, out_{"out"}, row_out_{"row_out"}, col_out_{"col_out"};
  int stages_named_ = 0;
};

}  // namespace

Lowered lower_staged(const Graph& canonical, const Schedule& s, const Halide::Target& target,
                     const CpuExtras& extras) {
  return StagedBuilder(canonical).build(s, target, extras);
}

}  // namespace optfuse::lower
