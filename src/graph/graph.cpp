// Graph building: leaves, checked op construction, hash-consing, outputs and the Value operators.
#include "optfuse/graph.h"

#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "graph/eval.h"
#include "graph/names.h"
#include "optfuse/error.h"

namespace optfuse {
namespace {

// Names are checked (check_name) before any message shows them, so quoting is enough.
std::string quoted(const std::string& s) { return "\"" + s + "\""; }

std::string op_str(Op op) { return std::string(op_name(op)); }
std::string dt_str(DType t) { return std::string(dtype_name(t)); }

// The hash-consing key: every field that distinguishes two nodes (is_tensor is derived).
std::string intern_key(const Node& n) {
  std::string key;
  key += static_cast<char>(n.op);
  key += static_cast<char>(n.dtype);
  key += static_cast<char>(n.role);
  uint64_t bits;
  std::memcpy(&bits, &n.value, sizeof bits);  // bits, not ==: 0.0 and -0.0 are different constants
  key.append(reinterpret_cast<const char*>(&bits), sizeof bits);
  for (NodeId a : n.args) key.append(reinterpret_cast<const char*>(&a), sizeof a);
  key += n.name;  // last, so it cannot run into another field
  return key;
}

// Clears the fields an op does not use and rounds constants to their dtype, so that equal nodes
// have equal keys and a Const holds exactly the value the kernel will use.
void normalize(Node& n) {
  if (n.op == Op::Const)
    n.value = graph_detail::round_to_dtype(n.value, n.dtype);
  else
    n.value = 0;
  if (n.op != Op::Input && n.op != Op::Scalar && n.op != Op::Opaque) n.name.clear();
  if (n.op != Op::Input) n.role = Role::Param;
}

// The dtype rules of graph.h, stated once and checked for every node however it is built.
void check_types(const Graph& g, const Node& n) {
  auto operand = [&](size_t i) { return g.node(n.args[i]).dtype; };
  auto fail = [&](const std::string& what) { throw Error(op_str(n.op) + ": " + what); };
  auto require_same = [&](size_t i, size_t j) {
    if (operand(i) != operand(j))
      fail("operand " + std::to_string(j + 1) + " has dtype " + dt_str(operand(j)) +
           " but operand " + std::to_string(i + 1) + " has " + dt_str(operand(i)));
  };
  auto require_result = [&](DType want) {
    if (n.dtype != want) fail("result dtype " + dt_str(n.dtype) + " should be " + dt_str(want));
  };
  if (n.op == Op::Cast || op_has(n.op, kLeaf)) return;
  if (n.op == Op::RoundSR) {
    if (operand(0) != DType::F32)
      fail("operand 1 has dtype " + dt_str(operand(0)) + "; expected f32 (rounded to bf16)");
    if (operand(1) != DType::F64 || g.node(n.args[1]).is_tensor)
      fail("operand 2 (the key) must be a uniform f64 holding an integer, got a " +
           std::string(g.node(n.args[1]).is_tensor ? "tensor " : "uniform ") + dt_str(operand(1)));
    return require_result(DType::BF16);
  }
  if (n.op == Op::Opaque) return require_result(operand(0));
  if (n.op == Op::Select) {
    if (operand(0) != DType::Bool)
      fail("operand 1 (the condition) has dtype " + dt_str(operand(0)) + "; expected bool");
    require_same(1, 2);
    return require_result(operand(1));
  }
  if (op_has(n.op, kBinary)) require_same(0, 1);
  if (n.op == Op::IsFinite && !is_float(operand(0)))
    fail("operand 1 has dtype " + dt_str(operand(0)) + "; is_finite needs a float dtype");
  if (op_has(n.op, kCompare)) return require_result(DType::Bool);
  if (!is_float(operand(0)))
    fail("operand 1 has dtype " + dt_str(operand(0)) + "; " + op_str(n.op) +
         " needs a float dtype");
  require_result(operand(0));
}

void check_structure(const Graph& g, const Node& n) {
  const std::string op = op_str(n.op);
  if (n.args.size() != static_cast<size_t>(op_arity(n.op)))
    throw Error(op + ": expects " + std::to_string(op_arity(n.op)) + " operands, got " +
                std::to_string(n.args.size()));
  for (size_t i = 0; i < n.args.size(); ++i) {
    if (n.args[i] < 0 || static_cast<size_t>(n.args[i]) >= g.nodes().size())
      throw Error(op + ": operand " + std::to_string(i + 1) + " refers to %" +
                  std::to_string(n.args[i]) + ", which does not exist");
  }
  if (n.op == Op::Opaque) {
    if (n.name.empty())
      throw Error("opaque: the name of the external computation must not be empty");
    check_name(n.name, "opaque name");
  }
  if (op_has(n.op, kReduce | kRowReduce | kColReduce) && !g.node(n.args[0]).is_tensor)
    throw Error(op + ": operand 1 (%" + std::to_string(n.args[0]) +
                ") is uniform, the same for every element; only per-element values are reduced");
  if (n.op == Op::Input || n.op == Op::Scalar) {
    const std::string leaf = n.op == Op::Input ? std::string(role_name(n.role)) : op;
    if (n.name.empty()) throw Error(leaf + ": the name must not be empty");
    check_name(n.name, leaf + " name");
    if (g.find_input(n.name) >= 0 || g.find_scalar(n.name) >= 0)
      throw Error(leaf + ": the name " + quoted(n.name) + " is already declared");
  }
}

// Binary ops and select's branches: a constant adopts the other side's dtype (`v * 0.5`).
// Copies the nodes first: adding a constant may reallocate the node vector.
void adopt_constant_dtypes(Graph& g, NodeId& a, NodeId& b) {
  const Node na = g.node(a), nb = g.node(b);
  if (na.dtype == nb.dtype) return;
  if (nb.op == Op::Const)
    b = g.constant(nb.value, na.dtype).id();
  else if (na.op == Op::Const)
    a = g.constant(na.value, nb.dtype).id();
}

DType result_dtype(const Graph& g, Op op, const std::vector<NodeId>& args, DType cast_to) {
  if (op == Op::Cast) return cast_to;
  if (op == Op::RoundSR) return DType::BF16;
  if (op_has(op, kCompare)) return DType::Bool;
  if (op == Op::Select) return g.node(args[1]).dtype;
  return g.node(args[0]).dtype;
}

// The graph the operands are built in; make() then checks that every operand belongs to it.
Graph* owner(Op op, std::initializer_list<Value> operands) {
  for (Value v : operands)
    if (v.valid()) return v.graph();
  throw Error(op_str(op) + ": operand 1 is not a built value");
}

Value build(Op op, std::initializer_list<Value> operands, DType cast_to = DType::F32) {
  return owner(op, operands)->make(op, operands, cast_to);
}
Value with_constant(Op op, Value a, double b) {
  return build(op, {a, owner(op, {a})->constant(b, a.node().dtype)});
}
Value with_constant(Op op, double a, Value b) {
  if (!b.valid()) throw Error(op_str(op) + ": operand 2 is not a built value");
  return build(op, {b.graph()->constant(a, b.node().dtype), b});
}

}  // namespace

Graph::Graph(std::string name) { set_name(std::move(name)); }

void Graph::label(const std::string& name, Value v) {
  if (v.graph() != this) throw Error("label '" + name + "': the value belongs to another graph");
  labels_[name] = v.id();
}

NodeId Graph::find_label(const std::string& name) const {
  auto it = labels_.find(name);
  return it == labels_.end() ? -1 : it->second;
}

void Graph::set_name(std::string n) {
  check_name(n, "graph name");
  name_ = std::move(n);
}

const Node& Value::node() const {
  if (!graph_) throw Error("Value::node: the value is not a built value");
  return graph_->node(id_);
}

NodeId Graph::add_node(Node n) {
  normalize(n);
  check_structure(*this, n);
  check_types(*this, n);
  std::string key = intern_key(n);
  if (auto it = intern_.find(key); it != intern_.end()) return it->second;
  n.is_tensor = n.op == Op::Input || n.op == Op::RoundSR;  // round_sr depends on the index
  for (NodeId a : n.args) n.is_tensor = n.is_tensor || node(a).is_tensor;
  if (op_has(n.op, kReduce)) n.is_tensor = false;  // one value for the whole tensor
  auto id = static_cast<NodeId>(nodes_.size());
  nodes_.push_back(std::move(n));
  intern_.emplace(std::move(key), id);
  return id;
}

Value Graph::input(Role role, const std::string& name, DType t) {
  Node n{Op::Input, t, true, {}, 0, name, role};
  return Value(this, add_node(std::move(n)));
}

Value Graph::scalar(const std::string& name, DType t) {
  Node n{Op::Scalar, t, false, {}, 0, name, Role::Param};
  return Value(this, add_node(std::move(n)));
}

Value Graph::constant(double v, DType t) {
  Node n{Op::Const, t, false, {}, v, "", Role::Param};
  return Value(this, add_node(std::move(n)));
}

Value Graph::make(Op op, const std::vector<Value>& args, DType cast_to) {
  const std::string name = op_str(op);
  if (op_has(op, kLeaf)) throw Error("make: " + name + " is a leaf; use input, scalar or constant");
  if (args.size() != static_cast<size_t>(op_arity(op)))
    throw Error(name + ": expects " + std::to_string(op_arity(op)) + " operands, got " +
                std::to_string(args.size()));
  std::vector<NodeId> ids;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string operand = name + ": operand " + std::to_string(i + 1);
    if (!args[i].valid()) throw Error(operand + " is not a built value");
    if (args[i].graph() != this) throw Error(operand + " belongs to another graph");
    if (args[i].id() < 0 || static_cast<size_t>(args[i].id()) >= nodes_.size())
      throw Error(operand + " refers to %" + std::to_string(args[i].id()) +
                  ", which does not exist");
    ids.push_back(args[i].id());
  }
  if (op_has(op, kBinary)) adopt_constant_dtypes(*this, ids[0], ids[1]);
  if (op == Op::Select) adopt_constant_dtypes(*this, ids[1], ids[2]);
  DType dtype = result_dtype(*this, op, ids, cast_to);
  Node n{op, dtype, false, std::move(ids), 0, "", Role::Param};
  return Value(this, add_node(std::move(n)));
}

void Graph::output(const std::string& replaces, Value v) {
  check_name(replaces, "output name");
  const std::string what = "output " + quoted(replaces) + ": ";
  if (v.graph() != this)
    throw Error(what + (v.valid() ? "the value belongs to another graph" : "not a built value"));
  if (v.id() < 0 || static_cast<size_t>(v.id()) >= nodes_.size())
    throw Error(what + "%" + std::to_string(v.id()) + " does not exist");
  NodeId target = find_input(replaces);
  if (target < 0)
    throw Error(what + (find_scalar(replaces) >= 0 ? "it is a scalar, not a tensor input"
                                                   : "no tensor input has that name"));
  DType want = node(target).dtype, got = v.node().dtype;
  if (want != got)
    throw Error(what + "the value has dtype " + dt_str(got) + " but the input has " + dt_str(want));
  for (const Output& o : outputs_)
    if (o.replaces == replaces) throw Error(what + "the input is already replaced");
  auto through = [](const Node* why) {
    return why->op == Op::Input ? std::string(role_name(why->role)) + " " + quoted(why->name)
                                : std::string(op_name(why->op));
  };
  if (const Node* why = node(target).role == Role::RowState ? per_element(*this, v.id()) : nullptr)
    throw Error(what + "the input is row state, and the value differs within a row (through " +
                through(why) +
                "); build it from row reductions (row_max, ...), other row state and uniforms");
  if (const Node* why =
          node(target).role == Role::ColState ? per_element_in_column(*this, v.id()) : nullptr)
    throw Error(what + "the input is column state, and the value differs within a column " +
                "(through " + through(why) +
                "); build it from column reductions (col_mean, ...), other column state and " +
                "uniforms");
  outputs_.push_back({replaces, v.id()});
}

void Graph::result(const std::string& name, Value v) {
  check_name(name, "result name");
  const std::string what = "result " + quoted(name) + ": ";
  if (v.graph() != this)
    throw Error(what + (v.valid() ? "the value belongs to another graph" : "not a built value"));
  if (v.id() < 0 || static_cast<size_t>(v.id()) >= nodes_.size())
    throw Error(what + "%" + std::to_string(v.id()) + " does not exist");
  if (name.empty()) throw Error(what + "the name must not be empty");
  if (v.node().is_tensor)
    throw Error(what + "the value is per-element; reduce it first (reduce_sum, reduce_max, ...)");
  for (const Result& r : results_)
    if (r.name == name) throw Error(what + "a result with that name is already declared");
  results_.push_back({name, v.id()});
}

bool uses_rows(const Graph& g) {
  for (const Node& n : g.nodes())
    if (op_has(n.op, kRowReduce) || (n.op == Op::Input && n.role == Role::RowState)) return true;
  return false;
}

bool uses_cols(const Graph& g) {
  for (const Node& n : g.nodes())
    if (op_has(n.op, kColReduce) || (n.op == Op::Input && n.role == Role::ColState)) return true;
  return false;
}

namespace {

// Why node `id` differs within a row (`reduce` kRowReduce, `state` RowState) or within a batch's
// column (kColReduce, ColState): the first input or round_sr it depends on other than through
// such a reduction or state. A reduction of the other kind inherits its operand's answer (a
// column mean of a row-level value is the same for the whole batch).
const Node* varies_within(const Graph& g, NodeId id, unsigned reduce, Role state) {
  // Operands precede their users (nodes are built bottom-up), so one forward pass decides all.
  std::vector<const Node*> why(static_cast<size_t>(id) + 1, nullptr);
  for (NodeId i = 0; i <= id; ++i) {
    const Node& n = g.node(i);
    if (!n.is_tensor || op_has(n.op, reduce)) continue;
    if (n.op == Op::Input || n.op == Op::RoundSR) {
      why[i] = n.op == Op::Input && n.role == state ? nullptr : &n;
      continue;
    }
    for (NodeId a : n.args)
      if (!why[i]) why[i] = why[a];
  }
  return why[id];
}

}  // namespace

const Node* per_element(const Graph& g, NodeId id) {
  return varies_within(g, id, kRowReduce, Role::RowState);
}

const Node* per_element_in_column(const Graph& g, NodeId id) {
  return varies_within(g, id, kColReduce, Role::ColState);
}

bool has_reductions(const Graph& g) {
  for (const Node& n : g.nodes())
    if (op_has(n.op, kReduce | kRowReduce | kColReduce)) return true;
  return false;
}

NodeId Graph::find_input(const std::string& name) const {
  for (size_t i = 0; i < nodes_.size(); ++i)
    if (nodes_[i].op == Op::Input && nodes_[i].name == name) return static_cast<NodeId>(i);
  return -1;
}

NodeId Graph::find_scalar(const std::string& name) const {
  for (size_t i = 0; i < nodes_.size(); ++i)
    if (nodes_[i].op == Op::Scalar && nodes_[i].name == name) return static_cast<NodeId>(i);
  return -1;
}

Value operator+(Value a, Value b) { return build(Op::Add, {a, b}); }
Value operator-(Value a, Value b) { return build(Op::Sub, {a, b}); }
Value operator*(Value a, Value b) { return build(Op::Mul, {a, b}); }
Value operator/(Value a, Value b) { return build(Op::Div, {a, b}); }
Value operator-(Value a) { return build(Op::Neg, {a}); }
Value operator+(Value a, double b) { return with_constant(Op::Add, a, b); }
Value operator+(double a, Value b) { return with_constant(Op::Add, a, b); }
Value operator-(Value a, double b) { return with_constant(Op::Sub, a, b); }
Value operator-(double a, Value b) { return with_constant(Op::Sub, a, b); }
Value operator*(Value a, double b) { return with_constant(Op::Mul, a, b); }
Value operator*(double a, Value b) { return with_constant(Op::Mul, a, b); }
Value operator/(Value a, double b) { return with_constant(Op::Div, a, b); }
Value operator/(double a, Value b) { return with_constant(Op::Div, a, b); }
Value operator<(Value a, Value b) { return build(Op::Lt, {a, b}); }
Value operator<=(Value a, Value b) { return build(Op::Le, {a, b}); }
Value operator>(Value a, Value b) { return build(Op::Gt, {a, b}); }
Value operator>=(Value a, Value b) { return build(Op::Ge, {a, b}); }
Value min(Value a, Value b) { return build(Op::Min, {a, b}); }
Value max(Value a, Value b) { return build(Op::Max, {a, b}); }
Value pow(Value a, Value b) { return build(Op::Pow, {a, b}); }
Value abs(Value a) { return build(Op::Abs, {a}); }
Value sign(Value a) { return build(Op::Sign, {a}); }
Value sqrt(Value a) { return build(Op::Sqrt, {a}); }
Value rsqrt(Value a) { return build(Op::Rsqrt, {a}); }
Value exp(Value a) { return build(Op::Exp, {a}); }
Value log(Value a) { return build(Op::Log, {a}); }

Value select(Value cond, Value if_true, Value if_false) {
  return build(Op::Select, {cond, if_true, if_false});
}
Value cast(Value a, DType to) { return build(Op::Cast, {a}, to); }
Value round_sr(Value x, Value key) { return build(Op::RoundSR, {x, key}); }
Value is_finite(Value a) { return build(Op::IsFinite, {a}); }
Value strict(Value a) { return build(Op::Strict, {a}); }

Value opaque(const std::string& callee, Value a) {
  if (!a.valid()) throw Error("opaque: operand 1 is not a built value");
  Node n{Op::Opaque, a.node().dtype, false, {a.id()}, 0, callee, Role::Param};
  return Value(a.graph(), a.graph()->add_node(std::move(n)));
}

Value reduce_sum(Value a) { return build(Op::ReduceSum, {a}); }
Value reduce_mean(Value a) { return build(Op::ReduceMean, {a}); }
Value reduce_max(Value a) { return build(Op::ReduceMax, {a}); }
Value reduce_min(Value a) { return build(Op::ReduceMin, {a}); }
Value row_sum(Value a) { return build(Op::RowSum, {a}); }
Value row_mean(Value a) { return build(Op::RowMean, {a}); }
Value row_max(Value a) { return build(Op::RowMax, {a}); }
Value row_min(Value a) { return build(Op::RowMin, {a}); }
Value col_sum(Value a) { return build(Op::ColSum, {a}); }
Value col_mean(Value a) { return build(Op::ColMean, {a}); }
Value col_max(Value a) { return build(Op::ColMax, {a}); }
Value col_min(Value a) { return build(Op::ColMin, {a}); }

Value sum_squares(Value a) { return reduce_sum(a * a); }
Value max_abs(Value a) { return reduce_max(abs(a)); }
Value any_nonfinite(Value a) {
  if (!a.valid()) throw Error("any_nonfinite: operand 1 is not a built value");
  Graph* g = a.graph();
  DType t = a.node().dtype;
  // max(.., 0): an empty tensor has no non-finite element (its reduce_max is -inf).
  Value zero = g->constant(0, t);
  return max(reduce_max(select(is_finite(a), zero, g->constant(1, t))), zero);
}

}  // namespace optfuse
