// Lowering of a canonical graph to one Halide pipeline (see lower.h for its shape).
#include "lower/lower.h"

#include <algorithm>
#include <cctype>
#include <string>

#include "lower/lower_ops.h"
#include "lower/schedule.h"
#include "optfuse/error.h"

namespace optfuse::lower {
namespace {

using Halide::Expr;
using Halide::Func;

// Halide names are C identifiers in generated code: user names are sanitized and prefixed, and
// the index keeps them unique.
std::string identifier(const char* prefix, size_t index, const std::string& name) {
  std::string id = std::string(prefix) + std::to_string(index) + "_";
  for (char c : name) id += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return id;
}

// A Tuple element of a call to `f`, whose definition has `count` values (Halide refuses [] on a
// Func that does not return a Tuple).
Expr element(const Halide::FuncRef& ref, int index, size_t count) {
  return count == 1 ? Expr(ref) : Expr(ref[index]);
}

void define(Func& f, const std::vector<Halide::Var>& vars, const std::vector<Expr>& values) {
  if (values.size() == 1)
    f(vars) = values[0];
  else
    f(vars) = Halide::Tuple(values);
}

class PipelineBuilder {
 public:
  explicit PipelineBuilder(const Graph& g)
      : g_(g), uexpr_(g.nodes().size()), texpr_(g.nodes().size()) {}

  Lowered build(const Schedule& s, const Halide::Target& target) {
    if (g_.outputs().empty()) throw Error("graph \"" + g_.name() + "\" has no outputs to compute");
    make_leaves();
    make_uniforms();
    std::vector<Expr> outputs;
    for (const Output& o : sorted_outputs()) outputs.push_back(operand(o.value));
    define(funcs_.out, {funcs_.x}, outputs);
    funcs_.inputs = inputs_;
    apply_schedule(funcs_, s, target);
    return Lowered{Halide::Pipeline(funcs_.out), arguments()};
  }

 private:
  std::vector<Output> sorted_outputs() const {
    std::vector<Output> outs = g_.outputs();
    std::stable_sort(outs.begin(), outs.end(),
                     [](const Output& a, const Output& b) { return a.replaces < b.replaces; });
    return outs;
  }

  // Inputs some node or output reads. An input only written (a bf16 param whose update is
  // computed from its f32 master copy) keeps its ImageParam, which the output then overwrites,
  // but is never loaded: no bytes are read for it.
  std::vector<bool> read_inputs() const {
    std::vector<bool> read(g_.nodes().size(), false);
    for (const Node& n : g_.nodes())
      for (NodeId a : n.args) read[a] = true;
    for (const Output& o : g_.outputs()) read[o.value] = true;
    return read;
  }

  // ImageParams, Params and the load Func; tensor inputs read through load(x) only.
  void make_leaves() {
    std::vector<Expr> loads;
    const std::vector<bool> read = read_inputs();
    for (size_t id = 0; id < g_.nodes().size(); ++id) {
      const Node& n = g_.nodes()[id];
      if (n.op == Op::Input) {
        inputs_.emplace_back(halide_type(n.dtype), 1, identifier("in", inputs_.size(), n.name));
        if (!read[id]) continue;
        input_slot_.push_back({static_cast<NodeId>(id), static_cast<int>(loads.size())});
        loads.push_back(inputs_.back()(funcs_.x));
      } else if (n.op == Op::Scalar) {
        scalars_.emplace_back(halide_type(n.dtype), identifier("s", scalars_.size(), n.name));
        uexpr_[id] = scalars_.back();
      } else if (n.op == Op::Const) {
        uexpr_[id] = constant(n.value, n.dtype);
      }
    }
    if (loads.empty()) return;
    funcs_.load = Func("load");
    define(funcs_.load, {funcs_.x}, loads);
    for (auto [id, slot] : input_slot_)
      texpr_[id] = element(funcs_.load(funcs_.x), slot, loads.size());
  }

  // Every maximal scalar-only subexpression that per-element code uses (an operand of a tensor
  // node, or an output) becomes one element of the 0-D uniforms Func, computed once per call.
  void make_uniforms() {
    auto wants_slot = [&](NodeId id) {
      const Node& n = g_.node(id);
      return !n.is_tensor && !op_has(n.op, kLeaf) &&
             std::find(uniform_ids_.begin(), uniform_ids_.end(), id) == uniform_ids_.end();
    };
    for (const Node& n : g_.nodes())
      if (n.is_tensor)
        for (NodeId a : n.args)
          if (wants_slot(a)) uniform_ids_.push_back(a);
    for (const Output& o : g_.outputs())
      if (wants_slot(o.value)) uniform_ids_.push_back(o.value);
    if (uniform_ids_.empty()) return;
    std::vector<Expr> values;
    for (NodeId id : uniform_ids_) values.push_back(uniform(id));
    funcs_.uniforms = Func("uniforms");
    define(funcs_.uniforms, {}, values);
  }

  // A uniform node in terms of Params and constants (exact precision: it runs once per call).
  Expr uniform(NodeId id) {
    if (uexpr_[id].defined()) return uexpr_[id];
    const Node& n = g_.node(id);
    std::vector<Expr> args;
    for (NodeId a : n.args) args.push_back(uniform(a));
    return uexpr_[id] = lower_op(n.op, n.dtype, args, Precision::Exact);
  }

  // A value as per-element code sees it: tensor nodes computed per element, leaves directly,
  // other uniform nodes read from the uniforms Func.
  Expr operand(NodeId id) {
    const Node& n = g_.node(id);
    if (n.is_tensor) return tensor(id);
    if (op_has(n.op, kLeaf)) return uniform(id);
    auto it = std::find(uniform_ids_.begin(), uniform_ids_.end(), id);
    if (it == uniform_ids_.end()) internal_error("lower: uniform node without a slot");
    return element(funcs_.uniforms(), static_cast<int>(it - uniform_ids_.begin()),
                   uniform_ids_.size());
  }

  Expr tensor(NodeId id) {
    if (texpr_[id].defined()) return texpr_[id];
    const Node& n = g_.node(id);
    std::vector<Expr> args;
    for (NodeId a : n.args) args.push_back(operand(a));
    if (n.op == Op::RoundSR) return texpr_[id] = round_sr_bf16(args[0], args[1], funcs_.x);
    return texpr_[id] = lower_op(n.op, n.dtype, args, Precision::Fast);
  }

  std::vector<Halide::Argument> arguments() const {
    std::vector<Halide::Argument> args(inputs_.begin(), inputs_.end());
    args.insert(args.end(), scalars_.begin(), scalars_.end());
    args.push_back(chunk_);
    return args;
  }

  const Graph& g_;
  std::vector<Expr> uexpr_, texpr_;  // memo by node id
  std::vector<Halide::ImageParam> inputs_;
  std::vector<std::pair<NodeId, int>> input_slot_;
  std::vector<Halide::Param<>> scalars_;
  std::vector<NodeId> uniform_ids_;  // uniforms Func element i computes node uniform_ids_[i]
  Halide::Param<int32_t> chunk_{"chunk"};
  PipelineFuncs funcs_{Func("out"), Func(), Func(), Halide::Var("x"), chunk_, {}};
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
  return s;
}

Lowered lower(const Graph& canonical, const Schedule& s, const Halide::Target& target) {
  return PipelineBuilder(canonical).build(s, target);
}

}  // namespace optfuse::lower
