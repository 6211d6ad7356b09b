#include "graph/eval.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "optfuse/error.h"

namespace optfuse::graph_detail {
namespace {

// A binary floating-point format with `mantissa_bits` explicit fraction bits and normal exponents
// in [min_exp, max_exp].
struct FloatFormat {
  int mantissa_bits, min_exp, max_exp;
};

constexpr FloatFormat kF32{23, -126, 127};
constexpr FloatFormat kF16{10, -14, 15};
constexpr FloatFormat kBF16{7, -126, 127};

// Rounds directly from double (not via float: double rounding would be wrong for f16/bf16 ties).
double round_to_format(double x, FloatFormat f) {
  if (!std::isfinite(x) || x == 0) return x;
  int e;
  std::frexp(x, &e);  // |x| = m * 2^e with m in [0.5, 1): the leading bit has weight 2^(e-1)
  int lead = std::max(e - 1, f.min_exp);  // below min_exp the spacing stays fixed (subnormals)
  double quantum = std::ldexp(1.0, lead - f.mantissa_bits);
  double rounded = std::nearbyint(x / quantum) * quantum;  // default rounding mode: to even
  double max_finite = std::ldexp(2.0 - std::ldexp(1.0, -f.mantissa_bits), f.max_exp);
  if (std::fabs(rounded) > max_finite) return std::copysign(HUGE_VAL, x);
  return rounded;
}

double sign_of(double x) {
  if (std::isnan(x)) return x;
  return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0;
}

}  // namespace

double round_to_dtype(double x, DType t) {
  if (std::isnan(x))
    return t == DType::Bool ? 1.0 : t == DType::U8 ? 0.0 : std::numeric_limits<double>::quiet_NaN();
  switch (t) {
    case DType::F64:
      return x;
    case DType::F32:
      return round_to_format(x, kF32);
    case DType::F16:
      return round_to_format(x, kF16);
    case DType::BF16:
      return round_to_format(x, kBF16);
    case DType::Bool:
      return x != 0 ? 1.0 : 0.0;
    case DType::U8:  // truncation, as the kernels' float -> integer conversion
      return std::clamp(std::trunc(x), 0.0, 255.0);
  }
  internal_error("round_to_dtype: bad dtype");
}

double eval_op(Op op, DType t, const double* a) {
  switch (op) {
    case Op::Add:
      return a[0] + a[1];
    case Op::Sub:
      return a[0] - a[1];
    case Op::Mul:
      return a[0] * a[1];
    case Op::Div:
      return a[0] / a[1];
    // NaN-propagating, like torch.minimum/maximum (std::fmin would drop the NaN).
    case Op::Min:
      return std::isnan(a[0]) || std::isnan(a[1]) ? NAN : std::min(a[0], a[1]);
    case Op::Max:
      return std::isnan(a[0]) || std::isnan(a[1]) ? NAN : std::max(a[0], a[1]);
    case Op::Pow:
      return std::pow(a[0], a[1]);
    case Op::Neg:
      return -a[0];
    case Op::Abs:
      return std::fabs(a[0]);
    case Op::Sign:
      return sign_of(a[0]);
    case Op::Sqrt:
      return std::sqrt(a[0]);
    case Op::Rsqrt:
      return 1.0 / std::sqrt(a[0]);
    case Op::Exp:
      return std::exp(a[0]);
    case Op::Log:
      return std::log(a[0]);
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
      return a[0] != 0 ? a[1] : a[2];
    case Op::IsFinite:
      return std::isfinite(a[0]) ? 1.0 : 0.0;
    case Op::Cast:
      return round_to_dtype(a[0], t);
    case Op::Strict:
      return a[0];
    case Op::RoundSR:
      internal_error("eval_op: round_sr depends on the element index (use round_sr())");
    case Op::Opaque:
      return a[0];  // stands in for the external computation (graph.h)
    // Reductions are not element-wise: interpret.cpp evaluates them (reduce()).
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
  internal_error("eval_op: " + std::string(op_name(op)) + " is not an element-wise operation");
}

double reduce(Op op, const double* v, size_t count, size_t stride) {
  bool is_max = op == Op::ReduceMax || op == Op::RowMax || op == Op::ColMax;
  bool is_min = op == Op::ReduceMin || op == Op::RowMin || op == Op::ColMin;
  double acc = is_max ? -HUGE_VAL : is_min ? HUGE_VAL : 0.0;
  for (size_t i = 0; i < count; ++i) {
    if (is_max || is_min) {
      const double args[2] = {acc, v[i * stride]};
      acc = eval_op(is_max ? Op::Max : Op::Min, DType::F64, args);  // NaN-propagating
    } else {
      acc += v[i * stride];
    }
  }
  if (op == Op::ReduceMean || op == Op::RowMean || op == Op::ColMean)
    acc /= static_cast<double>(count);
  return acc;
}

uint32_t round_sr_bits(uint32_t key, uint32_t index) {
  uint32_t h = (index * 0x9e3779b9u) ^ key;
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h >> 16;
}

double round_sr(double x, uint32_t key, uint32_t index) {
  float f = static_cast<float>(round_to_dtype(x, DType::F32));
  if (std::isnan(f)) return round_to_dtype(f, DType::BF16);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits = (bits + round_sr_bits(key, index)) & 0xffff0000u;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace optfuse::graph_detail
