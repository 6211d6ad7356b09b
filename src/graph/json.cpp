// The JSON form of a Graph (docs/graph-json.md). Generic over ops.def: an op is looked up by its
// ops.def name and its operand count is checked against the op's arity, so new ops need no edit
// here; op attributes (none yet) are read in one place, read_attributes().
#include "graph/json.h"

#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "graph/names.h"
#include "optfuse/error.h"

namespace optfuse::graph_json {
namespace {

using nlohmann::json;

class Reader {
 public:
  explicit Reader(std::string where) : where_(std::move(where)) {}

  Graph read(const json& j) {
    if (!j.is_object()) fail("", "a graph must be a JSON object, got " + kind(j));
    for (const auto& [key, value] : j.items())
      if (key != "name" && key != "inputs" && key != "scalars" && key != "nodes" &&
          key != "outputs" && key != "results")
        fail("/" + key, "unknown field (expected name, inputs, scalars, nodes, outputs, results)");
    if (j.contains("name")) {
      std::string name = string_at(j["name"], "/name");
      guarded("/name", [&] { g_.set_name(std::move(name)); });
    }
    each(j, "inputs", [&](const json& v, const std::string& at) { input(v, at); });
    each(j, "scalars", [&](const json& v, const std::string& at) { scalar(v, at); });
    each(j, "nodes", [&](const json& v, const std::string& at) { node(v, at); });
    outputs(j);
    results(j);
    return std::move(g_);
  }

 private:
  template <typename F>
  void each(const json& j, const char* field, F&& f) {
    auto it = j.find(field);
    if (it == j.end()) return;
    const std::string at = std::string("/") + field;
    if (!it->is_array()) fail(at, "must be an array, got " + kind(*it));
    for (size_t i = 0; i < it->size(); ++i) f((*it)[i], at + "/" + std::to_string(i));
  }

  // {"name": "exp_avg", "role": "state", "dtype": "f32"}; dtype defaults to f32.
  void input(const json& v, const std::string& at) {
    object_with(v, at, {"name", "role", "dtype"});
    std::string name = required_string(v, "name", at), role_text = required_string(v, "role", at);
    Role role;
    if (role_text == "param")
      role = Role::Param;
    else if (role_text == "grad")
      role = Role::Grad;
    else if (role_text == "state")
      role = Role::State;
    else if (role_text == "row_state")
      role = Role::RowState;
    else if (role_text == "col_state")
      role = Role::ColState;
    else
      fail(at + "/role",
           "expected param, grad, state, row_state or col_state, got \"" + role_text + "\"");
    DType t = dtype(v, at);
    define(name, at, [&] { return g_.input(role, name, t).id(); });
  }

  // "lr" or {"name": "maximize", "dtype": "bool"}.
  void scalar(const json& v, const std::string& at) {
    if (v.is_string()) {
      std::string name = v.get<std::string>();
      return define(name, at, [&] { return g_.scalar(name).id(); });
    }
    object_with(v, at, {"name", "dtype"});
    std::string name = required_string(v, "name", at);
    DType t = dtype(v, at);
    define(name, at, [&] { return g_.scalar(name, t).id(); });
  }

  // {"id": "m1", "op": "add", "args": ["exp_avg", 0.5], "dtype": ..., "attrs": {...}} or
  // {"id": "one", "const": 1, "dtype": "f32"}. An argument is a defined id or a number (a
  // constant that adopts the other operand's dtype, as in the C++ builders).
  void node(const json& v, const std::string& at) {
    object_with(v, at, {"id", "op", "args", "dtype", "attrs", "const"});
    std::string id = required_string(v, "id", at);
    guarded(at + "/id", [&] { check_name(id, "node id"); });
    if (v.contains("const")) {
      if (v.contains("op") || v.contains("args")) fail(at, "a constant has no op or args");
      double value = number(v["const"], at + "/const");
      DType t = dtype(v, at);
      return define(id, at, [&] { return g_.constant(value, t).id(); });
    }
    std::string op_text = required_string(v, "op", at);
    Op op;
    if (!parse_op(op_text, &op) || op_has(op, kLeaf))
      fail(at + "/op", "unknown op \"" + op_text + "\" (ops are the names in ops.def)");
    auto args = v.find("args");
    if (args == v.end() || !args->is_array()) fail(at + "/args", "must be an array of operands");
    if (args->size() != static_cast<size_t>(op_arity(op)))
      fail(at + "/args", op_text + " takes " + std::to_string(op_arity(op)) + " operands, got " +
                             std::to_string(args->size()));
    std::vector<Value> operands;
    for (size_t i = 0; i < args->size(); ++i)
      operands.push_back(operand((*args)[i], at + "/args/" + std::to_string(i)));
    const std::string callee = read_attributes(op, v, at);
    DType cast_to = DType::F32;
    if (op == Op::Cast) {
      if (!v.contains("dtype")) fail(at, "cast needs \"dtype\"");
      cast_to = dtype(v, at);
    } else if (v.contains("dtype")) {
      fail(at + "/dtype", "only cast and constants take a dtype (others derive it)");
    }
    // Number operands become constants of the other operand's dtype (Graph::make adopts them).
    define(id, at, [&] {
      return (op == Op::Opaque ? opaque(callee, operands[0]) : g_.make(op, operands, cast_to)).id();
    });
  }

  // THE place for op attributes (axes of a reduction, ...): an op that has some reads them here
  // from v["attrs"] (and to_json writes them). Only opaque has one: "callee", the name of the
  // external computation, returned.
  std::string read_attributes(Op op, const json& v, const std::string& at) {
    auto attrs = v.find("attrs");
    if (op == Op::Opaque) {
      if (attrs == v.end() || !attrs->is_object() || attrs->size() != 1 ||
          !attrs->contains("callee"))
        fail(at + "/attrs", "opaque takes one attribute, \"callee\" (the external computation)");
      return string_at((*attrs)["callee"], at + "/attrs/callee");
    }
    if (attrs == v.end()) return "";
    if (!attrs->is_object() || !attrs->empty())
      fail(at + "/attrs", std::string(op_name(op)) + " takes no attributes");
    return "";
  }

  Value operand(const json& a, const std::string& at) {
    if (a.is_number()) return g_.constant(a.get<double>(), DType::F32);
    if (!a.is_string()) fail(at, "an operand is a defined id (string) or a number, got " + kind(a));
    auto it = ids_.find(a.get<std::string>());
    if (it == ids_.end())
      fail(at,
           "\"" + a.get<std::string>() + "\" is not defined (inputs, scalars and earlier nodes)");
    return g_.value(it->second);
  }

  void outputs(const json& j) {
    auto it = j.find("outputs");
    if (it == j.end() && j.contains("results")) return;  // a read-only statistics pass
    if (it == j.end()) fail("/outputs", "missing (an object: replaced input -> node id)");
    if (!it->is_object()) fail("/outputs", "must be an object, got " + kind(*it));
    for (const auto& item : it->items()) {  // (clang 14 cannot capture structured bindings)
      const std::string& replaces = item.key();
      const json& value = item.value();
      guarded("/outputs", [&] { check_name(replaces, "output name"); });  // before it is shown
      const std::string at = "/outputs/" + replaces;
      Value v = operand(value, at);
      guarded(at, [&] { g_.output(replaces, v); });
    }
  }

  // Optional: {"sumsq": "n3"}, uniform values returned to the caller (graph.h, Result).
  void results(const json& j) {
    auto it = j.find("results");
    if (it == j.end()) return;
    if (!it->is_object()) fail("/results", "must be an object, got " + kind(*it));
    for (const auto& item : it->items()) {
      const std::string& name = item.key();
      const json& value = item.value();
      guarded("/results", [&] { check_name(name, "result name"); });
      const std::string at = "/results/" + name;
      Value v = operand(value, at);
      guarded(at, [&] { g_.result(name, v); });
    }
  }

  template <typename Build>
  void define(const std::string& id, const std::string& at, Build&& build) {
    if (id.empty()) fail(at, "the name must not be empty");
    if (ids_.count(id)) fail(at, "\"" + id + "\" is already defined");
    guarded(at, [&] { ids_[id] = build(); });
  }

  // Graph errors (dtype mismatches, ...) get the JSON path of the node that caused them.
  template <typename F>
  void guarded(const std::string& at, F&& f) {
    try {
      f();
    } catch (const Error& e) {
      fail(at, e.what());
    }
  }

  void object_with(const json& v, const std::string& at, std::initializer_list<const char*> keys) {
    if (!v.is_object()) fail(at, "must be an object, got " + kind(v));
    for (const auto& [key, value] : v.items()) {
      bool known = false;
      for (const char* k : keys) known = known || key == k;
      if (!known) fail(at + "/" + key, "unknown field");
    }
  }

  std::string required_string(const json& v, const char* key, const std::string& at) {
    if (!v.contains(key)) fail(at, std::string("missing \"") + key + "\"");
    return string_at(v[key], at + "/" + key);
  }

  std::string string_at(const json& v, const std::string& at) {
    if (!v.is_string()) fail(at, "must be a string, got " + kind(v));
    return v.get<std::string>();
  }

  // A number, or "nan" / "inf" / "-inf" (JSON has no literal for them).
  double number(const json& v, const std::string& at) {
    if (v.is_number()) return v.get<double>();
    if (v == "nan") return NAN;
    if (v == "inf") return HUGE_VAL;
    if (v == "-inf") return -HUGE_VAL;
    fail(at, "must be a number (or \"nan\", \"inf\", \"-inf\"), got " + kind(v));
  }

  DType dtype(const json& v, const std::string& at) {
    if (!v.contains("dtype")) return DType::F32;
    std::string text = string_at(v["dtype"], at + "/dtype");
    DType t;
    if (!parse_dtype(text, &t))
      fail(at + "/dtype", "unknown dtype \"" + text + "\" (f32, f64, f16, bf16, bool)");
    return t;
  }

  static std::string kind(const json& v) {
    return std::string(v.type_name()) + " " + message_text(v);
  }

  [[noreturn]] void fail(const std::string& at, const std::string& what) const {
    std::string prefix = where_.empty() ? "" : where_ + ": ";
    throw Error(prefix + "graph JSON " + (at.empty() ? "/" : at) + ": " + what);
  }

  std::string where_;
  Graph g_;
  std::map<std::string, NodeId> ids_;  // input / scalar names and node ids -> node
};

json number_json(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

}  // namespace

std::string message_text(const json& v) {
  return v.dump(-1, ' ', false, json::error_handler_t::replace);
}

void check_nesting(const json& v, const std::string& what) {
  constexpr size_t kMaxDepth = 64;
  std::vector<std::pair<const json*, size_t>> todo{{&v, 1}};
  while (!todo.empty()) {
    auto [j, depth] = todo.back();
    todo.pop_back();
    if (depth > kMaxDepth)
      throw Error(what + ": JSON nested deeper than " + std::to_string(kMaxDepth) + " levels");
    if (j->is_structured())
      for (const json& e : *j) todo.emplace_back(&e, depth + 1);
  }
}

Graph from_json(const json& j, const std::string& where) {
  check_nesting(j, (where.empty() ? "" : where + ": ") + "graph JSON");
  try {
    return Reader(where).read(j);
  } catch (const json::exception& e) {  // a JSON value built in C++ can hold what text cannot
    throw Error((where.empty() ? "" : where + ": ") + "graph JSON: " + e.what());
  }
}

json to_json(const Graph& g) {
  json inputs = json::array(), scalars = json::array(), nodes = json::array();
  // Leaves are named by their names, other nodes "%N"; a leaf may be named "%N" too, so such an
  // id gets primes until it is unique (ids share one namespace when read back).
  std::set<std::string> leaves;
  for (const Node& n : g.nodes())
    if (n.op == Op::Input || n.op == Op::Scalar) leaves.insert(n.name);
  std::vector<std::string> ids;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    std::string id = n.op == Op::Input || n.op == Op::Scalar ? n.name : "%" + std::to_string(i);
    if (n.op != Op::Input && n.op != Op::Scalar)
      while (leaves.count(id)) id += "'";
    ids.push_back(std::move(id));
  }
  auto id = [&](NodeId i) { return ids.at(static_cast<size_t>(i)); };
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    const std::string dt(dtype_name(n.dtype));
    if (n.op == Op::Input) {
      inputs.push_back({{"name", n.name}, {"role", std::string(role_name(n.role))}, {"dtype", dt}});
    } else if (n.op == Op::Scalar) {
      scalars.push_back({{"name", n.name}, {"dtype", dt}});
    } else if (n.op == Op::Const) {
      nodes.push_back({{"id", id(i)}, {"const", number_json(n.value)}, {"dtype", dt}});
    } else {
      json node = {{"id", id(i)}, {"op", std::string(op_name(n.op))}, {"args", json::array()}};
      for (NodeId a : n.args) node["args"].push_back(id(a));
      if (n.op == Op::Cast) node["dtype"] = dt;
      if (n.op == Op::Opaque) node["attrs"] = {{"callee", n.name}};
      nodes.push_back(node);
    }
  }
  json outputs = json::object();
  for (const Output& o : g.outputs()) outputs[o.replaces] = id(o.value);
  json out = {{"name", g.name()},
              {"inputs", inputs},
              {"scalars", scalars},
              {"nodes", nodes},
              {"outputs", outputs}};
  if (!g.results().empty()) {
    json results = json::object();
    for (const Result& r : g.results()) results[r.name] = id(r.value);
    out["results"] = results;
  }
  return out;
}

}  // namespace optfuse::graph_json

namespace optfuse {

Graph parse_json(std::string_view text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // (nlohmann shows the bytes last read, which need not be UTF-8.)
    throw Error("graph JSON: not valid JSON: " + escape_invalid_utf8(e.what()));
  }
  return graph_json::from_json(j);
}

std::string print_json(const Graph& g) {
  try {
    return graph_json::to_json(g).dump(2);
  } catch (const nlohmann::json::exception& e) {  // names are checked where they enter (names.h)
    internal_error(std::string("print_json: ") + e.what());
  }
}

}  // namespace optfuse
