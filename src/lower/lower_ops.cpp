// Per-op lowering. The switch below has no default: -Wswitch flags an op added to ops.def and not
// lowered here.
//
// Halide compiles float code with fast-math flags (no NaNs, no infinities, no signed zeros) unless
// the target has strict_float, so LLVM may fold away `x != x` or `x == inf`. Every NaN/inf test
// here therefore looks at the bits (integer compares, which fast-math cannot touch).
#include "lower/lower_ops.h"

#include <cctype>
#include <string>

#include "lower/lower.h"
#include "optfuse/error.h"

namespace optfuse::lower {
namespace {

using Halide::Expr;

bool is_narrow_float(const Halide::Type& t) { return t.is_float() && t.bits() == 16; }

Expr widen(const Expr& e) {
  return is_narrow_float(e.type()) ? Halide::cast(Halide::Float(32), e) : e;
}

Expr bits_of(const Expr& x) { return Halide::reinterpret(Halide::UInt(x.type().bits()), x); }

// |x| > +inf as integers: the NaN encodings.
Expr is_nan_bits(const Expr& x) {
  int b = x.type().bits();
  uint64_t sign = uint64_t(1) << (b - 1);
  uint64_t inf = b == 64 ? 0x7ff0000000000000ull : 0x7f800000ull;
  Halide::Type u = Halide::UInt(b);
  return (bits_of(x) & Halide::Internal::make_const(u, ~sign)) >
         Halide::Internal::make_const(u, inf);
}

Expr is_pos_inf_f32(const Expr& x) {
  return bits_of(x) == Halide::Internal::make_const(Halide::UInt(32), 0x7f800000u);
}

// sign(x): 1, -1, or x itself for zeros and NaN.
Expr sign_of(const Expr& x) {
  Halide::Type t = x.type();
  return Halide::select(
      x > Halide::Internal::make_zero(t), Halide::Internal::make_one(t),
      Halide::select(x < Halide::Internal::make_zero(t), Halide::Internal::make_const(t, -1), x));
}

Expr lower_f32_or_wider(Op op, const std::vector<Expr>& a, Precision p) {
  bool fast = p == Precision::Fast && a[0].type() == Halide::Float(32);
  switch (op) {
    case Op::Add:
      return a[0] + a[1];
    case Op::Sub:
      return a[0] - a[1];
    case Op::Mul:
      return a[0] * a[1];
    case Op::Div:
      return a[0] / a[1];  // exact: see Sqrt
    case Op::Min:
      return nan_min_max(true, a[0], a[1]);
    case Op::Max:
      return nan_min_max(false, a[0], a[1]);
    case Op::Pow:
      return Halide::pow(a[0], a[1]);
    case Op::Neg:
      return -a[0];
    case Op::Abs:
      return Halide::abs(a[0]);
    case Op::Sign:
      return sign_of(a[0]);
    case Op::Sqrt:
      // Exact (vsqrtps). Measured on AVX-512, AdamW at 2^24 and 2^26 elements, 2 threads: exact
      // sqrt + exact divide 0.91-0.93 of the 4-read-3-write ceiling; any estimate refined and
      // guarded for zeros, infinities and subnormals adds instructions and lands at 0.83-0.88
      // (src/lower/README.md). Only rsqrt, which would need a divide, keeps the fast path.
      return Halide::sqrt(a[0]);
    case Op::Rsqrt:
      return fast ? fast_rsqrt_f32(a[0])
                  : Halide::Internal::make_one(a[0].type()) / Halide::sqrt(a[0]);
    case Op::Exp:
      return Halide::exp(a[0]);
    case Op::Log:
      return Halide::log(a[0]);
    case Op::Lt:
      return a[0] < a[1];
    case Op::Le:
      return a[0] <= a[1];
    case Op::Gt:
      return a[0] > a[1];
    case Op::Ge:
      return a[0] >= a[1];
    case Op::Eq:
      return a[0] == a[1];
    case Op::Ne:
      return a[0] != a[1];
    case Op::Select:
      return Halide::select(a[0], a[1], a[2]);
    case Op::IsFinite: {
      // Exponent bits not all ones: integer compares, which fast-math cannot fold away.
      int b = a[0].type().bits();
      uint64_t sign = uint64_t(1) << (b - 1);
      uint64_t inf = b == 64 ? 0x7ff0000000000000ull : 0x7f800000ull;
      Halide::Type u = Halide::UInt(b);
      return (bits_of(a[0]) & Halide::Internal::make_const(u, ~sign)) <
             Halide::Internal::make_const(u, inf);
    }
    case Op::Cast:
      return a[0];  // the caller converts to the result dtype
    case Op::Strict:
      // Halide then compiles the module with per-instruction fast-math flags, and this operand's
      // ops without them, so LLVM fuses no multiply-add across it.
      return Halide::strict_float(a[0]);
    case Op::RoundSR:
      internal_error("lower_op: round_sr needs the element index (round_sr_bf16)");
    case Op::Opaque:
      break;  // never lowered: lower.cpp refuses graphs with opaque ops first
    // Reductions are stages of their own (reduce.cpp), never per-element expressions.
    case Op::ReduceSum:
    case Op::ReduceMean:
    case Op::ReduceMax:
    case Op::ReduceMin:
    case Op::RowSum:
    case Op::RowMean:
    case Op::RowMax:
    case Op::RowMin:
    case Op::ColSum:
    case Op::ColMean:
    case Op::ColMax:
    case Op::ColMin:
    case Op::Input:
    case Op::Scalar:
    case Op::Const:
      break;
  }
  internal_error("lower_op: " + std::string(op_name(op)) + " is not an operation");
}

}  // namespace

// x86 min/max instructions return the second operand when either is NaN; a + b is NaN then.
Expr nan_min_max(bool is_min, const Expr& a, const Expr& b) {
  Expr m = is_min ? Halide::min(a, b) : Halide::max(a, b);
  return Halide::select(is_nan_bits(a) || is_nan_bits(b), a + b, m);
}

Expr constant(double v, DType t) {
  if (t == DType::Bool) return Halide::Internal::make_bool(v != 0);
  return Halide::Internal::make_const(halide_type(t), v);
}

Expr lower_op(Op op, DType t, const std::vector<Expr>& args, Precision p) {
  std::vector<Expr> wide;
  wide.reserve(args.size());
  for (const Expr& e : args) wide.push_back(widen(e));
  // 16-bit results round an exact f32 result once (see lower_ops.h); only f32 results take the
  // bounded-error fast paths.
  Expr r = lower_f32_or_wider(op, wide, t == DType::F32 ? p : Precision::Exact);
  Halide::Type want = halide_type(t);
  return r.type() == want ? r : Halide::cast(want, r);
}

Expr round_sr_bf16(const Expr& x, const Expr& key, const Expr& index) {
  using Halide::UInt;
  auto u32 = [](uint32_t v) { return Halide::Internal::make_const(UInt(32), v); };
  Expr k = Halide::cast(UInt(32), Halide::cast(UInt(64), key));  // as the interpreter: mod 2^32
  Expr h = (Halide::cast(UInt(32), index) * u32(0x9e3779b9u)) ^ k;
  h = h ^ (h >> 16);
  h = h * u32(0x85ebca6bu);
  h = h ^ (h >> 13);
  h = h * u32(0xc2b2ae35u);
  h = h ^ (h >> 16);
  Expr f = widen(x);
  Expr up = (bits_of(f) + (h >> 16)) & u32(0xffff0000u);
  Expr rounded = Halide::reinterpret(Halide::Float(32), up);  // exact in bf16: low bits are 0
  // A NaN's bits plus a carry could turn into an infinity or change sign: NaN rounds as NaN.
  return Halide::cast(Halide::BFloat(16), Halide::select(is_nan_bits(f), f, rounded));
}

// The hardware estimate treats subnormal inputs as zero, so those are scaled by an exact power of
// two first and the result scaled back exactly: rsqrt(x) = rsqrt(x * 2^24) * 2^12.
// Halide compiles with reassociation allowed, so x*r*r may become x*(r*r): after scaling, r*r
// stays below 2^126 (no overflow); for x >= 2^126, r*r is subnormal and loses up to 2 bits of the
// Newton correction, within the measured bound. Also scaling huge x into range cost ~25% more per
// element at cache-resident sizes (measured), for no measurable accuracy gain.
struct Scaled {
  Expr x;            // x, or x * 2^24 if subnormal
  Expr rsqrt_scale;  // 1, or 2^12
};

Scaled scale_subnormals(const Expr& x) {
  Expr subnormal = x < 0x1p-126f;  // negatives too: harmless, they give NaN either way
  return {x * Halide::select(subnormal, 0x1p24f, 1.0f), Halide::select(subnormal, 0x1p12f, 1.0f)};
}

// 1/sqrt(x) = r * (1.5 - 0.5*x*r*r); rsqrt(+-0) = +-inf (the sign bit or'ed onto inf's bits),
// rsqrt(+inf) = 0.
Expr fast_rsqrt_f32(const Expr& x) {
  Scaled sc = scale_subnormals(x);
  Expr r = Halide::fast_inverse_sqrt(sc.x);
  Expr refined = r * (1.5f - 0.5f * (sc.x * r) * r) * sc.rsqrt_scale;
  Expr signed_inf = Halide::reinterpret(
      Halide::Float(32), bits_of(x) | Halide::Internal::make_const(Halide::UInt(32), 0x7f800000u));
  return Halide::select(x == 0.0f, signed_inf, Halide::select(is_pos_inf_f32(x), 0.0f, refined));
}

std::string identifier(const char* prefix, size_t index, const std::string& name) {
  std::string id = std::string(prefix) + std::to_string(index) + "_";
  for (char c : name) id += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return id;
}

Halide::Expr element(const Halide::FuncRef& ref, int index, size_t count) {
  return count == 1 ? Halide::Expr(ref) : Halide::Expr(ref[index]);
}

void define(Halide::Func& f, const std::vector<Halide::Var>& vars,
            const std::vector<Halide::Expr>& values) {
  if (values.size() == 1)
    f(vars) = values[0];
  else
    f(vars) = Halide::Tuple(values);
}

}  // namespace optfuse::lower
