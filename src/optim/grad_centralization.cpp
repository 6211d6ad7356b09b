#include "optim/grad_centralization.h"

#include <vector>

#include "optfuse/error.h"

namespace optfuse::optim {

Graph centralize(const Graph& g) {
  const NodeId at = g.find_label(kEffectiveGrad);
  if (at < 0) internal_error("graph '" + g.name() + "' labels no effective gradient to centralize");
  Graph out(g.name() + "_gc");
  std::vector<NodeId> to_out;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    Node n = g.nodes()[i];
    for (NodeId& a : n.args) a = to_out[static_cast<size_t>(a)];
    NodeId id = out.add_node(std::move(n));
    if (static_cast<NodeId>(i) == at) id = (out.value(id) - row_mean(out.value(id))).id();
    to_out.push_back(id);
  }
  for (const Output& o : g.outputs()) out.output(o.replaces, out.value(to_out[o.value]));
  for (const Result& r : g.results()) out.result(r.name, out.value(to_out[r.value]));
  return out;
}

}  // namespace optfuse::optim
