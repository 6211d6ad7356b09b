#include "lower/f16c.h"

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

}  // namespace optfuse::lower
