// The reference interpreter: every node evaluated element-wise in double (see eval.h); only
// leaves (as stored) and casts are rounded to a narrower dtype.
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

// The element count shared by all tensor inputs; every declared input must be given.
size_t element_count(const Graph& g, const std::map<std::string, Values>& tensors) {
  const std::string* first = nullptr;
  size_t n = 1;
  for (const Node& node : g.nodes()) {
    if (node.op != Op::Input) continue;
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
  return n;
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
      out[i] = graph_detail::round_sr(args[0], static_cast<uint32_t>(static_cast<uint64_t>(args[1])),
                                      static_cast<uint32_t>(i));
    else
      out[i] = graph_detail::eval_op(node.op, node.dtype, args);
  }
  return out;
}

}  // namespace

std::map<std::string, std::vector<double>> interpret(
    const Graph& g, const std::map<std::string, std::vector<double>>& tensors,
    const std::map<std::string, double>& scalars) {
  check_declared(g, tensors, Op::Input, "tensor input");
  check_declared(g, scalars, Op::Scalar, "scalar");
  size_t n = element_count(g, tensors);

  std::vector<Values> computed;
  for (const Node& node : g.nodes()) {
    switch (node.op) {
      case Op::Input:
        computed.push_back(stored(tensors.at(node.name), node.dtype));
        break;
      case Op::Scalar:
        computed.push_back(stored({scalar_value(scalars, node.name)}, node.dtype));
        break;
      case Op::Const:
        computed.push_back({node.value});
        break;
      default:
        computed.push_back(evaluate(node, computed, n));
    }
  }

  std::map<std::string, Values> result;
  for (const Output& o : g.outputs()) {
    const Values& v = computed[o.value];
    result[o.replaces] = v.size() == n ? v : Values(n, v[0]);
  }
  return result;
}

}  // namespace optfuse
