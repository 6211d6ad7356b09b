#include "optim/block_state.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "optfuse/error.h"
#include "optfuse/kernel.h"
#include "optim/grad_prologue.h"
#include "optim/graph_copy.h"
#include "optim/options.h"
#include "optim/precision.h"

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

namespace {
constexpr char kScaleSuffix[] = ".absmax";
constexpr size_t kScaleSuffixSize = sizeof(kScaleSuffix) - 1;
}  // namespace

std::string block_scale_name(const std::string& state) { return state + kScaleSuffix; }

std::string block_state_of(const std::string& name) {
  const bool scales =
      name.size() > kScaleSuffixSize &&
      name.compare(name.size() - kScaleSuffixSize, kScaleSuffixSize, kScaleSuffix) == 0;
  return scales ? name.substr(0, name.size() - kScaleSuffixSize) : name;
}

Graph quantize_state(const Graph& g, const std::vector<BlockState>& which) {
  if (which.empty()) return g;
  return BlockStateRewriter(g, which).run();
}

Options blocking_defaults() { return {{"block_size", 256}, {"min_8bit_size", 4096}}; }

void validate_blocking(const Options& h, const std::string& where) {
  const double block = number(h, "block_size", where);
  if (block < 16 || block > kMaxRowStateCols || block != std::floor(block) ||
      static_cast<int64_t>(block) % 16 != 0)
    throw Error(where + ": option 'block_size' must be a multiple of 16 in [16, " +
                std::to_string(kMaxRowStateCols) + "], got " + pyfloat(block));
  const double min_size = number(h, "min_8bit_size", where);
  if (min_size < 0 || min_size != std::floor(min_size) || min_size > 9.0e15)
    throw Error(where + ": option 'min_8bit_size' must be a non-negative integer, got " +
                pyfloat(min_size));
}

Blocking group_blocking(const Options& h) {
  if (h.at("state_dtype") != "int8") return {};
  return {h.at("block_size").get<int64_t>(), h.at("min_8bit_size").get<int64_t>()};
}

BlockMap block_map(const std::string& state) {
  // torch's names of state that is never negative: squares and their maxima, Adagrad's sum of
  // squares, Adamax's infinity norm, Rprop's step sizes. Anything else may be signed.
  static const char* const kNonNegative[] = {"exp_avg_sq", "max_exp_avg_sq", "square_avg", "sum",
                                             "exp_inf",    "acc_delta",      "step_size"};
  for (const char* n : kNonNegative)
    if (state == n) return BlockMap::kSqrt;
  return BlockMap::kSignedLinear;
}

std::vector<BlockState> blocked_states(const Graph& g) {
  std::vector<BlockState> out;
  for (const Node& n : g.nodes()) {
    if (n.op != Op::Input || n.role != Role::State || n.dtype != DType::F32) continue;
    if (n.name == kMasterState || n.name == kGradAccum) continue;
    const bool written = std::any_of(g.outputs().begin(), g.outputs().end(),
                                     [&](const Output& o) { return o.replaces == n.name; });
    if (written) out.push_back({n.name, block_map(n.name)});
  }
  return out;
}

int64_t block_count(int64_t n, int64_t block) { return (n + block - 1) / block; }

void encode_blocks(const float* x, int64_t n, int64_t block, BlockMap map, uint8_t* codes,
                   float* absmax) {
  for (int64_t b = 0; b * block < n; ++b) {
    const int64_t begin = b * block, end = std::min(n, begin + block);
    float m = 0.0f;
    for (int64_t i = begin; i < end; ++i)
      m = std::isnan(x[i]) || std::isnan(m) ? NAN : std::max(m, std::fabs(x[i]));
    absmax[b] = m;
    const bool linear = map == BlockMap::kSignedLinear;
    const float inv = m > 0.0f ? (linear ? 127.0f / m : 255.0f / std::sqrt(m)) : 0.0f;
    for (int64_t i = begin; i < end; ++i) {
      const float c = linear ? x[i] * inv + 127.5f : std::sqrt(x[i]) * inv + 0.5f;
      codes[i] = std::isnan(c) ? 0 : static_cast<uint8_t>(std::clamp(c, 0.0f, 255.0f));
    }
  }
}

void decode_blocks(const uint8_t* codes, const float* absmax, int64_t n, int64_t block,
                   BlockMap map, float* x) {
  for (int64_t i = 0; i < n; ++i) {
    const float m = absmax[i / block], c = static_cast<float>(codes[i]);
    if (map == BlockMap::kSignedLinear) {
      x[i] = (c - 127.0f) * (m / 127.0f);
    } else {
      const float t = c * (std::sqrt(m) / 255.0f);
      x[i] = t * t;
    }
  }
}

}  // namespace optfuse::optim

namespace optfuse {

void encode_8bit_state(const std::string& name, int64_t block, const float* values, int64_t n,
                       uint8_t* codes, float* scales) {
  if (block < 1) throw Error("encode_8bit_state: block " + std::to_string(block) + " < 1");
  optim::encode_blocks(values, n, block, optim::block_map(name), codes, scales);
}

void decode_8bit_state(const std::string& name, int64_t block, const uint8_t* codes,
                       const float* scales, int64_t n, float* values) {
  if (block < 1) throw Error("decode_8bit_state: block " + std::to_string(block) + " < 1");
  optim::decode_blocks(codes, scales, n, block, optim::block_map(name), values);
}

}  // namespace optfuse
