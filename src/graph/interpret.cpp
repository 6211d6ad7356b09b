// The reference interpreter: every node evaluated element-wise in double (see eval.h); only
// leaves (as stored) and casts are rounded to a narrower dtype.
#include <algorithm>
#include <string>

#include "graph/eval.h"
#include "optfuse/error.h"
#include "optfuse/graph.h"

namespace optfuse {
namespace {

using Values = std::vector<double>;  // one per element, or a single one for a uniform node

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

// Every name passed in must be declared (a misspelt name would otherwise be silently unused).
template <typename Map>
void check_declared(const Graph& g, const Map& given, Op op, const char* kind) {
  for (const auto& entry : given) {
    NodeId id = op == Op::Input ? g.find_input(entry.first) : g.find_scalar(entry.first);
    if (id < 0)
      throw Error("interpret: the graph has no " + std::string(kind) + " " + quoted(entry.first));
  }
}

bool is_row_state(const Node& n) { return n.op == Op::Input && n.role == Role::RowState; }
bool is_col_state(const Node& n) { return n.op == Op::Input && n.role == Role::ColState; }

// The [rows, cols] view of per-row and per-column graphs, cut into batches of batch_rows rows.
struct View {
  size_t n = 0, cols = 0, batch_rows = 0;
  size_t rows() const { return n / cols; }
  size_t batches() const { return batch_rows ? rows() / batch_rows : 0; }
  // Element i's row, and its column's index among the column values (batch-major).
  size_t row_of(size_t i) const { return i / cols; }
  size_t col_of(size_t i) const { return row_of(i) / batch_rows * cols + i % cols; }
};

// The view for element count `n`; Error naming `what` if cols (or batch_rows) does not fit it.
View view_of(size_t n, int64_t cols, int64_t batch_rows, bool columns, const std::string& what) {
  if (cols <= 0 || n % static_cast<size_t>(cols) != 0)
    throw Error("interpret: " + what + " needs a row length (cols) > 0 that divides the element " +
                "count " + std::to_string(n) + ", got cols = " + std::to_string(cols));
  View v{n, static_cast<size_t>(cols), 0};
  if (!columns) return v;
  v.batch_rows = batch_rows > 0 ? static_cast<size_t>(batch_rows) : v.rows();
  if (batch_rows < 0 || (v.batch_rows > 0 && v.rows() % v.batch_rows != 0))
    throw Error("interpret: " + what + " needs batch_rows >= 0 dividing the row count " +
                std::to_string(v.rows()) + ", got batch_rows = " + std::to_string(batch_rows));
  return v;
}

// The element count shared by all per-element tensor inputs; every declared input must be given,
// row state with one value per row of `cols` elements, column state with one per column of each
// batch.
size_t element_count(const Graph& g, const std::map<std::string, Values>& tensors, int64_t cols,
                     int64_t batch_rows) {
  const std::string* first = nullptr;
  size_t n = 1;
  for (const Node& node : g.nodes()) {
    if (node.op != Op::Input) continue;
    if (is_row_state(node) || is_col_state(node)) {
      if (tensors.find(node.name) == tensors.end())
        throw Error("interpret: " + std::string(role_name(node.role)) + " " + quoted(node.name) +
                    " is missing");
      continue;
    }
    auto it = tensors.find(node.name);
    if (it == tensors.end())
      throw Error("interpret: tensor input " + quoted(node.name) + " is missing");
    if (!first) {
      first = &node.name;
      n = it->second.size();
    } else if (it->second.size() != n) {
      throw Error("interpret: tensor " + quoted(node.name) + " has " +
                  std::to_string(it->second.size()) + " elements but " + quoted(*first) + " has " +
                  std::to_string(n));
    }
  }
  for (const Node& node : g.nodes()) {
    if (!is_row_state(node) && !is_col_state(node)) continue;
    const std::string what = std::string(role_name(node.role)) + " " + quoted(node.name);
    const View v = view_of(n, cols, batch_rows, is_col_state(node), what);
    const size_t want = is_row_state(node) ? v.rows() : v.batches() * v.cols;
    const size_t got = tensors.at(node.name).size();
    if (got != want)
      throw Error("interpret: " + what + " has " + std::to_string(got) + " values but the " +
                  "tensors have " + std::to_string(want) +
                  (is_row_state(node) ? " rows" : " columns (of every batch)"));
  }
  return n;
}

// Row or column values as per-element ones: every element gets its row's (column's) value.
Values per_element_values(const Values& values, const View& v, bool columns) {
  Values out(v.n);
  for (size_t i = 0; i < v.n; ++i) out[i] = values[columns ? v.col_of(i) : v.row_of(i)];
  return out;
}

double scalar_value(const std::map<std::string, double>& scalars, const std::string& name) {
  auto it = scalars.find(name);
  if (it == scalars.end()) throw Error("interpret: scalar " + quoted(name) + " is missing");
  return it->second;
}

// Inputs and scalars are rounded to their dtype, as storing them in a buffer or passing them to
// a kernel would (KernelCall converts scalars from double exactly once).
Values stored(Values v, DType t) {
  for (double& x : v) x = graph_detail::round_to_dtype(x, t);
  return v;
}

Values evaluate(const Node& node, const std::vector<Values>& computed, size_t n) {
  size_t len = node.is_tensor ? n : 1;
  Values out(len);
  double args[3];
  for (size_t i = 0; i < len; ++i) {
    for (size_t k = 0; k < node.args.size(); ++k) {
      const Values& a = computed[node.args[k]];
      args[k] = a.size() == 1 ? a[0] : a[i];  // a uniform operand is broadcast
    }
    if (node.op == Op::RoundSR)  // the key is an integer below 2^32 (checked by the kernel call)
      out[i] = graph_detail::round_sr(
          args[0], static_cast<uint32_t>(static_cast<uint64_t>(args[1])), static_cast<uint32_t>(i));
    else
      out[i] = graph_detail::eval_op(node.op, node.dtype, args);
  }
  return out;
}

// A reduction's operand is per-element (Graph checks it); its value has n elements unless n == 1.
Values reduce(const Node& node, const Values& operand, size_t n, int64_t cols, int64_t batch_rows) {
  Values v = operand.size() == n ? operand : Values(n, operand[0]);
  if (op_has(node.op, kReduce))
    return {graph_detail::round_to_dtype(graph_detail::reduce(node.op, v.data(), n), node.dtype)};
  const bool columns = op_has(node.op, kColReduce);
  const View view = view_of(n, cols, batch_rows, columns, std::string(op_name(node.op)));
  const size_t c = view.cols;
  Values out(n);
  if (!columns) {
    for (size_t row = 0; row < view.rows(); ++row) {
      double r = graph_detail::reduce(node.op, v.data() + row * c, c);
      std::fill(out.begin() + row * c, out.begin() + (row + 1) * c,
                graph_detail::round_to_dtype(r, node.dtype));
    }
    return out;
  }
  Values per_column(view.batches() * c);
  for (size_t b = 0; b < view.batches(); ++b)
    for (size_t col = 0; col < c; ++col)
      per_column[b * c + col] = graph_detail::round_to_dtype(
          graph_detail::reduce(node.op, v.data() + b * view.batch_rows * c + col, view.batch_rows,
                               c),
          node.dtype);
  return per_element_values(per_column, view, true);
}

// Every node's values, by node id.
std::vector<Values> evaluate_all(const Graph& g, const std::map<std::string, Values>& tensors,
                                 const std::map<std::string, double>& scalars, int64_t cols,
                                 int64_t batch_rows, size_t* count) {
  check_declared(g, tensors, Op::Input, "tensor input");
  check_declared(g, scalars, Op::Scalar, "scalar");
  size_t n = element_count(g, tensors, cols, batch_rows);
  *count = n;
  std::vector<Values> computed;
  for (const Node& node : g.nodes()) {
    if (is_row_state(node) || is_col_state(node))
      computed.push_back(
          stored(per_element_values(tensors.at(node.name),
                                    view_of(n, cols, batch_rows, is_col_state(node), node.name),
                                    is_col_state(node)),
                 node.dtype));
    else if (node.op == Op::Input)
      computed.push_back(stored(tensors.at(node.name), node.dtype));
    else if (node.op == Op::Scalar)
      computed.push_back(stored({scalar_value(scalars, node.name)}, node.dtype));
    else if (node.op == Op::Const)
      computed.push_back({node.value});
    else if (op_has(node.op, kReduce | kRowReduce | kColReduce))
      computed.push_back(reduce(node, computed[node.args[0]], n, cols, batch_rows));
    else
      computed.push_back(evaluate(node, computed, n));
  }
  return computed;
}

}  // namespace

std::map<std::string, std::vector<double>> interpret(
    const Graph& g, const std::map<std::string, std::vector<double>>& tensors,
    const std::map<std::string, double>& scalars, int64_t cols, int64_t batch_rows) {
  size_t n = 0;
  std::vector<Values> computed = evaluate_all(g, tensors, scalars, cols, batch_rows, &n);
  std::map<std::string, Values> result;
  for (const Output& o : g.outputs()) {
    const Values& v = computed[o.value];
    Values all = v.size() == n ? v : Values(n, v[0]);
    const Node& replaced = g.node(g.find_input(o.replaces));
    if (is_row_state(replaced) || is_col_state(replaced)) {  // one value per row (column)
      const bool columns = is_col_state(replaced);
      const View view = view_of(n, cols, batch_rows, columns, replaced.name);
      Values values(columns ? view.batches() * view.cols : view.rows());
      for (size_t i = 0; i < n; ++i) values[columns ? view.col_of(i) : view.row_of(i)] = all[i];
      all = std::move(values);
    }
    result[o.replaces] = std::move(all);
  }
  return result;
}

std::map<std::string, double> interpret_results(
    const Graph& g, const std::map<std::string, std::vector<double>>& tensors,
    const std::map<std::string, double>& scalars, int64_t cols, int64_t batch_rows) {
  size_t n = 0;
  std::vector<Values> computed = evaluate_all(g, tensors, scalars, cols, batch_rows, &n);
  std::map<std::string, double> result;
  for (const Result& r : g.results()) result[r.name] = computed[r.value].at(0);
  return result;
}

}  // namespace optfuse
