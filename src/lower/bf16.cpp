#include "lower/bf16.h"

namespace optfuse::lower {
namespace {

using namespace Halide::Internal;
using Halide::Expr;

class Bf16Conversions : public IRMutator {
  using IRMutator::visit;

  Expr visit(const Cast* op) override {
    Expr value = mutate(op->value);
    const Halide::Type to = op->type;
    const int lanes = to.lanes();
    const Halide::Type f32 = Halide::Float(32, lanes), u32 = Halide::UInt(32, lanes),
                       u16 = Halide::UInt(16, lanes);
    const bool from_bf16 = value.type().is_bfloat(), to_bf16 = to.is_bfloat();
    if (!from_bf16 && !to_bf16) return value.same_as(op->value) ? Expr(op) : Cast::make(to, value);
    if (from_bf16) {  // exact: the bf16 bits are the high half of the f32
      value = reinterpret(f32, cast(u32, reinterpret(u16, value)) << 16);
      if (!to_bf16) return to == f32 ? value : Cast::make(to, value);
    }
    if (value.type() != f32) value = Cast::make(f32, value);  // as Halide: other types via f32
    Expr bits = reinterpret(u32, value);
    Expr nearest_even = (bits + (0x7fff + ((bits >> 16) & 1))) >> 16;
    Expr quiet_nan = (bits >> 16) | 0x40;  // a NaN plus the carry could become an infinity
    Expr is_nan = (bits & 0x7fffffff) > 0x7f800000;
    return reinterpret(to, cast(u16, select(is_nan, quiet_nan, nearest_even)));
  }
};

}  // namespace

void add_bf16_pass(Halide::Pipeline& p, const Halide::Target& target) {
  (void)target;  // every target: on CUDA it is also what makes bf16 stores compile at all
  p.add_custom_lowering_pass(new Bf16Conversions);
}

}  // namespace optfuse::lower
