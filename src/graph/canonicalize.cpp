// canonicalize(): simplify (fold, exact identities, ordered commutative operands, CSE), then
// renumber in an order that depends only on the graph's structure, never on how it was built.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <tuple>
#include <utility>

#include "graph/eval.h"
#include "optfuse/graph.h"

namespace optfuse {
namespace {

// Appends little-endian integers and length-prefixed strings, so hashes agree across machines.
class ByteWriter {
 public:
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) bytes_ += static_cast<char>((v >> (8 * i)) & 0xff);
  }
  void str(std::string_view s) {
    u64(s.size());
    bytes_.append(s);
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

bool operator<(const Hash128& a, const Hash128& b) {
  return std::tie(a.hi, a.lo) < std::tie(b.hi, b.lo);
}

// Copies a graph node by node (operands before users), simplifying each node as it is copied.
// Hash-consing in the copy performs CSE; structural hashes of every copied node's subgraph order
// the operands of commutative ops.
class Simplifier {
 public:
  explicit Simplifier(const Graph& in) : out_(in.name()) {
    std::vector<NodeId> to_out;
    for (const Node& old : in.nodes()) {
      Node n = old;
      for (NodeId& a : n.args) a = to_out[a];
      to_out.push_back(simplify(std::move(n)));
    }
    for (const Output& o : in.outputs()) out_.output(o.replaces, out_.value(to_out[o.value]));
    for (const Result& r : in.results()) out_.result(r.name, out_.value(to_out[r.value]));
  }

  const Graph& graph() const { return out_; }

 private:
  NodeId simplify(Node n) {
    if (op_has(n.op, kLeaf)) return add(std::move(n));
    if (all_constant(n)) return fold(n);
    if (std::optional<NodeId> same = identity(n)) return *same;
    if (op_has(n.op, kCommutative) && hashes_[n.args[1]] < hashes_[n.args[0]])
      std::swap(n.args[0], n.args[1]);
    return add(std::move(n));
  }

  bool all_constant(const Node& n) const {
    return std::all_of(n.args.begin(), n.args.end(),
                       [&](NodeId a) { return out_.node(a).op == Op::Const; });
  }

  // Evaluated in double, then rounded once to the node's dtype (add_node rounds constants).
  // The kernel would compute in the node's dtype, so a folded f32 value can differ from the
  // unfolded kernel's in the last bit; it is the exactly rounded result, which is the better one.
  NodeId fold(const Node& n) {
    double args[3];
    for (size_t i = 0; i < n.args.size(); ++i) args[i] = out_.node(n.args[i]).value;
    double v = graph_detail::eval_op(n.op, n.dtype, args);
    return add(Node{Op::Const, n.dtype, false, {}, v, "", Role::Param});
  }

  bool is_constant(NodeId id, double v) const {
    const Node& n = out_.node(id);
    return n.op == Op::Const && n.value == v && std::signbit(n.value) == std::signbit(v);
  }

  // Rewrites that hold bit for bit for every input, NaN and signed zero included. x + 0 is not
  // one of them: -0 + 0 is +0.
  std::optional<NodeId> identity(const Node& n) const {
    const std::vector<NodeId>& a = n.args;
    switch (n.op) {
      case Op::Mul:
        if (is_constant(a[1], 1)) return a[0];
        if (is_constant(a[0], 1)) return a[1];
        break;
      case Op::Div:
        if (is_constant(a[1], 1)) return a[0];
        break;
      case Op::Sub:
        if (is_constant(a[1], 0.0)) return a[0];
        break;
      case Op::Neg:
        if (out_.node(a[0]).op == Op::Neg) return out_.node(a[0]).args[0];
        break;
      case Op::Cast:
        if (out_.node(a[0]).dtype == n.dtype) return a[0];
        break;
      case Op::Select:
        if (out_.node(a[0]).op == Op::Const) return out_.node(a[0]).value != 0 ? a[1] : a[2];
        break;
      default:
        break;
    }
    return std::nullopt;
  }

  NodeId add(Node n) {
    NodeId id = out_.add_node(std::move(n));
    if (static_cast<size_t>(id) == hashes_.size()) hashes_.push_back(subgraph_hash(out_.node(id)));
    return id;
  }

  // Op, dtype and attributes by name (not enum value, so reordering ops.def changes nothing),
  // then the operands' subgraph hashes in order.
  Hash128 subgraph_hash(const Node& n) const {
    ByteWriter w;
    w.str(op_name(n.op));
    w.str(dtype_name(n.dtype));
    w.str(n.op == Op::Input ? role_name(n.role) : "");
    w.str(n.name);
    uint64_t bits;
    std::memcpy(&bits, &n.value, sizeof bits);
    w.u64(bits);
    for (NodeId a : n.args) {
      w.u64(hashes_[a].hi);
      w.u64(hashes_[a].lo);
    }
    return xxh3_128(w.bytes());
  }

  Graph out_;
  std::vector<Hash128> hashes_;  // by node id of out_
};

// Calls emit(id) for every node reachable from root, operands first, each once (marked in done).
template <typename Emit>
void post_order(const Graph& g, NodeId root, std::vector<bool>& done, Emit&& emit) {
  std::vector<std::pair<NodeId, size_t>> stack{{root, 0}};  // node, next operand to visit
  while (!stack.empty()) {
    auto [id, next] = stack.back();
    const Node& n = g.node(id);
    if (done[id]) {
      stack.pop_back();
    } else if (next < n.args.size()) {
      ++stack.back().second;
      stack.push_back({n.args[next], 0});
    } else {
      done[id] = true;
      emit(id);
      stack.pop_back();
    }
  }
}

template <typename Key>
std::vector<NodeId> leaves_sorted(const Graph& g, Op op, Key key) {
  std::vector<NodeId> ids;
  for (size_t i = 0; i < g.nodes().size(); ++i)
    if (g.nodes()[i].op == op) ids.push_back(static_cast<NodeId>(i));
  std::sort(ids.begin(), ids.end(), [&](NodeId a, NodeId b) { return key(a) < key(b); });
  return ids;
}

// Copies `g` in canonical order: inputs by (role, name), scalars by name (both kept even when
// unused: they are the kernel's signature), then operations in post-order from the outputs sorted
// by the name they replace, then from the results sorted by name. Nodes no output or result
// reaches are dropped.
Graph renumber(const Graph& g) {
  Graph out(g.name());
  std::vector<NodeId> to_out(g.nodes().size(), -1);
  std::vector<bool> done(g.nodes().size(), false);
  auto copy = [&](NodeId id) {
    Node n = g.node(id);
    for (NodeId& a : n.args) a = to_out[a];
    to_out[id] = out.add_node(std::move(n));
  };
  auto copy_leaf = [&](NodeId id) {
    copy(id);
    done[id] = true;
  };
  auto input_key = [&](NodeId id) { return std::tie(g.node(id).role, g.node(id).name); };
  auto scalar_key = [&](NodeId id) { return std::tie(g.node(id).name); };
  for (NodeId id : leaves_sorted(g, Op::Input, input_key)) copy_leaf(id);
  for (NodeId id : leaves_sorted(g, Op::Scalar, scalar_key)) copy_leaf(id);

  std::vector<Output> outputs = g.outputs();
  std::sort(outputs.begin(), outputs.end(),
            [](const Output& a, const Output& b) { return a.replaces < b.replaces; });
  for (const Output& o : outputs) {
    post_order(g, o.value, done, copy);
    out.output(o.replaces, out.value(to_out[o.value]));
  }
  std::vector<Result> results = g.results();
  std::sort(results.begin(), results.end(),
            [](const Result& a, const Result& b) { return a.name < b.name; });
  for (const Result& r : results) {
    post_order(g, r.value, done, copy);
    out.result(r.name, out.value(to_out[r.value]));
  }
  return out;
}

}  // namespace

Graph canonicalize(const Graph& g) { return renumber(Simplifier(g).graph()); }

}  // namespace optfuse
