#include "lower/staged_plan.h"

#include "lower/row_plan.h"

namespace optfuse::lower {
namespace {

Level level_of_input(const Node& n) {
  if (n.role == Role::RowState) return {false, true};
  if (n.role == Role::ColState) return {true, false};
  return {true, true};
}

std::vector<Level> classify(const Graph& g) {
  std::vector<Level> level(g.nodes().size());
  for (size_t id = 0; id < g.nodes().size(); ++id) {
    const Node& n = g.nodes()[id];
    if (!n.is_tensor) continue;
    if (n.op == Op::Input) {
      level[id] = level_of_input(n);
      continue;
    }
    if (n.op == Op::RoundSR) {  // depends on the element index
      level[id] = {true, true};
      continue;
    }
    Level l;
    for (NodeId a : n.args) {
      l.along_row = l.along_row || level[a].along_row;
      l.across_rows = l.across_rows || level[a].across_rows;
    }
    if (op_has(n.op, kRowReduce)) l.along_row = false;
    if (op_has(n.op, kColReduce)) l.across_rows = false;
    level[id] = l;
  }
  return level;
}

Domain domain_of(const Level& l) {
  return l.along_row ? Domain::Column : l.across_rows ? Domain::Row : Domain::Batch;
}

}  // namespace

StagedPlan plan_staged(const Graph& g) {
  StagedPlan p;
  p.level = classify(g);
  const size_t count = g.nodes().size();
  p.stage.assign(count, std::nullopt);
  auto is_level_value = [&](NodeId id) {
    const Node& n = g.node(id);
    return n.is_tensor && n.op != Op::Input && !p.level[id].element();
  };
  for (size_t id = 0; id < count; ++id) {
    const Node& n = g.nodes()[id];
    if (op_has(n.op, kRowReduce)) p.stage[id] = Domain::Row;
    if (op_has(n.op, kColReduce))
      p.stage[id] = p.level[n.args[0]].along_row ? Domain::Column : Domain::Batch;
    if (op_has(n.op, kRowReduce | kColReduce)) continue;
    for (NodeId a : n.args) {
      const bool other_level = !n.is_tensor || p.level[a].along_row != p.level[id].along_row ||
                               p.level[a].across_rows != p.level[id].across_rows;
      // (A reduction keeps the domain it is computed in.)
      if (is_level_value(a) && !p.stage[a] && (other_level || op_has(n.op, kReduce)))
        p.stage[a] = domain_of(p.level[a]);
    }
  }
  // Reduction operands and outputs read level values from a root Func too.
  for (size_t id = 0; id < count; ++id) {
    const Node& n = g.nodes()[id];
    if (op_has(n.op, kRowReduce | kColReduce) && is_level_value(n.args[0]) && !p.stage[n.args[0]])
      p.stage[n.args[0]] = domain_of(p.level[n.args[0]]);
  }
  for (const Output& o : g.outputs())
    if (is_level_value(o.value) && !p.stage[o.value])
      p.stage[o.value] = domain_of(p.level[o.value]);
  return p;
}

std::vector<bool> staged_main_nodes(const Graph& g, const StagedPlan& p) {
  std::vector<bool> in_main(g.nodes().size(), false);
  std::vector<NodeId> stack;
  for (const Output& o : element_outputs(g)) stack.push_back(o.value);
  while (!stack.empty()) {
    const NodeId id = stack.back();
    stack.pop_back();
    if (in_main[id]) continue;
    const Node& n = g.node(id);
    if (!n.is_tensor || p.stage[id]) continue;
    in_main[id] = true;
    for (NodeId a : n.args) stack.push_back(a);
  }
  return in_main;
}

}  // namespace optfuse::lower
