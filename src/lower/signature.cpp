#include "lower/signature.h"

#include <algorithm>

namespace optfuse::lower {
namespace {

bool replaces_row_state(const Graph& g, const Output& o) {
  return g.node(g.find_input(o.replaces)).role == Role::RowState;
}

}  // namespace

std::vector<Output> kernel_outputs(const Graph& g) {
  std::vector<Output> outs = g.outputs();
  std::stable_sort(outs.begin(), outs.end(), [&](const Output& a, const Output& b) {
    bool ra = replaces_row_state(g, a), rb = replaces_row_state(g, b);
    return ra != rb ? rb : a.replaces < b.replaces;
  });
  return outs;
}

KernelSignature signature(const Graph& g) {
  KernelSignature sig;
  for (const Node& n : g.nodes()) {
    if (n.op == Op::Input) sig.inputs.push_back({n.name, n.role, n.dtype});
    if (n.op == Op::Scalar) sig.scalars.push_back({n.name, n.dtype});
  }
  for (const Output& o : kernel_outputs(g))
    sig.outputs.push_back({o.replaces, g.node(o.value).dtype, replaces_row_state(g, o)});
  for (const Result& r : g.results()) sig.results.push_back({r.name, g.node(r.value).dtype});
  std::stable_sort(sig.results.begin(), sig.results.end(),
                   [](const auto& a, const auto& b) { return a.name < b.name; });
  sig.per_row = uses_rows(g);
  for (const Node& n : g.nodes()) sig.reduces = sig.reduces || op_has(n.op, kReduce);
  return sig;
}

}  // namespace optfuse::lower
