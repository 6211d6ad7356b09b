#pragma once
// The skeleton of the graph transforms that change how tensors are stored (precision.cpp,
// block_state.cpp): copy a graph node by node, replacing each input, then declare the outputs.
#include <utility>
#include <vector>

#include "optfuse/graph.h"

namespace optfuse::optim {

// Copies `in` into `out` for transform `t`: each input node becomes `t.input(node)` (a node id of
// `out`: a new input, or an expression of new inputs), every other node is copied with its
// operands mapped, then `t.store(o, value)` declares each of `in`'s outputs from its value in
// `out`. Returns `out`.
template <typename Transform>
Graph copy_graph(const Graph& in, Graph& out, Transform& t) {
  std::vector<NodeId> to_out;
  for (Node n : in.nodes()) {
    if (n.op == Op::Input) {
      to_out.push_back(t.input(n));
      continue;
    }
    for (NodeId& a : n.args) a = to_out[a];
    to_out.push_back(out.add_node(std::move(n)));
  }
  for (const Output& o : in.outputs()) t.store(o, out.value(to_out[o.value]));
  return std::move(out);
}

}  // namespace optfuse::optim
