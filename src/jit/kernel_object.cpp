#include "jit/kernel_object.h"

#include <Halide.h>
#include <llvm/ADT/SmallVector.h>
#include <llvm/IR/Constants.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/raw_ostream.h>

#include <map>
#include <set>
#include <vector>

#include "lower/f16c.h"
#include "lower/prefetch.h"

namespace optfuse::jit {
namespace {

// llvm.prefetch(address, rw, locality, cache type). Halide 14 emits locality 0 (prefetchnta).
// Each prefetch whose address is computed from a lower::kPrefetchL2Marker call gets locality 2,
// which fills L2 and L3 but not L1 (prefetcht1 on x86); every other one gets 3, which keeps the
// line in every level (prefetcht0). The marker calls become 0.
void set_prefetch_localities(llvm::Module& m) {
  std::vector<llvm::CallInst*> markers;
  if (llvm::Function* marker = m.getFunction(lower::kPrefetchL2Marker))
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
  if (llvm::Function* marker = m.getFunction(lower::kPrefetchL2Marker))
    if (marker->use_empty()) marker->eraseFromParent();
}

// Where an instruction computing from `v` can go so that `v` dominates it: right after v's
// definition (after the phis of its block for a phi), or at the function's entry.
llvm::Instruction* just_after(llvm::Value* v, llvm::Function& f) {
  if (auto* phi = llvm::dyn_cast<llvm::PHINode>(v)) return phi->getParent()->getFirstNonPHI();
  if (auto* i = llvm::dyn_cast<llvm::Instruction>(v)) return i->getNextNode();
  return &*f.getEntryBlock().getFirstInsertionPt();
}

// lower/f16c.h: Halide emits each vector conversion call lane by lane (extractelement, call,
// insertelement). Each call becomes a lane of ONE whole-vector conversion of the vector its lane
// came from (LLVM folds the re-assembled lanes back into that vector), or, for a scalar, a scalar
// conversion: fpext half -> float and fptrunc float -> half, which x86 with F16C selects as
// vcvtph2ps / vcvtps2ph (round to nearest even).
void f16c_conversions(llvm::Module& m) {
  for (const char* name : {lower::kF16ToF32, lower::kF32ToF16}) {
    llvm::Function* fn = m.getFunction(name);
    if (!fn) continue;
    const bool widen = std::string(name) == lower::kF16ToF32;
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

}  // namespace

std::vector<char> compile_module_to_object(const Halide::Module& m) {
  llvm::LLVMContext ctx;
  std::unique_ptr<llvm::Module> ir = Halide::compile_module_to_llvm_module(m, ctx);
  set_prefetch_localities(*ir);
  f16c_conversions(*ir);
  llvm::SmallVector<char, 0> object;
  llvm::raw_svector_ostream out(object);
  Halide::compile_llvm_module_to_object(*ir, out);
  return std::vector<char>(object.begin(), object.end());
}

}  // namespace optfuse::jit
