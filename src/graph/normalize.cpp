// normalize(): idiom rules, then host scalars (maximal uniform float subexpressions read by
// element-wise ops become kernel scalars computed on the host in double), then canonicalize().
#include <algorithm>
#include <charconv>
#include <functional>

#include "graph/eval.h"
#include "graph/idiom_rules.h"
#include "optfuse/error.h"
#include "optfuse/idioms.h"

namespace optfuse {
namespace {

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

bool is_infix(Op op) { return op == Op::Add || op == Op::Sub || op == Op::Mul || op == Op::Div; }

char infix_char(Op op) {
  switch (op) {
    case Op::Add:
      return '+';
    case Op::Sub:
      return '-';
    case Op::Mul:
      return '*';
    default:
      return '/';
  }
}

std::string number_text(double v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, res.ptr);
}

HostExpr constant(double v, DType t) { return HostExpr{Op::Const, t, v, "", {}}; }

bool is_const(const HostExpr& e, double v) { return e.op == Op::Const && e.value == v; }

// Rewrites that only change the double-precision evaluation order, so that one quantity has one
// formula (and with it one name): a * (1/b) -> a / b, sqrt(1/b) -> 1 / sqrt(b).
HostExpr simplify(HostExpr e) {
  for (HostExpr& a : e.args) a = simplify(std::move(a));
  if (e.op == Op::Mul) {
    for (int i = 0; i < 2; ++i) {
      const HostExpr& r = e.args[1 - i];
      if (r.op == Op::Div && is_const(r.args[0], 1))
        return HostExpr{Op::Div, e.dtype, 0, "", {e.args[i], r.args[1]}};
    }
  }
  if (e.op == Op::Sqrt && e.args[0].op == Op::Div && is_const(e.args[0].args[0], 1)) {
    HostExpr root{Op::Sqrt, e.dtype, 0, "", {e.args[0].args[1]}};
    return HostExpr{Op::Div, e.dtype, 0, "", {constant(1, e.dtype), root}};
  }
  return e;
}

// The library's names for the host scalars its optimizers compute, so that a user graph spelling
// the same update asks for the same kernel (the kernel key includes scalar names).
std::string scalar_name(const HostExpr& e) {
  static const std::map<std::string, std::string> kKnown = {
      {"select(maximize,-1,1)", "grad_sign"},
      {"1-(lr*weight_decay)", "decay"},
      {"lr/bias_correction1", "step_size"},
      {"lr/(1-pow(beta1,step))", "step_size"},
      {"1/sqrt(bias_correction2)", "inv_bias_correction2_sqrt"},
      {"1/sqrt(1-pow(beta2,step))", "inv_bias_correction2_sqrt"},
  };
  std::string text = e.str();
  if (auto it = kKnown.find(text); it != kKnown.end()) return it->second;
  if (e.op == Op::Sub && is_const(e.args[0], 1) && e.args[1].op == Op::Scalar)
    return "one_minus_" + e.args[1].name;
  return text;
}

class Hoister {
 public:
  explicit Hoister(const Graph& in) : in_(in), out_(in.name()) {
    for (size_t i = 0; i < in.nodes().size(); ++i)
      if (in.nodes()[i].op == Op::Scalar) source_scalars_.push_back(in.nodes()[i].name);
    // Tensor inputs are the kernel's buffers: all kept. Scalars only where still read.
    for (size_t i = 0; i < in.nodes().size(); ++i)
      if (in.nodes()[i].op == Op::Input)
        copied_[static_cast<NodeId>(i)] = out_.add_node(in.nodes()[i]);
    for (const Output& o : in.outputs()) out_.output(o.replaces, out_.value(get(o.value, true)));
    for (const Result& r : in.results()) out_.result(r.name, out_.value(get(r.value, true)));
  }

  Graph& graph() { return out_; }
  std::map<std::string, HostExpr>& host() { return host_; }

 private:
  // Computable on the host: scalars, constants and math on them (not a tensor, not a reduction
  // of one, which is uniform but needs the data).
  bool on_host(NodeId id) {
    if (auto it = on_host_.find(id); it != on_host_.end()) return it->second;
    const Node& n = in_.node(id);
    bool host = n.op == Op::Scalar || n.op == Op::Const;
    if (!op_has(n.op, kLeaf) && !n.is_tensor && !op_has(n.op, kReduce | kRowReduce | kColReduce)) {
      host = true;
      for (NodeId a : n.args) host = host && on_host(a);
    }
    return on_host_[id] = host;
  }

  // The out-graph node for in-node `id`, hoisted when the kernel reads it (a per-element op, a
  // reduction's math, an output or a result) and the host can compute it.
  NodeId get(NodeId id, bool read_by_kernel) {
    const Node& n = in_.node(id);
    bool hoist = read_by_kernel && on_host(id) && !op_has(n.op, kLeaf) && is_float(n.dtype);
    if (hoist) return hoisted(id);
    if (auto it = copied_.find(id); it != copied_.end()) return it->second;
    Node copy = n;
    for (NodeId& a : copy.args) a = get(a, !on_host(id));
    NodeId out = out_.add_node(std::move(copy));
    copied_[id] = out;
    return out;
  }

  NodeId hoisted(NodeId id) {
    if (auto it = hoisted_.find(id); it != hoisted_.end()) return it->second;
    HostExpr e = simplify(expr(id));
    std::string name = unique_name(e);
    host_[name] = e;
    NodeId out = out_.scalar(name, in_.node(id).dtype).id();
    hoisted_[id] = out;
    return out;
  }

  // A name no source scalar has and no other formula took: the library's name if known, else
  // the formula's text.
  std::string unique_name(const HostExpr& e) {
    std::string text = e.str();
    for (std::string name : {scalar_name(e), text, text + "'"}) {
      bool source = std::count(source_scalars_.begin(), source_scalars_.end(), name) > 0;
      auto it = host_.find(name);
      if (!source && (it == host_.end() || it->second.str() == text)) return name;
    }
    internal_error("no free name for host scalar " + text);
  }

  HostExpr expr(NodeId id) const {
    const Node& n = in_.node(id);
    HostExpr e{n.op, n.dtype, n.value, n.name, {}};
    for (NodeId a : n.args) e.args.push_back(expr(a));
    return e;
  }

  const Graph& in_;
  Graph out_;
  std::vector<std::string> source_scalars_;
  std::map<NodeId, NodeId> copied_, hoisted_;
  std::map<NodeId, bool> on_host_;
  std::map<std::string, HostExpr> host_;
};

}  // namespace

double HostExpr::eval(const std::map<std::string, double>& scalars) const {
  if (op == Op::Const) return value;
  if (op == Op::Scalar) {
    auto it = scalars.find(name);
    if (it == scalars.end()) throw Error("host scalar formula needs scalar " + quoted(name));
    return dtype == DType::Bool ? (it->second != 0 ? 1.0 : 0.0) : it->second;
  }
  double a[3] = {0, 0, 0};
  for (size_t i = 0; i < args.size() && i < 3; ++i) a[i] = args[i].eval(scalars);
  // In double throughout (a cast still rounds to its dtype, as the graph says).
  return graph_detail::eval_op(op, op == Op::Cast ? dtype : DType::F64, a);
}

std::string HostExpr::str() const {
  if (op == Op::Const) return number_text(value);
  if (op == Op::Scalar) return name;
  std::vector<std::string> parts;
  for (const HostExpr& a : args) {
    std::string s = a.str();
    parts.push_back(is_infix(op) && is_infix(a.op) ? "(" + s + ")" : s);
  }
  if (op_has(op, kCommutative)) std::sort(parts.begin(), parts.end());
  if (is_infix(op)) return parts[0] + infix_char(op) + parts[1];
  std::string out = std::string(op_name(op)) + "(";
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? "," : "") + parts[i];
  if (op == Op::Cast) out += std::string(",") + std::string(dtype_name(dtype));
  return out + ")";
}

std::map<std::string, double> NormalizedGraph::kernel_scalars(
    const std::map<std::string, double>& source) const {
  std::map<std::string, double> out;
  for (const Node& n : graph.nodes()) {
    if (n.op != Op::Scalar) continue;
    if (auto h = host_scalars.find(n.name); h != host_scalars.end()) {
      out[n.name] = h->second.eval(source);
    } else if (auto s = source.find(n.name); s != source.end()) {
      out[n.name] = s->second;
    } else {
      throw Error("kernel scalar " + quoted(n.name) + " has no value");
    }
  }
  return out;
}

NormalizedGraph normalize(const Graph& g) {
  rewrite::RewriteResult r = rewrite::rewrite(canonicalize(g), idioms_detail::idiom_rule_set());
  if (!r.converged)
    internal_error("idiom rules did not reach a fixed point on graph " + quoted(g.name()) +
                   " after " + std::to_string(r.passes) + " passes");
  Hoister h(r.graph);
  return NormalizedGraph{canonicalize(h.graph()), std::move(h.host()), std::move(r.matched)};
}

std::vector<std::string> matched_idioms(const Graph& g) { return normalize(g).idioms; }

std::string describe(const NormalizedGraph& n) {
  std::string out = "idioms:";
  for (const std::string& i : n.idioms) out += " " + i;
  if (n.idioms.empty()) out += " (none)";
  out += "\nhost scalars:";
  if (n.host_scalars.empty()) out += " (none)";
  for (const auto& [name, e] : n.host_scalars) out += "\n  " + name + " = " + e.str();
  return out + "\n";
}

std::vector<IdiomInfo> idiom_rules() { return idioms_detail::idiom_infos(); }

}  // namespace optfuse
