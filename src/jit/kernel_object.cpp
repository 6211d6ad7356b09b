#include "jit/kernel_object.h"

#include <Halide.h>
#include <llvm/ADT/SmallVector.h>
#include <llvm/IR/Constants.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/raw_ostream.h>

namespace optfuse::jit {
namespace {

// llvm.prefetch(address, rw, locality, cache type): locality 3 keeps the line in every level.
void prefetch_into_all_levels(llvm::Module& m) {
  for (llvm::Function& f : m) {
    if (f.getIntrinsicID() != llvm::Intrinsic::prefetch) continue;
    for (llvm::User* u : f.users())
      if (auto* call = llvm::dyn_cast<llvm::CallInst>(u))
        call->setArgOperand(2, llvm::ConstantInt::get(call->getArgOperand(2)->getType(), 3));
  }
}

}  // namespace

std::vector<char> compile_module_to_object(const Halide::Module& m) {
  llvm::LLVMContext ctx;
  std::unique_ptr<llvm::Module> ir = Halide::compile_module_to_llvm_module(m, ctx);
  prefetch_into_all_levels(*ir);
  llvm::SmallVector<char, 0> object;
  llvm::raw_svector_ostream out(object);
  Halide::compile_llvm_module_to_object(*ir, out);
  return std::vector<char>(object.begin(), object.end());
}

}  // namespace optfuse::jit
