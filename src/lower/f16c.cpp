#include "lower/f16c.h"

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Module.h>

#include <string>

#include "lower/float_widening.h"
#include "lower/lane_calls.h"

namespace optfuse::lower {
namespace {

using namespace Halide::Internal;
using Halide::Expr;

class F16cConversions : public IRMutator {
  using IRMutator::visit;

  // Float widening intrinsics as casts, so that the conversions below see them.
  Expr visit(const Call* op) override {
    if (Expr casts = expand_float_widening(op); casts.defined()) return mutate(casts);
    return IRMutator::visit(op);
  }

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

// Halide emits each vector conversion call lane by lane (extractelement, call,
// insertelement). The calls of each vector become ONE whole-vector conversion
// (replace_unary_lane_calls, lane_calls.h), a lone scalar call a scalar one: fpext half ->
// float and fptrunc float -> half, which x86 with F16C selects as vcvtph2ps / vcvtps2ph (round
// to nearest even).
void finish_f16c_pass(llvm::Module& m) {
  for (const char* name : {kF16ToF32, kF32ToF16}) {
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
    replace_unary_lane_calls(m, name, convert);
  }
}

}  // namespace optfuse::lower
