"""linear_gelu (BERT/ViT intermediate: dense then GELU): gelu(linear(x, weight, bias), approximate).

The GEMM (bias folded in) stays with torch's BLAS, as eager runs it; the GELU runs in place over the GEMM's
output in one vectorized pass (ma_vecmath.h's erf/tanh under `omp simd`, threads for large tensors), so
the [rows, intermediate] activation gets no second allocation (fresh pages cost more than the pass on
large tensors) and the tanh form skips torch's slow tanh path. Each element is computed in float and
rounded once to the tensor's dtype, as torch's gelu does. Served: float32, bfloat16 (operands of x's
dtype), approximate "none" or "tanh"; anything else runs the reference in torch.
"""

SOURCE = r"""
#include <cstdint>
#include <cstring>
#include <omp.h>
#include "ma_vecmath.h"

static inline float bf16_to_f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

// round to nearest even, NaN kept NaN (as torch's conversion)
static inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  const uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return f != f ? (uint16_t)0x7fc0 : (uint16_t)r;
}

// torch's gelu(approximate="tanh") evaluation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
static inline float gelu_tanh_f(float x) {
  const float beta = 0.7978845608028654f, kappa = 0.044715f;
  const float cube = x * x * x;
  const float inner = beta * (x + kappa * cube);
  return 0.5f * x * (1.0f + ma_tanhf(inner));
}

// torch's gelu: x * 0.5 * (1 + erf(x / sqrt(2)))
static inline float gelu_erf_f(float x) { return x * 0.5f * (1.0f + ma_erff(x * 0.70710678118654752f)); }

template <bool TANH>
static void gelu_f32(float* h, int64_t n) {
  const int64_t chunk = 4096, nchunks = (n + chunk - 1) / chunk;
  #pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t b = c * chunk, e = b + chunk < n ? b + chunk : n;
    #pragma omp simd
    for (int64_t i = b; i < e; ++i) h[i] = TANH ? gelu_tanh_f(h[i]) : gelu_erf_f(h[i]);
  }
}

template <bool TANH>
static void gelu_bf16(uint16_t* h, int64_t n) {
  const int64_t chunk = 4096, nchunks = (n + chunk - 1) / chunk;
  #pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t b = c * chunk, e = b + chunk < n ? b + chunk : n;
    #pragma omp simd
    for (int64_t i = b; i < e; ++i) {
      const float v = bf16_to_f32(h[i]);
      h[i] = f32_to_bf16(TANH ? gelu_tanh_f(v) : gelu_erf_f(v));
    }
  }
}

// in place over h[0, n); tanh != 0: the tanh approximation
extern "C" void gelu_inplace_f32(float* h, int64_t n, int tanh) {
  if (tanh) gelu_f32<true>(h, n); else gelu_f32<false>(h, n);
}

extern "C" void gelu_inplace_bf16(uint16_t* h, int64_t n, int tanh) {
  if (tanh) gelu_bf16<true>(h, n); else gelu_bf16<false>(h, n);
}
"""


def linear_gelu(x, weight, bias, approximate):
    h = F.linear(x, weight, bias)
    served = (x.dtype in (torch.float32, torch.bfloat16) and h.dtype == x.dtype and h.numel() > 0
              and h.is_contiguous() and approximate in ("none", "tanh"))
    if not served:
        return F.gelu(h, approximate=approximate)
    if x.dtype == torch.float32:
        lib.gelu_inplace_f32(h, h.numel(), 1 if approximate == "tanh" else 0)
    else:
        lib.gelu_inplace_bf16(h, h.numel(), 1 if approximate == "tanh" else 0)
    return h
