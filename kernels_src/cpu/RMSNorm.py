"""RMSNorm, x * rsqrt(mean(x^2) + eps) * weight, in one pass per row.

Eager runs five ops (pow, mean, add, rsqrt, two muls) with a temporary each; here every row is
read twice from L1 (sum of squares, then scale) and written once. Rounding follows eager: the
row's inverse RMS is rounded to float, then (x * r) is rounded before the weight multiply.
"""

SOURCE = r"""
#include <cmath>
#include <cstdint>
#include <omp.h>

extern "C" void rmsnorm_f32(const float* x, const float* w, float* out, int64_t rows, int dim, float eps) {
  #pragma omp parallel for schedule(static) if (rows * (int64_t)dim > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* o = out + r * dim;
    float ss = 0.0f;
    #pragma omp simd reduction(+ : ss)
    for (int i = 0; i < dim; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / (float)dim + eps);
    #pragma omp simd
    for (int i = 0; i < dim; ++i) {
      float t = xr[i] * inv;
      o[i] = t * w[i];
    }
  }
}
"""


def forward(module, x):
    x = x.contiguous()
    dim = x.shape[-1]
    out = torch.empty_like(x)
    lib.rmsnorm_f32(x, module.weight.contiguous(), out, x.numel() // dim, dim, float(module.eps))
    return out
