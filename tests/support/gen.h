#pragma once
// Deterministic, integer-only input generator shared with tests/golden/make_golden.py:
// gen(seed, i) is a float32-exact value in [-1, 1), identical in Python and C++.
#include <cstdint>

namespace optfuse::testing {

inline double gen(uint32_t seed, uint64_t i) {
  uint32_t x = static_cast<uint32_t>(i * 2654435761ull + uint64_t(seed) * 40503ull + 12345ull);
  x ^= x >> 16;
  x = static_cast<uint32_t>(uint64_t(x) * 0x45D9F3Bull);
  x ^= x >> 16;
  return double(x & 0xFFFFFFu) / 8388608.0 - 1.0;
}

}  // namespace optfuse::testing
