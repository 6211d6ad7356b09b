#include "optim/block_state.h"

#include <map>

#include "optfuse/error.h"
#include "optim/graph_copy.h"

namespace optfuse::optim {
namespace {

// Copies `in` node by node into a new graph, each chosen state read as decode(codes, absmax) and
// written as encode(value).
class BlockStateRewriter {
 public:
  BlockStateRewriter(const Graph& in, const std::vector<BlockState>& which)
      : in_(in), out_(in.name() + "_q8") {
    for (const BlockState& b : which) {
      NodeId id = in.find_input(b.name);
      const std::string what = "graph \"" + in.name() + "\": 8-bit state \"" + b.name + "\": ";
      if (id < 0 || in.node(id).role != Role::State)
        throw Error(what + "the graph has no state input of that name");
      if (in.node(id).dtype != DType::F32)
        throw Error(what + "the state is " + std::string(dtype_name(in.node(id).dtype)) +
                    ", not f32");
      bool replaced = false;
      for (const Output& o : in.outputs()) replaced = replaced || o.replaces == b.name;
      if (!replaced) throw Error(what + "the graph never writes it");
      maps_[b.name] = b.map;
    }
    for (const Node& n : in.nodes())
      if (op_has(n.op, kReduce | kRowReduce))
        throw Error("graph \"" + in.name() + "\": 8-bit state needs a graph without " +
                    std::string(op_name(n.op)) + " (its blocks are the kernel's rows)");
  }

  Graph run() { return copy_graph(in_, out_, *this); }

  // copy_graph's steps.
  NodeId input(Node n) {
    auto it = maps_.find(n.name);
    if (it == maps_.end()) return out_.add_node(std::move(n));
    Value code = cast(out_.state(n.name, DType::U8), DType::F32);
    Value absmax = out_.row_state(block_scale_name(n.name));
    if (it->second == BlockMap::kSignedLinear) return ((code - 127.0) * (absmax / 127.0)).id();
    Value t = code * (sqrt(absmax) / 255.0);
    return (t * t).id();
  }

  void store(const Output& o, Value v) {
    auto it = maps_.find(o.replaces);
    if (it == maps_.end()) return out_.output(o.replaces, v);
    const bool linear = it->second == BlockMap::kSignedLinear;
    Value absmax = row_max(abs(v));
    // 0 for an all-zero block (its codes then encode zero); the row values are computed once per
    // block, outside the element loop.
    Value scale = linear ? 127.0 / absmax : 255.0 / sqrt(absmax);
    Value inv = select(absmax > out_.constant(0.0), scale, out_.constant(0.0));
    // sqrt(v): the update's own square root of the new state (one node, hash-consed), where it
    // has one, as Adam's has.
    Value code = linear ? v * inv + 127.5 : sqrt(v) * inv + 0.5;
    out_.output(o.replaces, cast(code, DType::U8));
    out_.output(block_scale_name(o.replaces), absmax);
  }

 private:
  const Graph& in_;
  Graph out_;
  std::map<std::string, BlockMap> maps_;
};

}  // namespace

std::string block_scale_name(const std::string& state) { return state + ".absmax"; }

Graph quantize_state(const Graph& g, const std::vector<BlockState>& which) {
  if (which.empty()) return g;
  return BlockStateRewriter(g, which).run();
}

}  // namespace optfuse::optim
