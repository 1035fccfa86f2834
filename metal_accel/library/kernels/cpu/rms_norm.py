"""rms_norm (HF Llama/Qwen2/Mistral RMSNorm): weight * (x * rsqrt(mean(x^2) + eps)) in one pass per row.

Eager runs six ops (to, pow, mean, add, rsqrt, two muls), each a pass over memory with a temporary;
here each row is read from memory once (sum of squares, then the scale from L1) and written once,
vectorized with `omp simd`, rows split across threads when the tensor is large. Rounding follows the
reference: the row's inverse RMS is 1/sqrt rounded to float, x * inv is rounded (to bfloat16 for
bfloat16 inputs) before the weight multiply. Served: float32 and bfloat16 x with a float32 or
bfloat16 weight of the row's size (result dtype as eager's promotion); anything else runs the
reference in torch.
"""

DTYPES = ("float32", "bfloat16")  # float16 runs the reference in torch: no CPU kernel for it

SOURCE = r"""
#include <cmath>
#include <cstdint>
#include <cstring>
#include <omp.h>
#include "ma_bf16.h"


static inline float inv_rms(float ss, int dim, float eps) { return 1.0f / std::sqrt(ss / (float)dim + eps); }

// GCC/Clang vector extension: 16 floats (one AVX-512 register; two or four on narrower SIMD)
typedef float v16 __attribute__((vector_size(64), aligned(4), may_alias));

static inline float hsum(v16 v) {
  float t[16];
  memcpy(t, &v, sizeof t);
  for (int w = 8; w > 0; w >>= 1)
    for (int i = 0; i < w; ++i) t[i] += t[i + w];
  return t[0];
}

// sum of squares with four independent accumulators (one would wait on the add latency)
static inline float sum_squares(const float* x, int n) {
  v16 a0 = {}, a1 = {}, a2 = {}, a3 = {};
  int i = 0;
  for (; i + 64 <= n; i += 64) {
    const v16 x0 = *(const v16*)(x + i), x1 = *(const v16*)(x + i + 16);
    const v16 x2 = *(const v16*)(x + i + 32), x3 = *(const v16*)(x + i + 48);
    a0 += x0 * x0; a1 += x1 * x1; a2 += x2 * x2; a3 += x3 * x3;
  }
  for (; i + 16 <= n; i += 16) {
    const v16 x0 = *(const v16*)(x + i);
    a0 += x0 * x0;
  }
  float ss = hsum((a0 + a1) + (a2 + a3));
  for (; i < n; ++i) ss += x[i] * x[i];
  return ss;
}

extern "C" void rms_norm_f32(const float* x, const float* w, float* out, int64_t rows, int dim, float eps) {
  #pragma omp parallel for schedule(static) if (rows * (int64_t)dim > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* o = out + r * dim;
    const float inv = inv_rms(sum_squares(xr, dim), dim, eps);
    #pragma omp simd
    for (int i = 0; i < dim; ++i) {
      const float t = xr[i] * inv;
      o[i] = w[i] * t;
    }
  }
}

// bfloat16 x; weight bfloat16 (w16, out bfloat16) or float32 (w32, out32 float32): one of each pair is null
static void rms_norm_bf16_any(const uint16_t* x, const uint16_t* w16, const float* w32, uint16_t* out16,
                              float* out32, int64_t rows, int dim, float eps) {
  #pragma omp parallel for schedule(static) if (rows * (int64_t)dim > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* xr = x + r * dim;
    float ss = 0.0f;
    #pragma omp simd reduction(+ : ss)
    for (int i = 0; i < dim; ++i) {
      const float v = bf16_to_f32(xr[i]);
      ss += v * v;
    }
    const float inv = inv_rms(ss, dim, eps);
    if (w16 != nullptr) {
      uint16_t* o = out16 + r * dim;
      #pragma omp simd
      for (int i = 0; i < dim; ++i) {
        const float t = bf16_to_f32(f32_to_bf16(bf16_to_f32(xr[i]) * inv));
        o[i] = f32_to_bf16(bf16_to_f32(w16[i]) * t);
      }
    } else {
      float* o = out32 + r * dim;
      #pragma omp simd
      for (int i = 0; i < dim; ++i) {
        const float t = bf16_to_f32(f32_to_bf16(bf16_to_f32(xr[i]) * inv));
        o[i] = w32[i] * t;
      }
    }
  }
}

extern "C" void rms_norm_bf16(const uint16_t* x, const uint16_t* w, uint16_t* out, int64_t rows, int dim, float eps) {
  rms_norm_bf16_any(x, w, nullptr, out, nullptr, rows, dim, eps);
}

extern "C" void rms_norm_bf16_wf32(const uint16_t* x, const float* w, float* out, int64_t rows, int dim, float eps) {
  rms_norm_bf16_any(x, nullptr, w, nullptr, out, rows, dim, eps);
}
"""


def rms_norm(x, weight, eps):
    dim = x.shape[-1]
    served = (x.dtype in (torch.float32, torch.bfloat16) and weight.dtype in (torch.float32, torch.bfloat16)
              and tuple(weight.shape) == (dim,) and x.numel() > 0 and x.device == weight.device
              and not (x.dtype == torch.float32 and weight.dtype == torch.bfloat16))
    if not served:
        h = x.to(torch.float32)
        h = h * ((h * h).mean(-1, keepdim=True) + eps).rsqrt()
        return weight * h.to(x.dtype)
    w = weight.contiguous()
    rows = x.numel() // dim
    # eager's output takes x's layout (a permuted x gives a permuted result): same allocation here
    out = torch.empty_like(x, dtype=weight.dtype if x.dtype == torch.bfloat16 else x.dtype)
    dst = out if out.is_contiguous() else torch.empty(tuple(x.shape), dtype=out.dtype, device=x.device)
    x = x.contiguous()
    if x.dtype == torch.float32:
        lib.rms_norm_f32(x, w, dst, rows, dim, float(eps))
    elif w.dtype == torch.bfloat16:
        lib.rms_norm_bf16(x, w, dst, rows, dim, float(eps))
    else:
        lib.rms_norm_bf16_wf32(x, w, dst, rows, dim, float(eps))
    if dst is not out:
        out.copy_(dst)
    return out
