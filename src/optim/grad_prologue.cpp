#include "optim/grad_prologue.h"

#include <vector>

#include "optfuse/error.h"

namespace optfuse::optim {

std::string GradPrologue::structure() const {
  std::string s;
  if (accumulated) s += "|gacc";
  if (scaled) s += "|gscale";
  return s;
}

Graph with_grad_prologue(const Graph& rule_graph, const GradPrologue& p) {
  if (p.empty()) return rule_graph;
  if (rule_graph.find_input(kGradAccum) >= 0 || rule_graph.find_scalar(kGradScale) >= 0)
    internal_error("update graph '" + rule_graph.name() + "' already uses '" + kGradAccum +
                   "' or '" + kGradScale + "'");
  Graph out(rule_graph.name() + p.structure());
  // Copy node by node (operands come before users); each grad input becomes g_eff.
  std::vector<NodeId> to_out;
  to_out.reserve(rule_graph.nodes().size());
  for (const Node& old : rule_graph.nodes()) {
    Node n = old;
    for (NodeId& a : n.args) a = to_out[static_cast<size_t>(a)];
    NodeId id = out.add_node(n);
    if (n.op == Op::Input && n.role == Role::Grad) {
      Value g = out.value(id);
      if (p.accumulated) g = out.state(kGradAccum, n.dtype) + g;
      if (p.scaled) g = g * out.scalar(kGradScale, n.dtype);
      id = g.id();
    }
    to_out.push_back(id);
  }
  for (const Output& o : rule_graph.outputs())
    out.output(o.replaces, out.value(to_out[static_cast<size_t>(o.value)]));
  for (const Result& r : rule_graph.results())
    out.result(r.name, out.value(to_out[static_cast<size_t>(r.value)]));
  return out;
}

Graph accumulate_graph(bool first, DType grad) {
  const DType sum = grad == DType::F64 ? DType::F64 : DType::F32;  // f64 grads sum in f64
  Graph gr(std::string(first ? "grad_accum_init" : "grad_accum_add") +
           (grad == DType::F32 ? "" : "_g" + std::string(dtype_name(grad))));
  Value acc = gr.state(kGradAccum, sum), g = gr.grad("grad", grad);
  if (grad != sum) g = cast(g, sum);
  gr.output(kGradAccum, first ? g : acc + g);
  return gr;
}

}  // namespace optfuse::optim
