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
    Expr is_nan = (bits & 0x7fffffff) > 0x7f800000;
    if (lanes == 1 || !pack_high_halves_) {
      Expr nearest_even = (bits + (0x7fff + ((bits >> 16) & 1))) >> 16;
      Expr quiet_nan = (bits >> 16) | 0x40;  // a NaN plus the carry could become an infinity
      return reinterpret(to, cast(u16, select(is_nan, quiet_nan, nearest_even)));
    }
    // The same values, computed in the high halves of the 32-bit lanes and packed by ONE shuffle
    // of the 16-bit halves (vpermt2w) instead of a shift and a narrowing (vpsrld,
    // vpmovdw) per 16 lanes and an insert per 32; the rounding bias as a select on the lowest
    // kept bit (vptestmd and a masked add) instead of extracting it (vpsrld, vpandd, vpaddd).
    // The low halves are dropped: bits | 0x400000 has the quiet NaN's high half.
    Expr odd = (bits & 0x10000) != 0;
    Expr rounded = select(is_nan, bits | 0x400000, select(odd, bits + 0x8000, bits + 0x7fff));
    Expr halves = reinterpret(Halide::UInt(16, 2 * lanes), rounded);
    return reinterpret(to, Shuffle::make_slice(halves, 1, 2, lanes));
  }

 public:
  explicit Bf16Conversions(bool pack_high_halves) : pack_high_halves_(pack_high_halves) {}

 private:
  bool pack_high_halves_;
};

}  // namespace

void add_bf16_pass(Halide::Pipeline& p, const Halide::Target& target) {
  // Every target: on CUDA it is also what makes bf16 stores compile at all. The packing shuffle
  // only on x86 CPUs with AVX-512BW (vpermt2w): on AVX2 LLVM builds it from several shuffles,
  // and the 4-read-3-write bf16 ceiling kernel took twice as long as with vpsrld / vpmovdw-style
  // narrowing (2^14 elements, in cache).
  using T = Halide::Target;
  const bool avx512bw = target.has_feature(T::AVX512_Skylake) ||
                        target.has_feature(T::AVX512_Cannonlake) ||
                        target.has_feature(T::AVX512_SapphireRapids);
  const bool pack = target.arch == T::X86 && !target.has_gpu_feature() && avx512bw;
  p.add_custom_lowering_pass(new Bf16Conversions(pack));
}

}  // namespace optfuse::lower
