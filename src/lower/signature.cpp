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
  return sig;
}

}  // namespace optfuse::lower
