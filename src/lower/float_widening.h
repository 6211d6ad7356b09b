#pragma once
// Halide's widening_add / _sub / _mul of floats as the casts they stand for (internal; includes
// Halide.h). Halide matches f32(a) + f32(b) of 16-bit floats as widening_add(a, b) and lowers
// that with its own emulation; the 16-bit conversion passes (f16c.h, bf16.h) only see casts.
// For f32 -> f64 widening the expansion is what Halide lowers it to anyway.
#include <Halide.h>

namespace optfuse::lower {

// The casts and the operation `op` stands for if it is such a widening of floats, else
// undefined.
inline Halide::Expr expand_float_widening(const Halide::Internal::Call* op) {
  using Halide::Internal::Call;
  const bool widening = op->is_intrinsic(Call::widening_add) ||
                        op->is_intrinsic(Call::widening_sub) ||
                        op->is_intrinsic(Call::widening_mul);
  if (!widening || !op->args[0].type().is_float()) return Halide::Expr();
  return Halide::Internal::lower_intrinsic(op);
}

}  // namespace optfuse::lower
