#include "lower/signature.h"

#include <algorithm>

namespace optfuse::lower {

KernelSignature signature(const Graph& g) {
  KernelSignature sig;
  for (const Node& n : g.nodes()) {
    if (n.op == Op::Input) sig.inputs.push_back({n.name, n.role, n.dtype});
    if (n.op == Op::Scalar) sig.scalars.push_back({n.name, n.dtype});
  }
  for (const Output& o : g.outputs()) sig.outputs.push_back({o.replaces, g.node(o.value).dtype});
  std::stable_sort(sig.outputs.begin(), sig.outputs.end(),
                   [](const auto& a, const auto& b) { return a.replaces < b.replaces; });
  for (const Result& r : g.results()) sig.results.push_back({r.name, g.node(r.value).dtype});
  std::stable_sort(sig.results.begin(), sig.results.end(),
                   [](const auto& a, const auto& b) { return a.name < b.name; });
  sig.per_row = uses_rows(g);
  for (const Node& n : g.nodes()) sig.reduces = sig.reduces || op_has(n.op, kReduce);
  return sig;
}

}  // namespace optfuse::lower
