#pragma once
// An f32's bits and back, for tests that build values bit by bit.
#include <cstdint>
#include <cstring>

namespace optfuse::testing {

inline float f32_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

}  // namespace optfuse::testing
