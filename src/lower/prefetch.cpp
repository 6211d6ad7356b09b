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

class InjectLinePrefetches : public IRMutator {
 public:
  InjectLinePrefetches(std::vector<std::string> loops, int distance_bytes)
      : loops_(std::move(loops)), distance_bytes_(distance_bytes) {}

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
      Expr base = Variable::make(Halide::Handle(), load->name);
      Expr ahead = load->index.as<Ramp>()->base + distance_bytes_ / bytes;
      for (int k = 0; k < lines; ++k)
        block.push_back(Evaluate::make(Call::make(load->type.element_of(), Call::prefetch,
                                                  {base, simplify(ahead + k * line_elems), 1, 1},
                                                  Call::Intrinsic)));
    }
    if (block.empty()) return s;
    block.push_back(s);
    return Block::make(block);
  }

  std::vector<std::string> loops_;
  int distance_bytes_;
  bool inside_ = false;
};

}  // namespace

void add_prefetch_pass(Halide::Pipeline& p, const std::vector<std::string>& loops,
                       int distance_bytes) {
  if (distance_bytes <= 0 || loops.empty()) return;
  p.add_custom_lowering_pass(new InjectLinePrefetches(loops, distance_bytes));
}

}  // namespace optfuse::lower
