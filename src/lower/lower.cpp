// Lowering of a canonical graph to one Halide pipeline (see lower.h for its shape).
#include "lower/lower.h"

#include <algorithm>
#include <string>

#include "lower/bf16.h"
#include "lower/f16c.h"
#include "lower/fma.h"
#include "lower/lower_ops.h"
#include "lower/prefetch.h"
#include "lower/reduce.h"
#include "lower/row_plan.h"
#include "lower/schedule.h"
#include "lower/signature.h"
#include "lower/staged.h"
#include "optfuse/error.h"

namespace optfuse::lower {
namespace {

using Halide::Expr;
using Halide::Func;

// Per-element code exists in two contexts: the element-wise stage (`out`), which reads tensors
// through `load` and scalar-only subexpressions from the `uniforms` Func, and the operands of
// reductions (prologue stages), which read the ImageParams directly and inline uniform
// expressions (a reduction runs before `uniforms` may be computed: uniforms can depend on it).
// Per-row graphs have a third: values that are the same for a whole row (row state, row
// reductions and what is computed from them), computed once per row into the `row_values`
// Funcs, which both others read.
enum Ctx { kMain = 0, kPrologue = 1, kRow = 2 };

class PipelineBuilder {
 public:
  explicit PipelineBuilder(const Graph& g) : g_(g), uexpr_(g.nodes().size()) {
    for (auto& memo : texpr_) memo.resize(g.nodes().size());
    funcs_.out = Func("out");
    funcs_.x = Halide::Var("x");
    funcs_.chunk = chunk_;
  }

  Lowered build(const Schedule& s, const Halide::Target& target, const CpuExtras& extras) {
    if (g_.outputs().empty() && g_.results().empty())
      throw Error("graph \"" + g_.name() + "\" has no outputs or results to compute");
    s_ = s;
    gpu_ = target.has_gpu_feature();
    check_supported();
    exact_fma_ = target_has_exact_fma(target);
    funcs_.per_row = uses_rows(g_);
    vars_ = {funcs_.x};
    if (funcs_.per_row) vars_.push_back(funcs_.y);
    if (funcs_.per_row) rows_ = plan_rows(g_, gpu_);
    make_leaves();
    make_uniforms();
    make_row_values();
    // Results first: Halide realizes independent pipeline outputs in the order given, and the
    // reductions only results use must read the inputs before `out` overwrites them in place
    // (tests/test_reduce.cpp, InPlace). So the argv has the result buffers before the outputs.
    std::vector<Halide::Func> pipeline_outputs;
    if (!g_.results().empty()) {
      std::vector<Expr> results;
      for (const Result& r : sorted_results())
        results.push_back(Halide::cast(Halide::Float(64), uniform(r.value)));
      funcs_.results = Func("results");
      define(funcs_.results, {}, results);
      pipeline_outputs.push_back(funcs_.results);
    }
    // Per-element outputs are `out`'s Tuple; row-state ones `row_out`'s, over rows only, which the
    // schedule fuses into `out`'s row loop. Their values are per-row, so they read row state and
    // row reductions directly (the prologue's context), not through the per-vector `load`.
    std::vector<Expr> outputs, row_outputs;
    for (const Output& o : element_outputs(g_)) outputs.push_back(operand(o.value, kMain));
    for (const Output& o : row_state_outputs(g_)) row_outputs.push_back(operand(o.value, kRow));
    if (!outputs.empty()) {
      define(funcs_.out, vars_, outputs);
      pipeline_outputs.push_back(funcs_.out);
    }
    if (!row_outputs.empty()) {
      funcs_.row_out = Func("row_out");
      define(funcs_.row_out, {funcs_.y}, row_outputs);
      pipeline_outputs.push_back(funcs_.row_out);
    }
    funcs_.inputs = inputs_;
    apply_schedule(funcs_, s, target);
    Halide::Pipeline pipeline(pipeline_outputs);
    add_prefetch_pass(pipeline, funcs_.prefetch_loops, write_only_output_buffers(), s.prefetch,
                      s.prefetch_l2);
    add_f16c_pass(pipeline, target);
    add_bf16_pass(pipeline, target, extras.avx512_bf16);
    return Lowered{pipeline, arguments()};
  }

 private:
  // Opaque ops never compile into a kernel; mixing whole-tensor and per-row reductions in one
  // graph is not supported yet on any target (the partitioner cuts such graphs into two kernels).
  void check_supported() const {
    const Node* whole = nullptr;
    const Node* row = nullptr;
    for (const Node& n : g_.nodes()) {
      if (op_has(n.op, kReduce) && !whole) whole = &n;
      if (op_has(n.op, kRowReduce) && !row) row = &n;
    }
    const std::string graph = "graph \"" + g_.name() + "\": ";
    for (const Node& n : g_.nodes())
      if (n.op == Op::Opaque)
        throw Error(graph + "opaque op \"" + n.name +
                    "\" cannot be compiled into a kernel; partition the graph "
                    "(include/optfuse/partition.h) and run it between the kernels");
    bool row_state = false, element_output = false;
    for (const Node& n : g_.nodes()) row_state = row_state || is_row_state(n);
    for (const Output& o : g_.outputs())
      element_output = element_output || !is_row_state(g_.node(g_.find_input(o.replaces)));
    if (row_state && gpu_)
      throw Error(graph + "row state (Role::RowState) is not supported on CUDA targets yet");
    if (row_state && (whole || !element_output))
      throw Error(graph + "row state needs a graph without whole-tensor reductions and with at " +
                  "least one per-element output");
    if (whole && row)
      throw Error(graph + std::string(op_name(whole->op)) + " and " +
                  std::string(op_name(row->op)) +
                  ": whole-tensor and per-row reductions in one kernel are not supported yet; "
                  "split the graph (the partitioner does)");
  }

  // Inputs some node, output or result reads. An input only written (a bf16 param whose update
  // is computed from its f32 master copy) keeps its ImageParam, which the output then
  // overwrites, but is never loaded: no bytes are read for it.
  std::vector<bool> read_inputs() const {
    std::vector<bool> read(g_.nodes().size(), false);
    for (const Node& n : g_.nodes())
      for (NodeId a : n.args) read[a] = true;
    for (const Output& o : g_.outputs()) read[o.value] = true;
    for (const Result& r : g_.results()) read[r.value] = true;
    return read;
  }

  // The buffers of outputs whose input is never loaded (load slot -1, make_leaves: a bf16 param
  // updated from its f32 master copy): their stores are the only accesses to those lines
  // (lower/prefetch.h).
  std::vector<std::string> write_only_output_buffers() const {
    std::vector<std::string> names;
    if (g_.outputs().empty()) return names;
    const std::vector<Output> outs = element_outputs(g_);
    const std::vector<Halide::OutputImageParam> buffers = funcs_.out.output_buffers();
    for (size_t k = 0; k < outs.size(); ++k)
      for (auto [id, slot] : input_slot_)
        if (slot < 0 && g_.node(id).name == outs[k].replaces) names.push_back(buffers.at(k).name());
    return names;
  }

  std::vector<Result> sorted_results() const {
    std::vector<Result> rs = g_.results();
    std::stable_sort(rs.begin(), rs.end(),
                     [](const Result& a, const Result& b) { return a.name < b.name; });
    return rs;
  }

  // ImageParams, Params and (when there are outputs) the load Func; the element-wise stage reads
  // tensor inputs through load only.
  void make_leaves() {
    const int dims = static_cast<int>(vars_.size());
    std::vector<Expr> loads;
    // With `fresh`, the update loads only what it still reads itself (row_plan.h).
    const std::vector<bool> read = rows_.fresh.empty() ? read_inputs() : rows_.update_reads;
    for (size_t id = 0; id < g_.nodes().size(); ++id) {
      const Node& n = g_.nodes()[id];
      if (n.op == Op::Input) {
        // Row state is 1-D over rows; per-vector code reads its row's value.
        inputs_.emplace_back(halide_type(n.dtype), is_row_state(n) ? 1 : dims,
                             identifier("in", inputs_.size(), n.name));
        if (!read[id]) {
          input_slot_.push_back({static_cast<NodeId>(id), -1});  // never loaded
          continue;
        }
        input_slot_.push_back({static_cast<NodeId>(id), static_cast<int>(loads.size())});
        loads.push_back(read_input(inputs_.size() - 1));
      } else if (n.op == Op::Scalar) {
        scalars_.emplace_back(halide_type(n.dtype), identifier("s", scalars_.size(), n.name));
        uexpr_[id] = scalars_.back();
      } else if (n.op == Op::Const) {
        uexpr_[id] = constant(n.value, n.dtype);
      }
    }
    if (loads.empty() || g_.outputs().empty()) return;
    funcs_.load = Func("load");
    define(funcs_.load, vars_, loads);
    for (auto [id, slot] : input_slot_)
      if (slot >= 0) texpr_[kMain][id] = element(funcs_.load(vars_), slot, loads.size());
  }

  // Every maximal scalar-only subexpression that the element-wise stage uses (an operand of a
  // per-element node, or an output) becomes one element of the 0-D uniforms Func, computed once
  // per call.
  void make_uniforms() {
    std::vector<bool> in_main = main_nodes(g_);
    auto wants_slot = [&](NodeId id) {
      const Node& n = g_.node(id);
      return !n.is_tensor && !op_has(n.op, kLeaf) &&
             std::find(uniform_ids_.begin(), uniform_ids_.end(), id) == uniform_ids_.end();
    };
    auto slot_of = [&](NodeId id) { return widened_uniform(id) ? g_.node(id).args[0] : id; };
    for (size_t id = 0; id < g_.nodes().size(); ++id) {
      const Node& n = g_.nodes()[id];
      if (n.is_tensor && in_main[id] && !op_has(n.op, kRowReduce))
        for (NodeId a : n.args)
          if (wants_slot(slot_of(a))) uniform_ids_.push_back(slot_of(a));
    }
    for (const Output& o : g_.outputs())
      if (wants_slot(slot_of(o.value))) uniform_ids_.push_back(slot_of(o.value));
    if (uniform_ids_.empty()) return;
    std::vector<Expr> values;
    for (NodeId id : uniform_ids_) values.push_back(uniform(id));
    funcs_.uniforms = Func("uniforms");
    define(funcs_.uniforms, {}, values);
  }

  // A uniform f32 -> f64 widening is done in the element loop from its f32 slot (exact, and
  // loop-invariant), not in a slot of its own: f32(f64(a) * f64(b) + f64(c)) with a uniform
  // operand must show its f32 operands to become one FMA (fma.h).
  bool widened_uniform(NodeId id) const {
    const Node& n = g_.node(id);
    return !n.is_tensor && n.op == Op::Cast && n.dtype == DType::F64 &&
           g_.node(n.args[0]).dtype == DType::F32;
  }

  // A uniform node in terms of Params, constants and reduction totals (exact precision: it runs
  // once per call).
  Expr uniform(NodeId id) {
    if (uexpr_[id].defined()) return uexpr_[id];
    const Node& n = g_.node(id);
    if (op_has(n.op, kReduce)) return uexpr_[id] = whole_reduction(id);
    std::vector<Expr> args;
    for (NodeId a : n.args) args.push_back(uniform(a));
    return uexpr_[id] = lower_op(n.op, n.dtype, args, Precision::Exact);
  }

  // The row-level values per-element code uses (row_plan.h) as the Funcs row_values[0] (computed
  // at the start of each row, before its reductions) and row_values[1] (after them): one square
  // root or divide per row instead of one per vector.
  void make_row_values() {
    if (!funcs_.per_row) return;
    // In Func order: row_before, then `fresh` (which reads it), then row_after (whose row
    // reductions read fresh).
    for (int stage = 0; stage < 2; ++stage) {
      if (stage == 1) make_fresh();
      if (rows_.row_values[stage].empty()) continue;
      std::vector<Expr> values;
      for (NodeId id : rows_.row_values[stage]) values.push_back(tensor(id, kRow));
      funcs_.row_values[stage] = Func(stage ? "row_after" : "row_before");
      define(funcs_.row_values[stage], {funcs_.y}, values);
    }
  }

  // Graphs with row state: `fresh(x, y)`, a row of the values both a row reduction and the
  // update read (row_plan.h), which both then read there. (All of a row's loads happen before
  // any of its stores, so in place stays safe.)
  void make_fresh() {
    const std::vector<NodeId>& ids = rows_.fresh;
    if (ids.empty()) return;
    std::vector<Expr> values;
    for (NodeId z : ids) values.push_back(tensor(z, kPrologue));
    funcs_.fresh = Func("fresh");
    define(funcs_.fresh, vars_, values);
    for (size_t i = 0; i < ids.size(); ++i)
      texpr_[kMain][ids[i]] = texpr_[kPrologue][ids[i]] =
          element(funcs_.fresh(vars_), static_cast<int>(i), ids.size());
  }

  // A value as per-element code in context `ctx` sees it.
  Expr operand(NodeId id, Ctx ctx) {
    const Node& n = g_.node(id);
    // (A reduction's operand may not read row_values[1]: that may depend on the reduction.)
    const bool row_level = funcs_.per_row && rows_.row_level[id];
    const int stage = row_level && rows_.after_reduction[id] ? 1 : 0;
    if (n.is_tensor && row_level && (ctx == kMain || (ctx == kPrologue && stage == 0))) {
      const std::vector<NodeId>& ids = rows_.row_values[stage];
      auto it = std::find(ids.begin(), ids.end(), id);
      if (it != ids.end())
        return element(funcs_.row_values[stage](funcs_.y), static_cast<int>(it - ids.begin()),
                       ids.size());
    }
    if (n.is_tensor) return tensor(id, ctx);
    if (widened_uniform(id) && ctx == kMain)
      return lower_op(n.op, n.dtype, {operand(n.args[0], ctx)}, Precision::Fast);
    if (op_has(n.op, kLeaf) || ctx != kMain) return uniform(id);
    auto it = std::find(uniform_ids_.begin(), uniform_ids_.end(), id);
    if (it == uniform_ids_.end()) internal_error("lower: uniform node without a slot");
    return element(funcs_.uniforms(), static_cast<int>(it - uniform_ids_.begin()),
                   uniform_ids_.size());
  }

  Expr tensor(NodeId id, Ctx ctx) {
    Expr& memo = texpr_[ctx][id];
    if (memo.defined()) return memo;
    const Node& n = g_.node(id);
    if (n.op == Op::Input) {  // only the prologue gets here: make_leaves memoized kMain's loads
      for (size_t i = 0; i < input_slot_.size(); ++i)
        if (input_slot_[i].first == id) return memo = read_input(i);
      internal_error("lower: input node without an ImageParam");
    }
    if (op_has(n.op, kRowReduce)) {  // one stage per reduction, whichever context asks first
      for (const auto& other : texpr_)
        if (other[id].defined()) return memo = other[id];
      return memo = row_reduction(id);
    }
    std::vector<Expr> args;
    for (NodeId a : n.args) args.push_back(operand(a, ctx));
    if (n.op == Op::RoundSR) return memo = round_sr_bf16(args[0], args[1], element_index());
    if (n.op == Op::Sqrt && n.dtype == DType::F32 && exact_fma_ &&
        args[0].type().element_of() == Halide::Float(32))
      return memo = vector_sqrt_f32(args[0]);
    if (n.op == Op::Cast && n.dtype == DType::F32 && exact_fma_) {  // f32(f64(a) * f64(b) + f64(c))
      Expr fma = exact_fma_f32(args[0]);
      if (fma.defined()) return memo = fma;
    }
    if (n.op == Op::Select) note_case(g_.node(n.args[0]), args[0]);
    return memo = lower_op(n.op, n.dtype, args, Precision::Fast);
  }

  // A select on a bool scalar: a case the schedules compile a loop for per value (at most
  // kMaxCases of them: each adds a copy of every loop; a second case's select stays in the first
  // case's loops).
  void note_case(const Node& cond, const Expr& param) {
    if (cond.op != Op::Scalar || cond.dtype != DType::Bool || funcs_.cases.size() >= kMaxCases)
      return;
    for (const Expr& c : funcs_.cases)
      if (c.same_as(param)) return;
    funcs_.cases.push_back(param);
  }

  // Input i at the current element: row state at its row.
  Expr read_input(size_t i) {
    return is_row_state(g_.node(input_slot_.at(i).first)) ? inputs_[i](funcs_.y)
                                                          : inputs_[i](vars_);
  }

  // The element's position in the call: x, or x + y * cols for per-row graphs.
  Expr element_index() const {
    return funcs_.per_row ? Expr(funcs_.x) + Expr(funcs_.y) * cols_ : Expr(funcs_.x);
  }

  // The operand of reduction node `id` as a Func over the pipeline's vars: f64 for sums and
  // means (which round), f32 for maxima and minima of narrower operands on CPU targets (exact in
  // any float type, and twice the lanes per instruction).
  //
  // A row maximum of absolute values (a block's scale) on CPU targets reduces their bits as
  // u32 (bits_max_abs): for floats without a sign bit the integer order is the float order with
  // NaN above inf, so one integer max per vector propagates NaN, where the float form needs a
  // NaN test and a select.
  Func reduction_operand(NodeId id, const std::string& name) {
    const Node& n = g_.node(id);
    const bool exact =
        n.op == Op::RowMax || n.op == Op::RowMin || n.op == Op::ReduceMax || n.op == Op::ReduceMin;
    // (CPU targets only: the CUDA reductions stay as they were checked, tests/test_cuda_*.)
    const bool narrow = g_.node(n.args[0]).dtype != DType::F64 && !gpu_;
    Expr v = Halide::cast(exact && narrow ? Halide::Float(32) : Halide::Float(64),
                          tensor(n.args[0], kPrologue));
    if (bits_max_abs(id)) v = Halide::reinterpret(Halide::UInt(32), v);
    Func value(name + "_in");
    value(vars_) = v;
    return value;
  }

  bool bits_max_abs(NodeId id) const {
    const Node& n = g_.node(id);
    // (Rows only: a row is never empty, and an empty whole reduction's max is -inf, not 0.)
    return !gpu_ && n.op == Op::RowMax && g_.node(n.args[0]).op == Op::Abs &&
           g_.node(n.args[0]).dtype != DType::F64;
  }

  // The f32 value a bits_max_abs reduction's result stands for.
  Expr from_bits(NodeId id, const Expr& reduced) const {
    return bits_max_abs(id) ? Halide::reinterpret(Halide::Float(32), reduced) : reduced;
  }

  Expr whole_reduction(NodeId id) {
    const Node& n = g_.node(id);
    // Numbered when named, not when pushed: the operand may hold reductions of its own.
    const std::string name = "red" + std::to_string(stages_named_++);
    // Every tensor has the same extent (Kernel::run builds them so); a reduced value is per
    // element, so the graph has at least one tensor input. chunk == 0: an empty call (lower.h).
    Expr count = Halide::select(chunk_ > 0, inputs_.at(0).dim(0).extent(), 0);
    funcs_.whole.push_back(gpu_ ? reduce_whole_gpu(n.op, reduction_operand(id, name), count,
                                                   s_.vector_width, s_.gpu_block, name)
                                : reduce_whole(n.op, reduction_operand(id, name), count, chunk_,
                                               s_.vector_width, name));
    Expr v = finish(n.op, funcs_.whole.back().total(), count);
    return Halide::cast(halide_type(n.dtype), v);
  }

  Expr row_reduction(NodeId id) {
    const Node& n = g_.node(id);
    const std::string name = "row" + std::to_string(stages_named_++);
    funcs_.rows.push_back(
        gpu_ ? reduce_rows_gpu(n.op, reduction_operand(id, name), cols_, s_.vector_width,
                               s_.gpu_block, name)
             : reduce_rows(n.op, reduction_operand(id, name), cols_, s_.vector_width, name));
    Expr v = finish(n.op, from_bits(id, funcs_.rows.back().row(funcs_.y)), cols_);
    return Halide::cast(halide_type(n.dtype), v);
  }

  std::vector<Halide::Argument> arguments() const {
    std::vector<Halide::Argument> args(inputs_.begin(), inputs_.end());
    args.insert(args.end(), scalars_.begin(), scalars_.end());
    args.push_back(chunk_);
    if (funcs_.per_row) args.push_back(cols_);
    return args;
  }

  const Graph& g_;
  Schedule s_;
  bool gpu_ = false;  // a GPU target: the reductions get their GPU definitions (reduce.h)
  // x86 with FMA: f32 multiply-adds written through f64 and f32 square roots become whole-vector
  // LLVM intrinsics (fma.h).
  bool exact_fma_ = false;
  std::vector<Halide::Var> vars_;  // x, or x, y for per-row graphs
  std::vector<Expr> uexpr_;        // memo by node id
  std::vector<Expr> texpr_[3];     // memo by context, node id
  RowPlan rows_;                   // per-row graphs: what is computed once per row (row_plan.h)
  std::vector<Halide::ImageParam> inputs_;
  // i: inputs_[i]'s node and its load slot (-1: not read, not loaded)
  std::vector<std::pair<NodeId, int>> input_slot_;
  std::vector<Halide::Param<>> scalars_;
  std::vector<NodeId> uniform_ids_;  // uniforms Func element i computes node uniform_ids_[i]
  Halide::Param<int32_t> chunk_{"chunk"};
  Halide::Param<int32_t> cols_{"cols"};
  int stages_named_ = 0;  // reduction stages named so far (their Funcs need unique names)
  PipelineFuncs funcs_;
};

}  // namespace

Halide::Type halide_type(DType t) {
  switch (t) {
    case DType::F32:
      return Halide::Float(32);
    case DType::F64:
      return Halide::Float(64);
    case DType::F16:
      return Halide::Float(16);
    case DType::BF16:
      return Halide::BFloat(16);
    case DType::Bool:
      return Halide::Bool();
    case DType::U8:
      return Halide::UInt(8);
  }
  internal_error("halide_type: bad dtype");
}

Schedule resolve_schedule(Schedule s, const Halide::Target& target) {
  if (target.has_gpu_feature()) {
    // Fields the GPU schedule does not read are reset, so they never split keys.
    Schedule gpu;
    gpu.vector_width = s.vector_width > 0 ? s.vector_width : kGpuVectorWidth;
    gpu.gpu_block = s.gpu_block > 0 ? s.gpu_block : kGpuBlock;
    return gpu;
  }
  s.gpu_block = 0;  // CPU keys do not depend on a GPU-only field
  if (s.vector_width <= 0) s.vector_width = 2 * target.natural_vector_size(Halide::Float(32));
  s.tasks_per_thread = std::max(s.tasks_per_thread, 1);
  s.min_task = std::max<int64_t>(s.min_task, 1);
  s.unroll = std::max(s.unroll, 1);
  s.task_elems = std::max<int64_t>(s.task_elems, 0);
  s.prefetch = std::max(s.prefetch, 0);
  s.prefetch_l2 = std::max(s.prefetch_l2, 0);
  return s;
}

Lowered lower(const Graph& canonical, const Schedule& s, const Halide::Target& target,
              const CpuExtras& extras) {
  if (!uses_cols(canonical)) return PipelineBuilder(canonical).build(s, target, extras);
  if (target.has_gpu_feature())
    throw Error("graph \"" + canonical.name() +
                "\": column reductions and column state (col_mean, Role::ColState) are not "
                "supported on CUDA targets yet");
  return lower_staged(canonical, s, target, extras);
}

}  // namespace optfuse::lower
