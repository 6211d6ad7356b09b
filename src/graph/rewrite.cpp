// The rule engine: matching with any-order commutative operands and named bindings, and the
// fixed-point driver that copies a graph bottom-up, rewriting each node as it is copied.
#include "graph/rewrite.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "optfuse/error.h"

namespace optfuse::rewrite {

Pattern::Pattern(Op op, std::vector<Pattern> args, std::string bind)
    : is_op_(true), op_(op), args_(std::move(args)), bind_(std::move(bind)) {
  if (op_has(op, kLeaf))
    internal_error("pattern: " + std::string(op_name(op)) + " is a leaf; use a leaf pattern");
  if (args_.size() != static_cast<size_t>(op_arity(op)))
    internal_error("pattern: " + std::string(op_name(op)) + " takes " +
                   std::to_string(op_arity(op)) + " operands, the pattern has " +
                   std::to_string(args_.size()));
}

Pattern Pattern::node(std::string bind, NodePredicate pred) {
  Pattern p;
  p.bind_ = std::move(bind);
  p.pred_ = std::move(pred);
  return p;
}

Pattern any(std::string bind) { return Pattern::node(std::move(bind)); }

Pattern tensor(std::string bind) {
  return Pattern::node(std::move(bind),
                       [](const Graph& g, NodeId id) { return g.node(id).is_tensor; });
}

Pattern uniform(std::string bind) {
  return Pattern::node(std::move(bind),
                       [](const Graph& g, NodeId id) { return !g.node(id).is_tensor; });
}

Pattern constant(double v, std::string bind) {
  return Pattern::node(std::move(bind), [v](const Graph& g, NodeId id) {
    const Node& n = g.node(id);
    return n.op == Op::Const && n.value == v && std::signbit(n.value) == std::signbit(v);
  });
}

Pattern input(Role role, std::string bind) {
  return Pattern::node(std::move(bind), [role](const Graph& g, NodeId id) {
    return g.node(id).op == Op::Input && g.node(id).role == role;
  });
}

NodeId Match::operator[](const std::string& name) const {
  auto it = bindings.find(name);
  if (it == bindings.end()) internal_error("rule callback asked for unbound name '" + name + "'");
  return it->second;
}

namespace {

bool bind(const std::string& name, NodeId id, Bindings* b) {
  if (name.empty()) return true;
  auto [it, inserted] = b->emplace(name, id);
  return inserted || it->second == id;
}

// Operands in the order given by `order` (a permutation of the pattern's operand indices).
bool match_operands(const Graph& g, const Pattern& p, const Node& n,
                    const std::vector<size_t>& order, Bindings* b) {
  for (size_t i = 0; i < order.size(); ++i)
    if (!match(g, p.args()[order[i]], n.args[i], b)) return false;
  return true;
}

}  // namespace

bool match(const Graph& g, const Pattern& p, NodeId id, Bindings* b) {
  const Node& n = g.node(id);
  if (!p.is_op()) {
    if (p.predicate() && !p.predicate()(g, id)) return false;
    return bind(p.bind(), id, b);
  }
  if (n.op != p.op()) return false;
  std::vector<size_t> order(n.args.size());
  std::iota(order.begin(), order.end(), 0);
  // Each ordering is tried on a copy, so a failed attempt leaves no bindings behind.
  do {
    Bindings trial = *b;
    if (match_operands(g, p, n, order, &trial) && bind(p.bind(), id, &trial)) {
      *b = std::move(trial);
      return true;
    }
  } while (op_has(n.op, kCommutative) && std::next_permutation(order.begin(), order.end()));
  return false;
}

void RuleSet::add(Rule r) {
  if (!r.pattern.is_op()) internal_error("rule '" + r.name + "': the root must be an op pattern");
  by_op_[r.pattern.op()].push_back(std::move(r));
}

const std::vector<Rule>& RuleSet::for_op(Op op) const {
  static const std::vector<Rule> kNone;
  auto it = by_op_.find(op);
  return it == by_op_.end() ? kNone : it->second;
}

size_t RuleSet::size() const {
  size_t n = 0;
  for (const auto& entry : by_op_) n += entry.second.size();
  return n;
}

namespace {

// Nodes an output or a result reaches, plus every leaf.
std::vector<bool> live_nodes(const Graph& g) {
  std::vector<bool> live(g.nodes().size(), false);
  std::vector<NodeId> stack;
  for (const Output& o : g.outputs()) stack.push_back(o.value);
  for (const Result& r : g.results()) stack.push_back(r.value);
  while (!stack.empty()) {
    NodeId id = stack.back();
    stack.pop_back();
    if (live[id]) continue;
    live[id] = true;
    for (NodeId a : g.node(id).args) stack.push_back(a);
  }
  for (size_t i = 0; i < g.nodes().size(); ++i)
    if (op_has(g.nodes()[i].op, kLeaf)) live[i] = true;
  return live;
}

class Pass {
 public:
  Pass(const RuleSet& rules, std::vector<std::string>* matched)
      : rules_(rules), matched_(matched) {}

  // One bottom-up copy of `in`; returns whether any rule changed a node.
  bool run(const Graph& in, Graph* out) {
    std::vector<bool> live = live_nodes(in);
    std::vector<NodeId> to_out(in.nodes().size(), -1);
    for (size_t i = 0; i < in.nodes().size(); ++i) {
      if (!live[i]) continue;
      Node n = in.nodes()[i];
      for (NodeId& a : n.args) a = to_out[a];
      to_out[i] = apply(*out, out->add_node(std::move(n)));
    }
    for (const Output& o : in.outputs()) out->output(o.replaces, out->value(to_out[o.value]));
    for (const Result& r : in.results()) out->result(r.name, out->value(to_out[r.value]));
    return changed_;
  }

 private:
  // Rewrites `id` until no rule changes it; a rule's result is itself offered to the rules, so a
  // chain of rewrites at one node completes in one pass. The cap catches rules that cycle.
  NodeId apply(Graph& g, NodeId id) {
    for (int round = 0; round < 64; ++round) {
      std::optional<NodeId> next = first_rewrite(g, id);
      if (!next) return id;
      id = *next;
      changed_ = true;
    }
    internal_error("rewrite rules cycle at a node of op " + std::string(op_name(g.node(id).op)));
  }

  // The first rule that rewrites `id` to a different node; recognitions are recorded on the way.
  std::optional<NodeId> first_rewrite(Graph& g, NodeId id) {
    for (const Rule& rule : rules_.for_op(g.node(id).op)) {
      Match m{id, {}};
      if (!match(g, rule.pattern, id, &m.bindings)) continue;
      std::optional<NodeId> result = rule.rewrite(g, m);
      if (!result) continue;
      record(rule.name);
      if (*result != id) return result;
    }
    return std::nullopt;
  }

  void record(const std::string& name) {
    if (std::find(matched_->begin(), matched_->end(), name) == matched_->end())
      matched_->push_back(name);
  }

  const RuleSet& rules_;
  std::vector<std::string>* matched_;
  bool changed_ = false;
};

}  // namespace

RewriteResult rewrite(const Graph& g, const RuleSet& rules, int max_passes) {
  RewriteResult r{g, {}, 0, false};
  while (r.passes < max_passes) {
    Graph next(g.name());
    bool changed = Pass(rules, &r.matched).run(r.graph, &next);
    r.graph = std::move(next);
    ++r.passes;
    if (!changed) {
      r.converged = true;
      break;
    }
  }
  return r;
}

}  // namespace optfuse::rewrite
