#include "lower/f16c.h"

#include <llvm/IR/Constants.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/Module.h>

#include <map>
#include <string>
#include <vector>

namespace optfuse::lower {
namespace {

using namespace Halide::Internal;
using Halide::Expr;

class F16cConversions : public IRMutator {
  using IRMutator::visit;

  Expr visit(const Cast* op) override {
    Expr value = mutate(op->value);
    const Halide::Type from = value.type(), to = op->type;
    const int lanes = to.lanes();
    // (Halide's is_float() is true for bfloat16 too: compare the exact types.)
    if (from == Halide::Float(16, lanes) && to == Halide::Float(32, lanes)) {
      Expr bits = reinterpret(Halide::UInt(16, lanes), value);
      return Call::make(Halide::Float(32, lanes), kF16ToF32, {bits}, Call::PureExtern);
    }
    if (from == Halide::Float(32, lanes) && to == Halide::Float(16, lanes)) {
      Expr bits = Call::make(Halide::UInt(16, lanes), kF32ToF16, {value}, Call::PureExtern);
      return reinterpret(to, bits);
    }
    return value.same_as(op->value) ? Expr(op) : Cast::make(to, value);
  }
};

}  // namespace

void add_f16c_pass(Halide::Pipeline& p, const Halide::Target& target) {
  if (target.arch != Halide::Target::X86 || !target.has_feature(Halide::Target::F16C)) return;
  p.add_custom_lowering_pass(new F16cConversions);
}

namespace {

// Where an instruction computing from `v` can go so that `v` dominates it: right after v's
// definition (after the phis of its block for a phi), or at the function's entry.
llvm::Instruction* just_after(llvm::Value* v, llvm::Function& f) {
  if (auto* phi = llvm::dyn_cast<llvm::PHINode>(v)) return phi->getParent()->getFirstNonPHI();
  if (auto* i = llvm::dyn_cast<llvm::Instruction>(v)) return i->getNextNode();
  return &*f.getEntryBlock().getFirstInsertionPt();
}

}  // namespace

// Halide emits each vector conversion call lane by lane (extractelement, call,
// insertelement). Each call becomes a lane of ONE whole-vector conversion of the vector its lane
// came from (LLVM folds the re-assembled lanes back into that vector), or, for a scalar, a scalar
// conversion: fpext half -> float and fptrunc float -> half, which x86 with F16C selects as
// vcvtph2ps / vcvtps2ph (round to nearest even).
void finish_f16c_pass(llvm::Module& m) {
  for (const char* name : {kF16ToF32, kF32ToF16}) {
    llvm::Function* fn = m.getFunction(name);
    if (!fn) continue;
    const bool widen = std::string(name) == kF16ToF32;
    llvm::Type* half = llvm::Type::getHalfTy(m.getContext());
    auto convert = [&](llvm::IRBuilder<>& b, llvm::Value* x) -> llvm::Value* {
      llvm::Type* t = x->getType();
      auto* vt = llvm::dyn_cast<llvm::FixedVectorType>(t);
      auto as = [&](llvm::Type* elem) -> llvm::Type* {  // `elem`, or vectors of it like x
        if (!vt) return elem;
        return llvm::FixedVectorType::get(elem, vt->getNumElements());
      };
      if (widen) return b.CreateFPExt(b.CreateBitCast(x, as(half)), as(b.getFloatTy()));
      return b.CreateBitCast(b.CreateFPTrunc(x, as(half)), as(b.getInt16Ty()));
    };
    std::map<llvm::Value*, llvm::Value*> whole;  // source vector -> its converted vector
    std::vector<llvm::CallInst*> calls;
    for (llvm::User* u : fn->users())
      if (auto* call = llvm::dyn_cast<llvm::CallInst>(u)) calls.push_back(call);
    for (llvm::CallInst* call : calls) {
      llvm::Value* arg = call->getArgOperand(0);
      llvm::Value* result;
      auto* lane = llvm::dyn_cast<llvm::ExtractElementInst>(arg);
      if (lane && llvm::isa<llvm::ConstantInt>(lane->getIndexOperand())) {
        llvm::Value* source = lane->getVectorOperand();
        llvm::Value*& converted = whole[source];
        if (!converted) {
          llvm::IRBuilder<> b(just_after(source, *call->getFunction()));
          converted = convert(b, source);
        }
        llvm::IRBuilder<> b(call);
        result = b.CreateExtractElement(converted, lane->getIndexOperand());
      } else {
        llvm::IRBuilder<> b(call);
        result = convert(b, arg);
      }
      call->replaceAllUsesWith(result);
      call->eraseFromParent();
    }
    if (fn->use_empty()) fn->eraseFromParent();
  }
}

}  // namespace optfuse::lower
