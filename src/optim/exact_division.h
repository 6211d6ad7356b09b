#pragma once
// x / c for a per-step f32 scalar c as ONE multiply-add, where the host has proved it exact.
//
// Why: torch's fused 16-bit Adam divides sqrt(v) by sqrt(1 - beta2^t) in f32, correctly
// rounded. On AVX-512 that divide is half the loop's divider time, and the unmastered bf16 AdamW
// loop reaches 0.85 of its memory ceiling with it, 0.93-0.98 without it (src/lower/README.md).
//
// How (Brisebarre, Muller and Raina, "Accelerating correctly rounded floating-point division
// when the divisor is known in advance", IEEE TC 2004): with hi the f32 below 1/c and lo within
// 1.5 ulp of 1/c - hi (the nearest f32 or a neighbour), fma(x, hi, x * lo) is within
// 1.01 * 2^-45 * (x / c) of x / c, also when its sum is rounded to f64 first. It rounds to the
// correctly rounded quotient unless x / c lies that close to a midpoint between f32 values, and
// for x with significand X in [2^23, 2^24) such a midpoint N * 2^u (N odd) needs
// |X * 2^s - N * C| <= 16, s in {24, 25}, C the significand of c. Those X are
// few (a linear congruence modulo C's odd part, for each small right-hand side), so the host
// tries each, once per divisor, and falls back to the divide where one fails: `exact` says which
// a kernel may use (for 96% of random c in (0.03, 1], checked against all 2^23 significands;
// 98% of torch's default AdamW steps 1 to 20000). Scaling x by a power of two scales everything, so
// the significands cover every finite x >= 2^-75 (x * lo stays normal): square roots of f32 values,
// and 0, inf and NaN, which the form also gets right. That is what the Adam graphs divide.
namespace optfuse::optim {

struct ScalarReciprocal {
  float hi = 0, lo = 0;  // hi + lo ~ 1 / c; lo > 0, so that inf * lo is inf (not NaN)
  bool exact = false;    // fma(x, hi, x * lo) == x / c for every x above, also rounded via f64
};

// For 0 < c <= 1 (the square root of a bias correction); exact is false for any other c, and
// wherever the proof above does not go through (then x / c must be divided).
ScalarReciprocal split_reciprocal(float c);

// The quotient the multiply-add form computes, as a kernel on an FMA CPU does (f32 product,
// f32 FMA), and as a kernel without FMA does (f32(f64(x) * hi + f64(x * lo)): the f64 sum
// rounded twice). Both must equal x / c where `exact` is set.
float divide_by_fma(float x, const ScalarReciprocal& r);
float divide_by_f64_sum(float x, const ScalarReciprocal& r);

}  // namespace optfuse::optim
