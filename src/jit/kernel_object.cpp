#include "jit/kernel_object.h"

#include <Halide.h>
#include <llvm/ADT/SmallVector.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/raw_ostream.h>

#include <vector>

#include "lower/bf16.h"
#include "lower/f16c.h"
#include "lower/fma.h"
#include "lower/load_stage.h"
#include "lower/prefetch.h"

namespace optfuse::jit {

std::vector<char> compile_module_to_object(const Halide::Module& m) {
  llvm::LLVMContext ctx;
  std::unique_ptr<llvm::Module> ir = Halide::compile_module_to_llvm_module(m, ctx);
  // The load stage's buffers (src/lower/load_stage.h: first, while each read is in the block of
  // the write it sees; the bf16 pass splits blocks), then the LLVM-level halves of four lowering
  // passes (src/lower/prefetch.h, src/lower/f16c.h, src/lower/fma.h, src/lower/bf16.h).
  lower::finish_load_stage_pass(*ir);
  lower::finish_prefetch_pass(*ir);
  lower::finish_f16c_pass(*ir);
  lower::finish_fma_pass(*ir);
  lower::finish_bf16_pass(*ir);
  llvm::SmallVector<char, 0> object;
  llvm::raw_svector_ostream out(object);
  Halide::compile_llvm_module_to_object(*ir, out);
  return std::vector<char>(object.begin(), object.end());
}

}  // namespace optfuse::jit
