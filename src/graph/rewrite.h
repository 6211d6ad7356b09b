#pragma once
// The rule engine: (pattern, callback) rules indexed by the root op, and a fixed-point driver.
//
//   using namespace optfuse::rewrite;
//   RuleSet rules;
//   rules.add({"lerp_spelling",
//              Pattern(Op::Sub, {any("x"), Pattern(Op::Mul, {uniform("w"),
//                                                            Pattern(Op::Sub, {any("x"),
//                                                            any("y")})})}),
//              [](Graph& g, const Match& m) -> std::optional<NodeId> {
//                Value x = g.value(m["x"]), y = g.value(m["y"]), w = g.value(m["w"]);
//                return (x + w * (y - x)).id();
//              }});
//   RewriteResult r = rewrite(graph, rules);   // r.graph, r.matched = {"lerp_spelling"}
//
// Matching rules:
//   * the operands of a commutative op (ops.def kCommutative) match in any order;
//   * a name binds the node it matched; a repeated name must bind the SAME node (nodes are
//     hash-consed, so "the same node" is "the same value");
//   * a callback returns std::nullopt to decline (the next rule for that op is tried), the matched
//     root itself to say "recognized, already in normal form" (recorded, nothing changes), or a
//     new node built in the graph it is given.
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "optfuse/graph.h"

namespace optfuse::rewrite {

using Bindings = std::map<std::string, NodeId>;

// A node predicate used by leaf patterns (e.g. "a per-element value").
using NodePredicate = std::function<bool(const Graph&, NodeId)>;

class Pattern {
 public:
  // Matches a node of `op` whose operands match `args` (in any order for commutative ops).
  Pattern(Op op, std::vector<Pattern> args, std::string bind = "");

  // Leaf patterns: match any node that satisfies `pred` (none: every node).
  static Pattern node(std::string bind, NodePredicate pred = nullptr);

  bool is_op() const { return is_op_; }
  Op op() const { return op_; }
  const std::vector<Pattern>& args() const { return args_; }
  const std::string& bind() const { return bind_; }
  const NodePredicate& predicate() const { return pred_; }

 private:
  Pattern() = default;
  bool is_op_ = false;
  Op op_ = Op::Const;
  std::vector<Pattern> args_;
  std::string bind_;
  NodePredicate pred_;
};

// Leaf pattern shorthands.
Pattern any(std::string bind = "");
Pattern tensor(std::string bind = "");   // a per-element value
Pattern uniform(std::string bind = "");  // a value the same for every element (scalar math)
Pattern constant(double v, std::string bind = "");  // a Const equal to v (signed zero distinct)
Pattern input(Role role, std::string bind = "");    // a tensor input of that role

struct Match {
  NodeId root = -1;
  Bindings bindings;
  NodeId operator[](const std::string& name) const;  // internal error if unbound
};

// Tries `p` at `id`; on success fills *b (earlier entries are kept and must agree).
bool match(const Graph& g, const Pattern& p, NodeId id, Bindings* b);

using Callback = std::function<std::optional<NodeId>(Graph&, const Match&)>;

struct Rule {
  std::string name;  // reported when the rule matches and does not decline
  Pattern pattern;   // its root must be an op pattern (the index)
  Callback rewrite;
};

class RuleSet {
 public:
  void add(Rule r);
  const std::vector<Rule>& for_op(Op op) const;  // in the order added
  size_t size() const;

 private:
  std::map<Op, std::vector<Rule>> by_op_;
};

struct RewriteResult {
  Graph graph;                       // rewritten; nodes no output or result reaches are dropped
  std::vector<std::string> matched;  // rule names that matched, in first-match order, once each
  int passes = 0;                    // passes over the graph, the last one changing nothing
  bool converged = true;             // false if max_passes ran out while rules still changed it
};

// Applies the rules bottom-up (operands before users) until a whole pass changes nothing or
// `max_passes` passes have run. Leaves are kept even when unused (they are the signature).
RewriteResult rewrite(const Graph& g, const RuleSet& rules, int max_passes = 16);

}  // namespace optfuse::rewrite
