#pragma once
// The update-graph IR.
//
// A Graph is an SSA DAG describing ONE element-wise update step:
//   * tensor inputs, each with a role (param, grad or a named piece of optimizer state),
//     read once per element;
//   * runtime scalars (hyperparameters and per-step host constants such as bias corrections):
//     their VALUES are kernel arguments, never compiled in;
//   * constants, element-wise ops (the list is include/optfuse/ops.def), and
//   * outputs, each bound to the tensor input it replaces (p' replaces p, m' replaces m):
//     kernels update in place;
//   * results: named uniform values returned to the caller as doubles (a squared norm, a max,
//     an overflow flag). A graph may have results and no outputs: a read-only statistics pass.
//
// Reductions (ops.def): reduce_* turn a per-element operand into one uniform value over the
// whole tensor; row_* view the tensor as [rows, cols] (row-major, cols the length of a row, a
// call argument: KernelCall::cols) and give each element its row's value; col_* cut the same
// view into batches of batch_rows consecutive rows (KernelCall::batch_rows: a matrix, its
// leading dims the batch) and give each element the value of its column in its batch
// (Adafactor's factored second moment: a row mean and a column mean of g^2 per matrix). A
// kernel computes every reduction as a prologue stage before the element-wise stage that uses
// it, so an update may depend on a norm of its own gradient and still be one kernel.
//
// Semantics: a value is a "tensor" if any operand is a tensor, else "uniform" (the same for every
// element). Binary ops need equal dtypes; a constant operand adopts the other side's dtype.
// Comparisons yield bool. Arithmetic follows IEEE-754 in the node's dtype; lowering may evaluate
// sqrt/rsqrt/div with documented bounded error (see src/lower/README.md).
//
// Nodes are immutable and hash-consed: building the same (op, dtype, operands, attributes) twice
// returns the same NodeId, so common subexpressions are shared from the start.
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "optfuse/dtype.h"

namespace optfuse {

enum OpFlags : unsigned {
  kLeaf = 1u << 0,
  kCommutative = 1u << 1,
  kCompare = 1u << 2,
  kUnary = 1u << 3,
  kBinary = 1u << 4,
  kReduce = 1u << 5,     // whole-tensor reduction: uniform result
  kRowReduce = 1u << 6,  // per-row reduction: per-element result (the row's value)
  kOpaque = 1u << 7,     // an external call: never fused
  kColReduce = 1u << 8,  // per-column reduction: per-element result (the column's value)
};

enum class Op : uint8_t {
#define OPTFUSE_OP(e, text, arity, flags) e,
#include "optfuse/ops.def"
#undef OPTFUSE_OP
};

std::string_view op_name(Op op);             // the textual name, e.g. "add"
bool parse_op(std::string_view s, Op* out);  // inverse of op_name
int op_arity(Op op);
unsigned op_flags(Op op);
inline bool op_has(Op op, unsigned flag) { return (op_flags(op) & flag) != 0; }

// RowState: optimizer state with one value per row of the per-row view (a block's scale,
// Adafactor's row_var, see row_state() below); ColState: one value per column of each batch
// (Adafactor's col_var, see col_state()); the others have one value per element.
enum class Role : uint8_t { Param, Grad, State, RowState, ColState };
std::string_view role_name(Role r);  // "param", "grad", "state", "row_state", "col_state"

using NodeId = int32_t;

struct Node {
  Op op;
  DType dtype;
  bool is_tensor;            // per-element value (else uniform across the tensor)
  std::vector<NodeId> args;  // operands, in order
  double value = 0;          // Const only
  std::string name;          // Input / Scalar: its name; Opaque: the external computation
  Role role = Role::Param;   // Input only
};

struct Output {
  std::string replaces;  // name of the tensor input this output overwrites
  NodeId value;
};

// A named uniform value returned to the caller (KernelCall::results), e.g. a squared norm.
struct Result {
  std::string name;
  NodeId value;
};

class Graph;

// A handle to a node while building. Arithmetic operators build ops in the owning graph.
class Value {
 public:
  Value() = default;
  Value(Graph* g, NodeId id) : graph_(g), id_(id) {}
  NodeId id() const { return id_; }
  Graph* graph() const { return graph_; }
  const Node& node() const;
  bool valid() const { return graph_ != nullptr; }

 private:
  Graph* graph_ = nullptr;
  NodeId id_ = -1;
};

// Names (the graph's, inputs', scalars', outputs', results' and opaque callees') are UTF-8 text
// without NUL; anything else is an Error naming the name and the offset of its bad byte
// (src/graph/names.h says why). Other control characters are allowed: both forms escape them.
class Graph {
 public:
  explicit Graph(std::string name = "graph");

  const std::string& name() const { return name_; }
  void set_name(std::string n);

  // Leaves. Input and scalar names are non-empty and unique across the graph (Error otherwise).
  Value param(const std::string& name, DType t = DType::F32) { return input(Role::Param, name, t); }
  Value grad(const std::string& name, DType t = DType::F32) { return input(Role::Grad, name, t); }
  Value state(const std::string& name, DType t = DType::F32) { return input(Role::State, name, t); }
  // State with one value per row (the graph is then per-row, see the top of this file): read,
  // every element of a row sees its row's value; an output replacing it must be the same for
  // every element of a row (built from row reductions, other row state and uniforms only).
  Value row_state(const std::string& name, DType t = DType::F32) {
    return input(Role::RowState, name, t);
  }
  // State with one value per column of each batch (see the top of this file), batch after
  // batch: read, every element of a batch's column sees that value; an output replacing it must
  // be the same for every element of a batch's column (built from column reductions, other
  // column state and uniforms only).
  Value col_state(const std::string& name, DType t = DType::F32) {
    return input(Role::ColState, name, t);
  }
  Value input(Role role, const std::string& name, DType t);
  Value scalar(const std::string& name, DType t = DType::F32);
  Value constant(double v, DType t = DType::F32);

  // Generic op builder: checks arity and dtypes; the result dtype is derived, except for Cast
  // where `cast_to` names it. Throws Error naming the op and the offending operand.
  Value make(Op op, const std::vector<Value>& args, DType cast_to = DType::F32);

  // Declares that `v` replaces tensor input `replaces` after the step.
  void output(const std::string& replaces, Value v);

  // Declares that uniform value `v` is returned to the caller under `name` (unique among the
  // results). Error if `v` is per-element: reduce it first (reduce_sum, reduce_max, ...).
  void result(const std::string& name, Value v);

  const std::vector<Node>& nodes() const { return nodes_; }
  const Node& node(NodeId id) const { return nodes_.at(static_cast<size_t>(id)); }
  const std::vector<Output>& outputs() const { return outputs_; }
  const std::vector<Result>& results() const { return results_; }
  Value value(NodeId id) { return Value(this, id); }

  // Labels `v` for the passes that build on this graph (the optimizer's gradient centralization
  // finds a rule's effective gradient by its label). A label is no part of the graph's structure:
  // printing, hashing, canonicalizing, JSON and the passes drop it. Relabelling moves the label.
  void label(const std::string& name, Value v);
  NodeId find_label(const std::string& name) const;  // -1 if absent

  // Looks up a leaf by name; -1 if absent.
  NodeId find_input(const std::string& name) const;
  NodeId find_scalar(const std::string& name) const;

  // Adds a fully described node with the same structural and type checks as the builders,
  // returning the existing id for an identical node; used by the parser and passes.
  NodeId add_node(Node n);

 private:
  std::string name_;
  std::vector<Node> nodes_;
  std::vector<Output> outputs_;
  std::vector<Result> results_;
  std::unordered_map<std::string, NodeId> labels_;
  std::unordered_map<std::string, NodeId> intern_;  // structural key -> id (hash-consing)
};

// Builders on Values (all check that operands belong to the same graph).
Value operator+(Value a, Value b);
Value operator-(Value a, Value b);
Value operator*(Value a, Value b);
Value operator/(Value a, Value b);
Value operator-(Value a);
Value operator+(Value a, double b);
Value operator+(double a, Value b);
Value operator-(Value a, double b);
Value operator-(double a, Value b);
Value operator*(Value a, double b);
Value operator*(double a, Value b);
Value operator/(Value a, double b);
Value operator/(double a, Value b);
Value operator<(Value a, Value b);
Value operator<=(Value a, Value b);
Value operator>(Value a, Value b);
Value operator>=(Value a, Value b);
Value min(Value a, Value b);
Value max(Value a, Value b);
Value pow(Value a, Value b);
Value abs(Value a);
Value sign(Value a);
Value sqrt(Value a);
Value rsqrt(Value a);
Value exp(Value a);
Value log(Value a);
Value select(Value cond, Value if_true, Value if_false);
Value cast(Value a, DType to);
// `a` itself, computed without fusion into its users' multiply-adds (ops.def).
Value strict(Value a);
// Stochastic rounding of an f32 tensor to bf16 (ops.def): rounds |x| up with probability equal
// to the fraction of a bf16 ulp it lies above the value below, so E[round_sr(x)] = x; NaN stays
// NaN. `key` is a uniform f64 integer in [0, 2^32) (e.g. a hash of seed and step): same key, same
// bits. The element index is the position within the kernel call.
Value round_sr(Value x, Value key);
Value is_finite(Value a);  // bool: neither inf nor NaN
// An opaque op named `callee` applied to `a` (see ops.def): kernels never contain it.
Value opaque(const std::string& callee, Value a);

// Reductions (operand: a per-element value of a float dtype; see the top of this file).
Value reduce_sum(Value a);
Value reduce_mean(Value a);
Value reduce_max(Value a);
Value reduce_min(Value a);
Value row_sum(Value a);
Value row_mean(Value a);
Value row_max(Value a);
Value row_min(Value a);
Value col_sum(Value a);
Value col_mean(Value a);
Value col_max(Value a);
Value col_min(Value a);
// Common statistics, built from the above: sum of squares, max |a|, and 1 if any element of `a`
// is inf or NaN else 0 (all of a's dtype, uniform).
Value sum_squares(Value a);
Value max_abs(Value a);
Value any_nonfinite(Value a);

// Whether `g` uses per-row reductions or row state (its kernels then take KernelCall::cols) /
// column reductions or column state (its kernels then take cols and batch_rows: the factored
// view) / any reduction.
bool uses_rows(const Graph& g);
bool uses_cols(const Graph& g);
bool has_reductions(const Graph& g);
// Why node `id` differs within a row: the per-element input (or round_sr) it depends on other
// than through a row reduction; null if it is the same for every element of a row.
const Node* per_element(const Graph& g, NodeId id);
// The same within a batch's column: the input (or round_sr) it depends on other than through a
// column reduction or column state; null if it is the same for every element of a column.
const Node* per_element_in_column(const Graph& g, NodeId id);

// ---- Textual form -------------------------------------------------------------------------
// print() writes a graph as text; parse() reads it back (parse(print(g)) is structurally g).
//   graph "sgd" {
//     %0 = param.f32 "p"
//     %1 = grad.f32 "g"
//     %2 = scalar.f32 "lr"
//     %3 = mul.f32 %1, %2
//     %4 = sub.f32 %0, %3
//     out "p" = %4
//   }
// Results are written `result "sumsq" = %7`.
// Constants print as `const.f32 0.5` with enough digits to round-trip exactly.
std::string print(const Graph& g);
Graph parse(std::string_view text);  // throws Error with line number on bad input

// ---- JSON form ------------------------------------------------------------------------------
// The same graph as JSON (format and an example: docs/graph-json.md). Ops are named as in
// ops.def; inputs, scalars and nodes have named ids; outputs map the replaced input to a node id.
//   {"name": "sgd",
//    "inputs": [{"name": "p", "role": "param"}, {"name": "g", "role": "grad"}],
//    "scalars": ["lr"],
//    "nodes": [{"id": "step", "op": "mul", "args": ["lr", "g"]},
//              {"id": "p1", "op": "sub", "args": ["p", "step"]}],
//    "outputs": {"p": "p1"}}
// parse_json throws Error naming the JSON path of the bad value ("graph JSON /nodes/1/args/0:
// \"q\" is not defined ..."); parse_json(print_json(g)) is structurally g.
Graph parse_json(std::string_view text);
std::string print_json(const Graph& g);

// ---- Canonical form and structural hash ----------------------------------------------------
// canonicalize(): folds constants, applies exact identities (x*1, x-0, --x) and the exact rewrite
// rules (x + -y -> x - y, x - -y -> x + y, -x * -y -> x * y, -x / -y -> x / y), eliminates common
// subexpressions and dead nodes, orders commutative operands canonically, and numbers nodes in a
// canonical order (inputs by role then name, scalars by name, then operations depth-first from
// the outputs sorted by name, then from the results sorted by name). Two graphs describing the
// same update — built in any order, with
// operands of commutative ops either way round — canonicalize to identical text.
Graph canonicalize(const Graph& g);

struct Hash128 {
  uint64_t hi = 0, lo = 0;
  std::string hex() const;  // 32 lowercase hex digits
  bool operator==(const Hash128& o) const { return hi == o.hi && lo == o.lo; }
  bool operator!=(const Hash128& o) const { return !(*this == o); }
};
Hash128 xxh3_128(std::string_view bytes);

// XXH3-128 of the canonical text, without the graph's name: stable across processes, runs,
// machines and construction order.
Hash128 structural_hash(const Graph& g);

// Evaluates the graph element-wise in double precision (a plain interpreter, the reference for
// tests): `tensors` maps input names to per-element values, `scalars` maps scalar names to values.
// Returns each output's values keyed by the name it replaces. `cols`: the row length for per-row
// and per-column graphs (the element count must be a multiple of it); row state is given and
// returned as one value per row. `batch_rows`: the rows of one batch for per-column graphs (0:
// one batch of every row; the row count must be a multiple of it); column state is given and
// returned as one value per column of each batch, batch after batch.
std::map<std::string, std::vector<double>> interpret(
    const Graph& g, const std::map<std::string, std::vector<double>>& tensors,
    const std::map<std::string, double>& scalars, int64_t cols = 0, int64_t batch_rows = 0);

// The same evaluation, returning the graph's results by name.
std::map<std::string, double> interpret_results(
    const Graph& g, const std::map<std::string, std::vector<double>>& tensors,
    const std::map<std::string, double>& scalars, int64_t cols = 0, int64_t batch_rows = 0);

}  // namespace optfuse
