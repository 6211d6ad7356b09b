// The unmastered bf16 AdamW loop written by hand with AVX2 intrinsics, in the two lane orders
// src/lower/even_odd.h chooses between, to see what its instructions cost on a CPU without the
// JIT in the way (bench/README.md, "Hand-written loops"). One thread, 16K elements (in cache).
//
//   cc -O3 -mavx2 -mfma bench/micro/bf16_loop.c -o /tmp/bf16_loop && /tmp/bf16_loop
//
// Variants: memory order (vpmovzxwd + vpslld to widen, vpsrld + vpackusdw + vpermq to narrow,
// as the kernels did before), even/odd order (a shift or a mask of 32-bit words, one blend per
// store), each with the exact square root and divide torch's bits need and with refined
// estimates in their place (vrsqrtps / vrcpps and a Newton step: not torch's bits; only to see
// what the divider costs). The f32 arithmetic is AdamW's, simplified (no bias correction).
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

enum { N = 16384 };
static uint16_t P[N], G[N], M[N], V[N];
static const float b1 = 0.9f, b2 = 0.999f, decay = 1 - 1e-5f, step = 1e-3f, eps = 1e-8f;

static __m256 sqrt_exact(__m256 x) { return _mm256_sqrt_ps(x); }
static __m256 div_exact(__m256 a, __m256 b) { return _mm256_div_ps(a, b); }
static __m256 sqrt_estimate(__m256 x) {
  __m256 r = _mm256_rsqrt_ps(x);
  __m256 xrr = _mm256_mul_ps(_mm256_mul_ps(x, r), r);
  r = _mm256_mul_ps(r, _mm256_fnmadd_ps(xrr, _mm256_set1_ps(0.5f), _mm256_set1_ps(1.5f)));
  return _mm256_mul_ps(x, r);
}
static __m256 div_estimate(__m256 a, __m256 b) {
  __m256 r = _mm256_rcp_ps(b);
  r = _mm256_mul_ps(r, _mm256_fnmadd_ps(b, r, _mm256_set1_ps(2.0f)));
  return _mm256_mul_ps(a, r);
}

// p, m, v updated in place on f32 lanes. A macro, so that each loop below has its square root and
// divide inlined.
#define ADAMW(p, g, m, v, SQRT, DIV)                                       \
  do {                                                                     \
    m = _mm256_fmadd_ps(_mm256_set1_ps(1 - b1), _mm256_sub_ps(g, m), m);   \
    v = _mm256_fmadd_ps(_mm256_mul_ps(g, _mm256_set1_ps(1 - b2)), g,       \
                        _mm256_mul_ps(v, _mm256_set1_ps(b2)));             \
    __m256 denom = _mm256_add_ps(SQRT(v), _mm256_set1_ps(eps));            \
    p = _mm256_sub_ps(_mm256_mul_ps(p, _mm256_set1_ps(decay)),             \
                      DIV(_mm256_mul_ps(_mm256_set1_ps(step), m), denom)); \
  } while (0)

// Round to nearest even, the bf16 left in the high halves (no NaN handling: none occur here).
static inline __m256i rounded(__m256 x) {
  __m256i b = _mm256_castps_si256(x);
  __m256i lowest_kept = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  return _mm256_add_epi32(b, _mm256_add_epi32(lowest_kept, _mm256_set1_epi32(0x7fff)));
}

// Memory order: 8 elements per f32 vector.
static inline __m256 widen(const uint16_t* s) {
  __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)s));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
static inline void narrow(uint16_t* d, __m256 lo, __m256 hi) {
  __m256i packed =
      _mm256_packus_epi32(_mm256_srli_epi32(rounded(lo), 16), _mm256_srli_epi32(rounded(hi), 16));
  _mm256_storeu_si256((__m256i*)d, _mm256_permute4x64_epi64(packed, 0xd8));
}
#define MEMORY_ORDER(name, SQRT, DIV)                                                  \
  static void name(void) {                                                             \
    for (int i = 0; i < N; i += 16) {                                                  \
      __m256 p[2], m[2], v[2];                                                         \
      for (int h = 0; h < 2; ++h) {                                                    \
        const int at = i + 8 * h;                                                      \
        __m256 g = widen(G + at);                                                      \
        p[h] = widen(P + at), m[h] = widen(M + at), v[h] = widen(V + at);              \
        ADAMW(p[h], g, m[h], v[h], SQRT, DIV);                                         \
      }                                                                                \
      narrow(P + i, p[0], p[1]), narrow(M + i, m[0], m[1]), narrow(V + i, v[0], v[1]); \
    }                                                                                  \
  }
MEMORY_ORDER(memory_exact, sqrt_exact, div_exact)
MEMORY_ORDER(memory_estimates, sqrt_estimate, div_estimate)

// Even/odd order: 16 elements as 8 words; even elements in one f32 vector, odd in the other.
static inline void widen_even_odd(const uint16_t* s, __m256* even, __m256* odd) {
  __m256i w = _mm256_loadu_si256((const __m256i*)s);
  *even = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  *odd = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32((int)0xffff0000u)));
}
static inline void narrow_even_odd(uint16_t* d, __m256 even, __m256 odd) {
  __m256i words = _mm256_blend_epi16(_mm256_srli_epi32(rounded(even), 16), rounded(odd), 0xaa);
  _mm256_storeu_si256((__m256i*)d, words);
}
#define EVEN_ODD_ORDER(name, SQRT, DIV)                                         \
  static void name(void) {                                                      \
    for (int i = 0; i < N; i += 16) {                                           \
      __m256 p[2], g[2], m[2], v[2];                                            \
      widen_even_odd(P + i, &p[0], &p[1]), widen_even_odd(G + i, &g[0], &g[1]); \
      widen_even_odd(M + i, &m[0], &m[1]), widen_even_odd(V + i, &v[0], &v[1]); \
      for (int h = 0; h < 2; ++h) ADAMW(p[h], g[h], m[h], v[h], SQRT, DIV);     \
      narrow_even_odd(P + i, p[0], p[1]), narrow_even_odd(M + i, m[0], m[1]);   \
      narrow_even_odd(V + i, v[0], v[1]);                                       \
    }                                                                           \
  }
EVEN_ODD_ORDER(even_odd_exact, sqrt_exact, div_exact)
EVEN_ODD_ORDER(even_odd_estimates, sqrt_estimate, div_estimate)

static void fill(void) {
  for (int i = 0; i < N; ++i) {
    float f = (float)(i % 97) * 0.01f + 0.1f;
    uint32_t u;
    memcpy(&u, &f, 4);
    P[i] = G[i] = M[i] = V[i] = (uint16_t)(u >> 16);
  }
}

// Best of 5 rounds of 4000 calls, ns per element (the state evolves; the values stay normal).
static double ns_per_element(void (*loop)(void)) {
  fill();
  double best = 1e30;
  for (int round = 0; round < 5; ++round) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int r = 0; r < 4000; ++r) loop();
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / 4000.0 / N;
    if (ns < best) best = ns;
  }
  return best;
}

int main(void) {
  printf("ns per element, one thread, %d bf16 elements (params, grads, two moments)\n", N);
  printf("memory order, exact sqrt and divide:    %.3f\n", ns_per_element(memory_exact));
  printf("memory order, estimates:                %.3f\n", ns_per_element(memory_estimates));
  printf("even/odd order, exact sqrt and divide:  %.3f\n", ns_per_element(even_odd_exact));
  printf("even/odd order, estimates:              %.3f\n", ns_per_element(even_odd_estimates));
  return 0;
}
