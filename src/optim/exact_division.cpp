#include "optim/exact_division.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>

namespace optfuse::optim {
namespace {

constexpr int64_t kMaxT = 24;                // |X * 2^s - N * C| <= 16 can fail (header)
constexpr int64_t kMaxCandidates = 1 << 14;  // more (c with a short significand): divide

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// The inverse of 2^e modulo an odd m: ((m + 1) / 2)^e mod m.
uint64_t inverse_power_of_two(int e, uint64_t m) {
  const uint64_t half = (m + 1) / 2 % m;
  uint64_t r = 1 % m;
  for (int i = 0; i < e; ++i) r = r * half % m;
  return r;
}

// Whether the form gives x / c for every x = X * 2^-23, X in [2^23, 2^24), with
// |X * 2^s - N * C| <= kMaxT for some odd N and s in {24, 25}: the only x where it can fail.
bool candidates_pass(float c, const ScalarReciprocal& r) {
  int exponent = 0;
  const auto C = static_cast<int64_t>(std::ldexp(std::frexp(c, &exponent), 24));
  int j = 0;  // N * C has exactly j factors of two, so X * 2^s - N * C = T needs them in T too
  while (((C >> j) & 1) == 0) ++j;
  const int64_t odd = C >> j, two_j = int64_t(1) << j;
  int64_t tried = 0;
  for (int s = 24; s <= 25; ++s) {
    const uint64_t inv = inverse_power_of_two(s - j, static_cast<uint64_t>(odd));
    for (int64_t t = -kMaxT; t <= kMaxT; ++t) {
      if (t == 0 || t % two_j != 0 || (t / two_j) % 2 == 0) continue;
      // X * 2^(s - j) = T / 2^j (mod odd), for X from 2^23 on.
      const int64_t rhs = (t / two_j % odd + odd) % odd;
      const auto x0 = static_cast<int64_t>(static_cast<uint64_t>(rhs) * inv % odd);
      int64_t X = x0 + ((int64_t(1) << 23) - x0 + odd - 1) / odd * odd;
      for (; X < (int64_t(1) << 24); X += odd) {
        if (++tried > kMaxCandidates) return false;
        const float x = std::ldexp(static_cast<float>(X), -23), q = x / c;
        if (bits_of(divide_by_fma(x, r)) != bits_of(q) ||
            bits_of(divide_by_f64_sum(x, r)) != bits_of(q))
          return false;
      }
    }
  }
  return true;
}

ScalarReciprocal split_uncached(float c) {
  ScalarReciprocal r;
  if (!(c >= 0x1p-60f && c <= 1.0f)) return r;  // (also NaN)
  const double inv = 1.0 / static_cast<double>(c);
  r.hi = static_cast<float>(inv);
  if (static_cast<double>(r.hi) > inv) r.hi = std::nextafter(r.hi, 0.0f);
  const double rest = inv - static_cast<double>(r.hi);  // exact: hi <= inv < 2 hi
  if (rest == 0) {
    // c a power of two: x * hi is exact, and x * lo (x * 2^-126, under half an ulp of it)
    // cannot move it. (inv == hi for any other c: 1/c within 2^-53 of an f32; divide.)
    int e = 0;
    r.lo = 0x1p-126f;
    r.exact = std::frexp(c, &e) == 0.5f;
    return r;
  }
  // The f32 nearest the rest first, then its neighbours: a different lo moves the few x near a
  // midpoint, and one ulp more error (2^-24 lo) stays inside the candidates' bound.
  const float nearest = static_cast<float>(rest);
  for (float lo : {nearest, std::nextafter(nearest, 1.0f), std::nextafter(nearest, 0.0f)}) {
    r.lo = lo;
    // lo >= 2^-48 keeps x * lo normal down to x = 2^-75: significands in [1, 2) stand for all x.
    if (!(lo >= 0x1p-48f)) continue;
    r.exact = candidates_pass(c, r) && std::isinf(divide_by_fma(INFINITY, r)) &&
              std::isinf(divide_by_f64_sum(INFINITY, r));
    if (r.exact) return r;
  }
  r.lo = nearest;
  return r;
}

}  // namespace

float divide_by_fma(float x, const ScalarReciprocal& r) {
  const float t = x * r.lo;
  return std::fma(x, r.hi, t);
}

float divide_by_f64_sum(float x, const ScalarReciprocal& r) {
  const float t = x * r.lo;
  return static_cast<float>(static_cast<double>(x) * r.hi + static_cast<double>(t));
}

ScalarReciprocal split_reciprocal(float c) {
  // Every tensor of a step divides by the same c: the last one is kept.
  thread_local uint32_t last_c = bits_of(NAN);
  thread_local ScalarReciprocal last;
  if (bits_of(c) != last_c) {
    last = split_uncached(c);
    last_c = bits_of(c);
  }
  return last;
}

}  // namespace optfuse::optim
