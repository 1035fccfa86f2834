"""linear_add_layer_norm (BERT/RoBERTa SelfOutput and Output): LayerNorm(dense(x) + residual), dropout off.

The GEMM with its bias stays with torch's BLAS (F.linear, as eager runs it). Eager then adds the residual (a
pass that reads two tensors and writes a third) and normalizes (another read and write); here one kernel does
both in place over the GEMM's output, row by row in L1: the sum rounded to x's dtype (as eager's add stores
it), its moments with two exact passes (mean, then squared deviations; the biased variance), and y = (s * rstd
+ (-mean * rstd)) * ln_weight + ln_bias as eager's LayerNorm kernel computes it, in float, rounded once.
Served: float32 and bfloat16 x and residual of the same leading shape, LayerNorm weight and bias of x's dtype or
float32; anything else runs the reference in torch.
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

// one row, in place: h = round_X(h + r), then h = (h - mean) * rstd * weight + bias
template <typename X, typename W>
static inline void add_ln_row(X* h, const X* r, const W* w, const W* b, int dim, float eps) {
  float s = 0.0f, amax = 0.0f;
  #pragma omp simd reduction(+ : s) reduction(max : amax)
  for (int i = 0; i < dim; ++i) {
    st(h, i, ld(h, i) + ld(r, i));  // the sum rounded to x's dtype, as eager's add stores it
    s += ld(h, i) * SUM_SCALE;
    const float a = std::fabs(ld(h, i));
    amax = a > amax ? a : amax;
  }
  if (amax > BIG) {
    ln_row_huge(h, w, b, h, dim, eps);
    return;
  }
  const float mean = s / (float)dim * SUM_UNSCALE;
  float q = 0.0f;
  #pragma omp simd reduction(+ : q)
  for (int i = 0; i < dim; ++i) {
    const float d = ld(h, i) - mean;
    q += d * d;
  }
  const float rstd = 1.0f / std::sqrt(q / (float)dim + eps);
  #pragma omp simd
  for (int i = 0; i < dim; ++i) st(h, i, (ld(h, i) - mean) * rstd * ld(w, i) + ld(b, i));
}

template <typename X, typename W>
static void add_ln_rows(X* h, const X* r, const W* w, const W* b, int64_t rows, int dim, float eps) {
  #pragma omp parallel for schedule(static) if (rows * (int64_t)dim > 65536)
  for (int64_t i = 0; i < rows; ++i) add_ln_row(h + i * dim, r + i * dim, w, b, dim, eps);
}

extern "C" void add_layer_norm_f32(float* h, const float* r, const float* w, const float* b, int64_t rows, int dim,
                                   float eps) {
  add_ln_rows(h, r, w, b, rows, dim, eps);
}

extern "C" void add_layer_norm_bf16(uint16_t* h, const uint16_t* r, const uint16_t* w, const uint16_t* b, int64_t rows,
                                    int dim, float eps) {
  add_ln_rows(h, r, w, b, rows, dim, eps);
}

extern "C" void add_layer_norm_bf16_wf32(uint16_t* h, const uint16_t* r, const float* w, const float* b, int64_t rows,
                                         int dim, float eps) {
  add_ln_rows(h, r, w, b, rows, dim, eps);
}
"""


def linear_add_layer_norm(x, residual, weight, bias, ln_weight, ln_bias, eps):
    h = F.linear(x, weight, bias)
    dim = h.shape[-1]
    served = (x.dtype in (torch.float32, torch.bfloat16) and h.dtype == x.dtype and residual.dtype == x.dtype
              and tuple(residual.shape) == tuple(h.shape) and ln_weight.dtype == ln_bias.dtype
              and ln_weight.dtype in (x.dtype, torch.float32) and tuple(ln_weight.shape) == (dim,)
              and tuple(ln_bias.shape) == (dim,) and h.numel() > 0 and h.is_contiguous()
              and residual.device == h.device == ln_weight.device == ln_bias.device)
    if not served:
        return F.layer_norm(h + residual, (ln_weight.shape[0],), ln_weight, ln_bias, eps)
    r = residual.contiguous()
    w, b = ln_weight.contiguous(), ln_bias.contiguous()
    rows = h.numel() // dim
    if h.dtype == torch.float32:
        lib.add_layer_norm_f32(h, r, w, b, rows, dim, float(eps))
    elif w.dtype == torch.bfloat16:
        lib.add_layer_norm_bf16(h, r, w, b, rows, dim, float(eps))
    else:
        lib.add_layer_norm_bf16_wf32(h, r, w, b, rows, dim, float(eps))
    return h
