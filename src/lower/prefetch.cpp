#include "lower/prefetch.h"

#include <llvm/IR/Constants.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/Module.h>

#include <algorithm>
#include <set>
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

// A prefetch of element `index` of `buffer` (elements of `type`). An L2 prefetch adds
// kPrefetchL2Marker's value (0) to its offset: Halide 14's prefetch intrinsic has no locality
// argument, and jit/kernel_object.cpp gives every prefetch whose address uses the marker
// locality 2. (An extern call in the loop instead would be opaque to LLVM: it changed which values
// LLVM shared between the outputs, and with them the rounding of some results.)
Stmt prefetch(const std::string& buffer, Halide::Type type, Expr index, bool into_l2) {
  Expr base = Variable::make(Halide::Handle(), buffer);
  index = simplify(index);
  if (into_l2) index += Call::make(Halide::Int(32), kPrefetchL2Marker, {}, Call::PureExtern);
  return Evaluate::make(Call::make(type, Call::prefetch, {base, index, 1, 1}, Call::Intrinsic));
}

class InjectLinePrefetches : public IRMutator {
 public:
  InjectLinePrefetches(std::vector<std::string> loops, std::vector<std::string> write_only,
                       int distance_bytes, int l2_distance_bytes)
      : loops_(std::move(loops)),
        write_only_(std::move(write_only)),
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
    for (const Load* load : streams.loads)
      add_line_prefetches(load->name, load->type, load->index.as<Ramp>()->base, &block);
    // A store to a buffer nothing reads first misses the cache (the core must own each line
    // before writing it): prefetching those lines too kept a bf16 AdamW from losing 6-22% to
    // the L2 prefetches of its inputs (src/lower/README.md).
    const Ramp* dense = op->index.as<Ramp>();
    if (dense != nullptr && is_const_one(dense->stride) &&
        std::find(write_only_.begin(), write_only_.end(), op->name) != write_only_.end())
      add_line_prefetches(op->name, op->value.type(), dense->base, &block);
    if (block.empty()) return s;
    block.push_back(s);
    return Block::make(block);
  }

  // For each cache line of the `vector` (a vector type) at element `first` of `buffer`: a prefetch
  // `distance_bytes_` ahead and one into L2 `l2_distance_bytes_` ahead (those > 0).
  void add_line_prefetches(const std::string& buffer, Halide::Type vector, const Expr& first,
                           std::vector<Stmt>* block) const {
    const int bytes = vector.bytes();  // of one element
    const int line_elems = std::max(kLineBytes / bytes, 1);
    const int lines = (vector.lanes() * bytes + kLineBytes - 1) / kLineBytes;
    const Halide::Type element = vector.element_of();
    for (int k = 0; k < lines; ++k) {
      if (distance_bytes_ > 0)
        block->push_back(
            prefetch(buffer, element, first + distance_bytes_ / bytes + k * line_elems, false));
      if (l2_distance_bytes_ > 0)
        block->push_back(
            prefetch(buffer, element, first + l2_distance_bytes_ / bytes + k * line_elems, true));
    }
  }

  std::vector<std::string> loops_;
  std::vector<std::string> write_only_;
  int distance_bytes_;
  int l2_distance_bytes_;
  bool inside_ = false;
};

}  // namespace

void add_prefetch_pass(Halide::Pipeline& p, const std::vector<std::string>& loops,
                       const std::vector<std::string>& write_only_buffers, int distance_bytes,
                       int l2_distance_bytes) {
  if ((distance_bytes <= 0 && l2_distance_bytes <= 0) || loops.empty()) return;
  p.add_custom_lowering_pass(new InjectLinePrefetches(
      loops, write_only_buffers, std::max(distance_bytes, 0), std::max(l2_distance_bytes, 0)));
}

// llvm.prefetch(address, rw, locality, cache type). Halide 14 emits locality 0 (prefetchnta).
// Each prefetch whose address is computed from a kPrefetchL2Marker call gets locality 2,
// which fills L2 and L3 but not L1 (prefetcht1 on x86); every other one gets 3, which keeps the
// line in every level (prefetcht0). The marker calls become 0.
void finish_prefetch_pass(llvm::Module& m) {
  std::vector<llvm::CallInst*> markers;
  if (llvm::Function* marker = m.getFunction(kPrefetchL2Marker))
    for (llvm::User* u : marker->users())
      if (auto* call = llvm::dyn_cast<llvm::CallInst>(u)) markers.push_back(call);
  std::set<llvm::Value*> from_marker(markers.begin(), markers.end());
  std::vector<llvm::Value*> work(markers.begin(), markers.end());
  while (!work.empty()) {  // everything computed from a marker (address arithmetic)
    llvm::Value* v = work.back();
    work.pop_back();
    for (llvm::User* u : v->users())
      if (from_marker.insert(u).second) work.push_back(u);
  }
  for (llvm::Function& f : m) {
    if (f.getIntrinsicID() != llvm::Intrinsic::prefetch) continue;
    for (llvm::User* u : f.users())
      if (auto* call = llvm::dyn_cast<llvm::CallInst>(u))
        call->setArgOperand(2, llvm::ConstantInt::get(call->getArgOperand(2)->getType(),
                                                      from_marker.count(call) ? 2 : 3));
  }
  for (llvm::CallInst* call : markers) {
    call->replaceAllUsesWith(llvm::ConstantInt::get(call->getType(), 0));
    call->eraseFromParent();
  }
  if (llvm::Function* marker = m.getFunction(kPrefetchL2Marker))
    if (marker->use_empty()) marker->eraseFromParent();
}

}  // namespace optfuse::lower
