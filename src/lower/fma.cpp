#include "lower/fma.h"

#include <llvm/IR/Constants.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/Module.h>

#include <array>
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

// The calls that are lanes of one vector fma: the same three operand vectors (or scalars), each
// call one lane of them.
struct Group {
  std::vector<llvm::CallInst*> calls;
  unsigned lanes = 0;
};

// Groups `calls` by their operands' sources; a call whose vector operands do not agree on the
// lane, or whose vectors differ in width, is left out (it becomes a scalar fma).
std::map<std::array<llvm::Value*, 3>, Group> group_lanes(const std::vector<llvm::CallInst*>& calls,
                                                         std::vector<llvm::CallInst*>* scalar) {
  std::map<std::array<llvm::Value*, 3>, Group> groups;
  for (llvm::CallInst* call : calls) {
    std::array<llvm::Value*, 3> key;
    int64_t lane = -1;
    unsigned width = 0;
    bool ok = true;
    for (unsigned i = 0; i < 3; ++i) {
      Operand o = operand_of(call->getArgOperand(i));
      key[i] = o.source;
      if (o.lane < 0) continue;
      unsigned w = llvm::cast<llvm::FixedVectorType>(o.source->getType())->getNumElements();
      ok = ok && (lane < 0 || lane == o.lane) && (width == 0 || width == w);
      lane = o.lane;
      width = w;
    }
    Group* g = ok && lane >= 0 ? &groups[key] : nullptr;
    if (!g || (g->lanes && g->calls.front()->getParent() != call->getParent())) {
      scalar->push_back(call);
      continue;
    }
    g->calls.push_back(call);
    g->lanes = width;
  }
  return groups;
}

}  // namespace

// Halide emits each vector call lane by lane (extractelement of each operand, call,
// insertelement). The calls of one group become lanes of ONE llvm.fma placed before the
// group's first call (all in one block; every operand vector is defined before its lanes'
// extracts, so before that call); LLVM folds the re-assembled lanes back into that vector.
void finish_fma_pass(llvm::Module& m) {
  llvm::Function* fn = m.getFunction(kFmaF32);
  if (!fn) return;
  std::vector<llvm::CallInst*> calls, scalar;
  for (llvm::User* u : fn->users())
    if (auto* call = llvm::dyn_cast<llvm::CallInst>(u)) calls.push_back(call);
  auto groups = group_lanes(calls, &scalar);
  for (auto& [key, g] : groups) {
    llvm::CallInst* first = g.calls.front();
    for (llvm::CallInst* c : g.calls)
      if (c->comesBefore(first)) first = c;
    llvm::IRBuilder<> b(first);
    llvm::Type* vt = llvm::FixedVectorType::get(b.getFloatTy(), g.lanes);
    std::vector<llvm::Value*> vectors;
    for (llvm::Value* source : key)
      vectors.push_back(source->getType()->isVectorTy() ? source
                                                        : b.CreateVectorSplat(g.lanes, source));
    llvm::Function* vfma = llvm::Intrinsic::getDeclaration(&m, llvm::Intrinsic::fma, {vt});
    llvm::Value* whole = b.CreateCall(vfma, vectors);
    for (llvm::CallInst* c : g.calls) {
      llvm::IRBuilder<> at(c);
      const int64_t lane = [&] {
        for (unsigned i = 0; i < 3; ++i)
          if (Operand o = operand_of(c->getArgOperand(i)); o.lane >= 0) return o.lane;
        return int64_t{0};
      }();
      c->replaceAllUsesWith(at.CreateExtractElement(whole, at.getInt64(lane)));
      c->eraseFromParent();
    }
  }
  for (llvm::CallInst* c : scalar) {
    llvm::IRBuilder<> b(c);
    llvm::Function* sfma =
        llvm::Intrinsic::getDeclaration(&m, llvm::Intrinsic::fma, {b.getFloatTy()});
    c->replaceAllUsesWith(
        b.CreateCall(sfma, {c->getArgOperand(0), c->getArgOperand(1), c->getArgOperand(2)}));
    c->eraseFromParent();
  }
  if (fn->use_empty()) fn->eraseFromParent();
}

}  // namespace optfuse::lower
