#include "lower/row_plan.h"

#include <algorithm>

#include "lower/signature.h"

namespace optfuse::lower {
namespace {

bool contains(const std::vector<NodeId>& v, NodeId id) {
  return std::find(v.begin(), v.end(), id) != v.end();
}

void classify(const Graph& g, RowPlan* p) {
  const size_t count = g.nodes().size();
  p->row_level.assign(count, false);
  p->after_reduction.assign(count, false);
  for (size_t id = 0; id < count; ++id) {
    const Node& n = g.nodes()[id];
    if (!n.is_tensor) continue;
    if (op_has(n.op, kRowReduce)) {
      p->row_level[id] = p->after_reduction[id] = true;
      continue;
    }
    if (n.op == Op::Input || n.op == Op::RoundSR) {
      p->row_level[id] = is_row_state(n);
      continue;
    }
    bool row = true, after = false;
    for (NodeId a : n.args) {
      if (!g.node(a).is_tensor) continue;
      row = row && p->row_level[a];
      after = after || p->after_reduction[a];
    }
    p->row_level[id] = row;
    p->after_reduction[id] = row && after;
  }
}

// Every per-element node either stage computes, and the row-level operands they use.
void collect_row_values(const Graph& g, RowPlan* p) {
  std::vector<bool> seen(g.nodes().size(), false);
  std::vector<NodeId> stack;
  auto visit = [&](NodeId id) {
    if (seen[id]) return;
    seen[id] = true;
    stack.push_back(id);
  };
  for (const Output& o : element_outputs(g)) visit(o.value);
  while (!stack.empty()) {
    const Node& n = g.node(stack.back());
    stack.pop_back();
    for (NodeId a : n.args) {
      if (!g.node(a).is_tensor) continue;
      if (!p->row_level[a]) {
        visit(a);
        continue;
      }
      std::vector<NodeId>& ids = p->row_values[p->after_reduction[a] ? 1 : 0];
      if (!contains(ids, a)) ids.push_back(a);
      if (op_has(g.node(a).op, kRowReduce)) visit(g.node(a).args[0]);
    }
  }
}

void choose_fresh(const Graph& g, RowPlan* p) {
  const std::vector<bool> in_main = main_nodes(g);
  for (const Node& n : g.nodes()) {
    if (!op_has(n.op, kRowReduce)) continue;
    NodeId z = n.args[0];
    if (g.node(z).op == Op::Abs) z = g.node(z).args[0];
    if (g.node(z).is_tensor && !p->row_level[z] && in_main[z] && !contains(p->fresh, z))
      p->fresh.push_back(z);
  }
  const std::vector<NodeId> reduced = p->fresh;
  for (size_t id = 0; id < g.nodes().size(); ++id) {
    const Node& n = g.nodes()[id];
    if (n.op == Op::Sqrt && in_main[id] && contains(reduced, n.args[0]))
      p->fresh.push_back(static_cast<NodeId>(id));
  }
}

void find_update_reads(const Graph& g, RowPlan* p) {
  p->update_reads.assign(g.nodes().size(), false);
  std::vector<bool> seen(g.nodes().size(), false);
  std::vector<NodeId> stack;
  for (const Output& o : element_outputs(g)) stack.push_back(o.value);
  while (!stack.empty()) {
    NodeId id = stack.back();
    stack.pop_back();
    if (seen[id]) continue;
    seen[id] = true;
    const Node& n = g.node(id);
    if (n.op == Op::Input) p->update_reads[id] = true;
    if (p->row_level[id] || contains(p->fresh, id) || !n.is_tensor) continue;
    for (NodeId a : n.args) stack.push_back(a);
  }
}

}  // namespace

bool is_row_state(const Node& n) { return n.op == Op::Input && n.role == Role::RowState; }
bool is_col_state(const Node& n) { return n.op == Op::Input && n.role == Role::ColState; }

namespace {

// The outputs (in the kernel's order) whose replaced input satisfies `keep`.
template <typename Keep>
std::vector<Output> outputs_replacing(const Graph& g, Keep keep) {
  std::vector<Output> outs = kernel_outputs(g);
  outs.erase(
      std::remove_if(outs.begin(), outs.end(),
                     [&](const Output& o) { return !keep(g.node(g.find_input(o.replaces))); }),
      outs.end());
  return outs;
}

}  // namespace

std::vector<Output> element_outputs(const Graph& g) {
  return outputs_replacing(g, [](const Node& n) { return !is_row_state(n) && !is_col_state(n); });
}

std::vector<Output> row_state_outputs(const Graph& g) {
  return outputs_replacing(g, [](const Node& n) { return is_row_state(n); });
}

std::vector<Output> col_state_outputs(const Graph& g) {
  return outputs_replacing(g, [](const Node& n) { return is_col_state(n); });
}

std::vector<bool> main_nodes(const Graph& g) {
  std::vector<bool> in_main(g.nodes().size(), false);
  std::vector<NodeId> stack;
  for (const Output& o : g.outputs()) stack.push_back(o.value);
  while (!stack.empty()) {
    NodeId id = stack.back();
    stack.pop_back();
    if (in_main[id]) continue;
    in_main[id] = true;
    const Node& n = g.node(id);
    if (op_has(n.op, kReduce | kRowReduce)) continue;
    for (NodeId a : n.args) stack.push_back(a);
  }
  return in_main;
}

RowPlan plan_rows(const Graph& g, bool gpu) {
  RowPlan p;
  classify(g, &p);
  collect_row_values(g, &p);
  bool row_state = false;
  for (const Node& n : g.nodes()) row_state = row_state || is_row_state(n);
  if (row_state && !gpu) {
    choose_fresh(g, &p);
    if (!p.fresh.empty()) find_update_reads(g, &p);
  }
  return p;
}

}  // namespace optfuse::lower
