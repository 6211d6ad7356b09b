#include "lower/fma.h"

#include <llvm/IR/Constants.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/Module.h>

#include <algorithm>
#include <map>
#include <vector>

namespace optfuse::lower {

using namespace Halide::Internal;
using Halide::Expr;

bool target_has_exact_fma(const Halide::Target& target) {
  return target.arch == Halide::Target::X86 && target.has_feature(Halide::Target::FMA) &&
         !target.has_gpu_feature();
}

namespace {

// `e` without its f32 -> f64 widening: the f32 operand, or undefined.
Expr widened_f32(const Expr& e) {
  const Cast* c = e.as<Cast>();
  if (!c || c->type.element_of() != Halide::Float(64)) return Expr();
  if (c->value.type().element_of() != Halide::Float(32)) return Expr();
  return c->value;
}

}  // namespace

Expr exact_fma_f32(const Expr& e) {
  const Add* add = e.as<Add>();
  if (!add || e.type().element_of() != Halide::Float(64)) return Expr();
  for (int i = 0; i < 2; ++i) {
    const Mul* mul = (i ? add->b : add->a).as<Mul>();
    Expr c = widened_f32(i ? add->a : add->b);
    if (!mul || !c.defined()) continue;
    Expr a = widened_f32(mul->a), b = widened_f32(mul->b);
    if (!a.defined() || !b.defined()) continue;
    return Call::make(Halide::Float(32, e.type().lanes()), kFmaF32, {a, b, c}, Call::PureExtern);
  }
  return Expr();
}

Expr vector_sqrt_f32(const Expr& x) {
  return Call::make(x.type(), kSqrtF32, {x}, Call::PureExtern);
}

namespace {

// One operand of a lane-by-lane call: lane `lane` of vector `source`, or (lane -1) the scalar
// `source` itself.
struct Operand {
  llvm::Value* source;
  int64_t lane;
};

Operand operand_of(llvm::Value* arg) {
  auto* x = llvm::dyn_cast<llvm::ExtractElementInst>(arg);
  auto* index = x ? llvm::dyn_cast<llvm::ConstantInt>(x->getIndexOperand()) : nullptr;
  if (!index) return {arg, -1};
  return {x->getVectorOperand(), index->getSExtValue()};
}

// The lane a call computes: that of its vector operands (-1: none, or they disagree), and their
// width in `*width`.
int64_t lane_of(llvm::CallInst* call, unsigned* width) {
  int64_t lane = -1;
  *width = 0;
  for (unsigned i = 0; i < call->arg_size(); ++i) {
    Operand o = operand_of(call->getArgOperand(i));
    if (o.lane < 0) continue;
    unsigned w = llvm::cast<llvm::FixedVectorType>(o.source->getType())->getNumElements();
    if ((lane >= 0 && lane != o.lane) || (*width && *width != w)) return -1;
    lane = o.lane;
    *width = w;
  }
  return lane;
}

// The calls that are lanes of one vector operation: the same operand vectors (or scalars), each
// call one lane of them, all in one block.
struct Group {
  std::vector<llvm::CallInst*> calls;
  unsigned lanes = 0;
};

// Groups `calls` by their operands' sources; a call whose vector operands do not agree on the
// lane or width, or that lies in another block than its group's first call, is left to
// `*scalar` (it becomes a scalar operation).
std::map<std::vector<llvm::Value*>, Group> group_lanes(const std::vector<llvm::CallInst*>& calls,
                                                       std::vector<llvm::CallInst*>* scalar) {
  std::map<std::vector<llvm::Value*>, Group> groups;
  for (llvm::CallInst* call : calls) {
    std::vector<llvm::Value*> key;
    for (unsigned i = 0; i < call->arg_size(); ++i)
      key.push_back(operand_of(call->getArgOperand(i)).source);
    unsigned width = 0;
    Group* g = lane_of(call, &width) >= 0 ? &groups[key] : nullptr;
    if (!g || (g->lanes && g->calls.front()->getParent() != call->getParent())) {
      scalar->push_back(call);
      continue;
    }
    g->calls.push_back(call);
    g->lanes = width;
  }
  return groups;
}

// Whether `v` is the result of a call to `fn` (a lane not yet replaced).
bool is_call_to(llvm::Value* v, llvm::Function* fn) {
  auto* call = llvm::dyn_cast<llvm::CallInst>(v);
  return fn && call && call->getCalledFunction() == fn;
}

// The group's calls become lanes of ONE call of `id` placed before the group's first call
// (every operand vector is defined before its lanes' extracts, so before that call); LLVM folds
// the re-assembled lanes back into that vector.
void replace_group(llvm::Module& m, llvm::Intrinsic::ID id, const std::vector<llvm::Value*>& key,
                   const Group& g) {
  llvm::CallInst* first = g.calls.front();
  for (llvm::CallInst* c : g.calls)
    if (c->comesBefore(first)) first = c;
  llvm::IRBuilder<> b(first);
  llvm::Type* vt = llvm::FixedVectorType::get(b.getFloatTy(), g.lanes);
  std::vector<llvm::Value*> vectors;
  for (llvm::Value* source : key)
    vectors.push_back(source->getType()->isVectorTy() ? source
                                                      : b.CreateVectorSplat(g.lanes, source));
  llvm::Value* whole = b.CreateCall(llvm::Intrinsic::getDeclaration(&m, id, {vt}), vectors);
  for (llvm::CallInst* c : g.calls) {
    unsigned width = 0;
    llvm::IRBuilder<> at(c);
    c->replaceAllUsesWith(at.CreateExtractElement(whole, at.getInt64(lane_of(c, &width))));
    c->eraseFromParent();
  }
}

void replace_scalar(llvm::Module& m, llvm::Intrinsic::ID id, llvm::CallInst* c) {
  llvm::IRBuilder<> b(c);
  std::vector<llvm::Value*> args(c->arg_begin(), c->arg_end());
  llvm::Function* f = llvm::Intrinsic::getDeclaration(&m, id, {b.getFloatTy()});
  c->replaceAllUsesWith(b.CreateCall(f, args));
  c->eraseFromParent();
}

// Halide emits each vector call lane by lane (extractelement of each operand, call,
// insertelement), and a call may take another call's lane directly (of its own function or of
// another: fma of a square root). So the calls are replaced in rounds, producers first: a group
// whose operands include a lane not yet replaced waits, and once its producer is one vector call
// that operand is an extract of it, and the group regroups by that vector. One round replaces
// the ready calls of `name`; whether it replaced any.
bool replace_ready_lane_calls(llvm::Module& m, const char* name, llvm::Intrinsic::ID id) {
  llvm::Function* fn = m.getFunction(name);
  if (!fn) return false;
  std::vector<llvm::CallInst*> calls, scalar;
  for (llvm::User* u : fn->users())
    if (auto* call = llvm::dyn_cast<llvm::CallInst>(u)) calls.push_back(call);
  auto groups = group_lanes(calls, &scalar);
  // Which are ready is decided before any call is replaced (a replaced call is freed).
  auto waits = [&](auto begin, auto end) {
    return std::any_of(begin, end, [&](llvm::Value* v) {
      return is_call_to(v, m.getFunction(kFmaF32)) || is_call_to(v, m.getFunction(kSqrtF32));
    });
  };
  std::vector<const std::pair<const std::vector<llvm::Value*>, Group>*> ready_groups;
  for (const auto& entry : groups)
    if (!waits(entry.first.begin(), entry.first.end())) ready_groups.push_back(&entry);
  std::vector<llvm::CallInst*> ready_scalars;
  for (llvm::CallInst* c : scalar)
    if (!waits(c->arg_begin(), c->arg_end())) ready_scalars.push_back(c);
  for (const auto* entry : ready_groups) replace_group(m, id, entry->first, entry->second);
  for (llvm::CallInst* c : ready_scalars) replace_scalar(m, id, c);
  if (fn->use_empty()) fn->eraseFromParent();
  return !ready_groups.empty() || !ready_scalars.empty();
}

}  // namespace

void finish_fma_pass(llvm::Module& m) {
  for (bool progress = true; progress;) {
    const bool fma = replace_ready_lane_calls(m, kFmaF32, llvm::Intrinsic::fma);
    progress = replace_ready_lane_calls(m, kSqrtF32, llvm::Intrinsic::sqrt) || fma;
  }
}

}  // namespace optfuse::lower
