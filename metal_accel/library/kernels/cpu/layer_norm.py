"""layer_norm (nn.LayerNorm: BERT, GPT-2's ln_1/ln_2/ln_f, ViT): (x - mean) * rstd * weight + bias over the last dim.

Eager's CPU kernel already runs one fused pass per row; this one keeps the row in L1 and computes the moments
with two exact passes (mean, then the sum of squared deviations: eager uses Welford's update, which costs a
division per vector), then writes y = (x - mean) * rstd * weight + bias, with rstd = 1 / sqrt(var + eps) in float
and the biased variance. Not eager's x * rstd + (-mean * rstd): the compiler contracts that into one FMA, which
leaves -mean * rstd's rounding on a constant row where the answer is 0, times 1 / sqrt(eps) (1e-4 at eps 1e-6,
ViT's and ConvNeXt's LayerNorms: the proof rejected the kernel there); x - mean is exactly 0 there. bfloat16 rows are computed in float and rounded
once. Rows are split across threads when the tensor is large. Served: float32 and bfloat16 x with weight and
bias of x's dtype or float32 (the output is x's dtype and contiguous, as eager's); anything else runs
F.layer_norm.
"""

DTYPES = ("float32", "bfloat16")  # float16 runs the reference in torch: no CPU kernel for it

SOURCE = r"""
#include <cmath>
#include <cstdint>
#include <cstring>
#include <omp.h>
#include "ma_bf16.h"


// The mean sums x * 2^-32 (exact: a power of two) and scales back, so no partial sum overflows where the mean does
// not. Rows over 2^48 in magnitude (no real activation), whose squared deviations could overflow float, take
// ln_row_huge: double statistics, float64's answer where eager's float32 variance overflows.
static const float BIG = 281474976710656.0f;  // 2^48
static const float SUM_SCALE = 2.3283064365386963e-10f, SUM_UNSCALE = 4294967296.0f;  // 2^-32, 2^32

static inline float ld(const float* p, int i) { return p[i]; }
static inline float ld(const uint16_t* p, int i) { return bf16_to_f32(p[i]); }
static inline void st(float* p, int i, float v) { p[i] = v; }
static inline void st(uint16_t* p, int i, float v) { p[i] = f32_to_bf16(v); }

// A row over 2^48 in magnitude (no real activation; eager's float32 variance overflows to NaN there): its
// statistics in double, exact for a constant row, so the output is float64's answer (a constant row gives the bias;
// a float mean's rounding would normalize a one-ulp error to +-1).
template <typename X, typename W>
static inline void ln_row_huge(const X* x, const W* w, const W* b, X* y, int dim, float eps) {
  double s = 0.0;
  for (int i = 0; i < dim; ++i) s += ld(x, i);
  const double mean = s / dim;
  double q = 0.0;
  for (int i = 0; i < dim; ++i) {
    const double d = ld(x, i) - mean;
    q += d * d;
  }
  const double rstd = 1.0 / std::sqrt(q / dim + eps);
  for (int i = 0; i < dim; ++i) st(y, i, (float)((ld(x, i) - mean) * rstd * ld(w, i) + ld(b, i)));
}

// one row: x of X (float or bfloat16), weight and bias of W, y of X
template <typename X, typename W>
static inline void ln_row(const X* x, const W* w, const W* b, X* y, int dim, float eps) {
  float s = 0.0f, amax = 0.0f;
  #pragma omp simd reduction(+ : s) reduction(max : amax)
  for (int i = 0; i < dim; ++i) {
    s += ld(x, i) * SUM_SCALE;
    const float a = std::fabs(ld(x, i));
    amax = a > amax ? a : amax;
  }
  if (amax > BIG) {
    ln_row_huge(x, w, b, y, dim, eps);
    return;
  }
  const float mean = s / (float)dim * SUM_UNSCALE;
  float q = 0.0f;
  #pragma omp simd reduction(+ : q)
  for (int i = 0; i < dim; ++i) {
    const float d = ld(x, i) - mean;
    q += d * d;
  }
  const float rstd = 1.0f / std::sqrt(q / (float)dim + eps);
  #pragma omp simd
  for (int i = 0; i < dim; ++i) st(y, i, (ld(x, i) - mean) * rstd * ld(w, i) + ld(b, i));
}

template <typename X, typename W>
static void ln_rows(const X* x, const W* w, const W* b, X* y, int64_t rows, int dim, float eps) {
  #pragma omp parallel for schedule(static) if (rows * (int64_t)dim > 65536)
  for (int64_t r = 0; r < rows; ++r) ln_row(x + r * dim, w, b, y + r * dim, dim, eps);
}

extern "C" void layer_norm_f32(const float* x, const float* w, const float* b, float* y, int64_t rows, int dim,
                               float eps) {
  ln_rows(x, w, b, y, rows, dim, eps);
}

extern "C" void layer_norm_bf16(const uint16_t* x, const uint16_t* w, const uint16_t* b, uint16_t* y, int64_t rows,
                                int dim, float eps) {
  ln_rows(x, w, b, y, rows, dim, eps);
}

extern "C" void layer_norm_bf16_wf32(const uint16_t* x, const float* w, const float* b, uint16_t* y, int64_t rows,
                                     int dim, float eps) {
  ln_rows(x, w, b, y, rows, dim, eps);
}
"""


def layer_norm(x, weight, bias, eps):
    dim = x.shape[-1]
    served = (x.dtype in (torch.float32, torch.bfloat16) and weight.dtype == bias.dtype
              and weight.dtype in (x.dtype, torch.float32) and tuple(weight.shape) == (dim,)
              and tuple(bias.shape) == (dim,) and x.numel() > 0 and x.device == weight.device == bias.device)
    if not served:
        return F.layer_norm(x, (weight.shape[0],), weight, bias, eps)
    xc = x.contiguous()
    w, b = weight.contiguous(), bias.contiguous()
    out = torch.empty(tuple(x.shape), dtype=x.dtype, device=x.device)  # eager's output is contiguous
    rows = x.numel() // dim
    if x.dtype == torch.float32:
        lib.layer_norm_f32(xc, w, b, out, rows, dim, float(eps))
    elif w.dtype == torch.bfloat16:
        lib.layer_norm_bf16(xc, w, b, out, rows, dim, float(eps))
    else:
        lib.layer_norm_bf16_wf32(xc, w, b, out, rows, dim, float(eps))
    return out
