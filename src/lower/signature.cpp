#include "lower/signature.h"

#include <algorithm>

namespace optfuse::lower {
namespace {

Role replaced_role(const Graph& g, const Output& o) {
  return g.node(g.find_input(o.replaces)).role;
}

// Per-element outputs first, then row state, then column state.
int output_group(const Graph& g, const Output& o) {
  const Role r = replaced_role(g, o);
  return r == Role::RowState ? 1 : r == Role::ColState ? 2 : 0;
}

}  // namespace

std::vector<Output> kernel_outputs(const Graph& g) {
  std::vector<Output> outs = g.outputs();
  std::stable_sort(outs.begin(), outs.end(), [&](const Output& a, const Output& b) {
    const int ga = output_group(g, a), gb = output_group(g, b);
    return ga != gb ? ga < gb : a.replaces < b.replaces;
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
    sig.outputs.push_back({o.replaces, g.node(o.value).dtype, replaced_role(g, o) == Role::RowState,
                           replaced_role(g, o) == Role::ColState});
  for (const Result& r : g.results()) sig.results.push_back({r.name, g.node(r.value).dtype});
  std::stable_sort(sig.results.begin(), sig.results.end(),
                   [](const auto& a, const auto& b) { return a.name < b.name; });
  sig.per_col = uses_cols(g);
  sig.per_row = uses_rows(g) || sig.per_col;
  for (const Node& n : g.nodes()) sig.reduces = sig.reduces || op_has(n.op, kReduce);
  return sig;
}

}  // namespace optfuse::lower
