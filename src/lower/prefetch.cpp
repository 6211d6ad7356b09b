#include "lower/prefetch.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace optfuse::lower {
namespace {

using namespace Halide::Internal;
using Halide::Expr;

constexpr int kLineBytes = 64;  // x86-64 and AArch64 data cache lines

// Dense vector loads of pipeline input buffers (Load nodes with a stride-1 ramp index), each
// (buffer, index) once: a value that reads the same vector twice gets one set of prefetches.
class FindInputStreams : public IRVisitor {
 public:
  std::vector<const Load*> loads;

 private:
  using IRVisitor::visit;
  void visit(const Load* op) override {
    IRVisitor::visit(op);
    const Ramp* r = op->index.as<Ramp>();
    if (!op->param.defined() || !op->param.is_buffer() || r == nullptr || !is_const_one(r->stride))
      return;
    for (const Load* seen : loads)
      if (seen->name == op->name && equal(seen->index, op->index)) return;
    loads.push_back(op);
  }
};

// A prefetch of element `index` of `load`'s buffer. An L2 prefetch adds kPrefetchL2Marker's value
// (0) to its offset: Halide 14's prefetch intrinsic has no locality argument, and
// jit/kernel_object.cpp gives every prefetch whose address uses the marker locality 2. (An
// extern call in the loop instead would be opaque to LLVM: it changed which values LLVM shared
// between the outputs, and with them the rounding of some results.)
Stmt prefetch(const Load* load, Expr index, bool into_l2) {
  Expr base = Variable::make(Halide::Handle(), load->name);
  index = simplify(index);
  if (into_l2) index += Call::make(Halide::Int(32), kPrefetchL2Marker, {}, Call::PureExtern);
  return Evaluate::make(
      Call::make(load->type.element_of(), Call::prefetch, {base, index, 1, 1}, Call::Intrinsic));
}

class InjectLinePrefetches : public IRMutator {
 public:
  InjectLinePrefetches(std::vector<std::string> loops, int distance_bytes, int l2_distance_bytes)
      : loops_(std::move(loops)),
        distance_bytes_(distance_bytes),
        l2_distance_bytes_(l2_distance_bytes) {}

 private:
  using IRMutator::visit;

  Stmt visit(const For* op) override {
    bool was_inside = inside_;
    for (const std::string& loop : loops_)
      inside_ = inside_ || op->name.find(loop) != std::string::npos;
    Stmt s = IRMutator::visit(op);
    inside_ = was_inside;
    return s;
  }

  Stmt visit(const Store* op) override {
    Stmt s = IRMutator::visit(op);
    if (!inside_) return s;
    FindInputStreams streams;
    op->value.accept(&streams);
    std::vector<Stmt> block;
    for (const Load* load : streams.loads) {
      const int bytes = load->type.bytes();  // of one element
      const int lanes = load->type.lanes();
      const int line_elems = std::max(kLineBytes / bytes, 1);
      const int lines = (lanes * bytes + kLineBytes - 1) / kLineBytes;
      Expr first = load->index.as<Ramp>()->base;
      for (int k = 0; k < lines; ++k) {
        if (distance_bytes_ > 0)
          block.push_back(prefetch(load, first + distance_bytes_ / bytes + k * line_elems, false));
        if (l2_distance_bytes_ > 0)
          block.push_back(prefetch(load, first + l2_distance_bytes_ / bytes + k * line_elems, true));
      }
    }
    if (block.empty()) return s;
    block.push_back(s);
    return Block::make(block);
  }

  std::vector<std::string> loops_;
  int distance_bytes_;
  int l2_distance_bytes_;
  bool inside_ = false;
};

}  // namespace

void add_prefetch_pass(Halide::Pipeline& p, const std::vector<std::string>& loops,
                       int distance_bytes, int l2_distance_bytes) {
  if ((distance_bytes <= 0 && l2_distance_bytes <= 0) || loops.empty()) return;
  p.add_custom_lowering_pass(
      new InjectLinePrefetches(loops, std::max(distance_bytes, 0), std::max(l2_distance_bytes, 0)));
}

}  // namespace optfuse::lower
