// bfloat16 <-> float for CPU kernels that hold bfloat16 as uint16_t (metal_accel/include, on every CPU kernel's
// include path). The conversion to bfloat16 rounds to nearest even and keeps NaN a NaN, as torch's does.
#pragma once
#include <cstdint>
#include <cstring>

static inline float bf16_to_f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  const uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return f != f ? (uint16_t)0x7fc0 : (uint16_t)r;
}
