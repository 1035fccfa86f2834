"""gelu_tanh (HF NewGELUActivation, GELUTanh; torch GELU(approximate="tanh")).

0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).

NewGELUActivation runs this formula as eight eager ops (pow, two scalar muls, add, tanh, add, two muls), each
a pass over memory with a temporary; torch's fused gelu(approximate="tanh") is one pass but slow on a Xeon
(several times its erf gelu). Here one vectorized pass (ma_vecmath.h's tanh under `omp simd`, threads for large
tensors). float32 evaluates the formula's operations in its order, each rounded to float. bfloat16 is
computed in float and rounded once, as torch's gelu(approximate="tanh") does: NewGELUActivation's eager
ops round every intermediate to bfloat16 (1 + tanh cancels to 0 for x below about -3), and the proof
accepts the more accurate result against float64. Served: float32, bfloat16; other dtypes run the
formula in torch.
"""

DTYPES = ("float32", "bfloat16")  # float16 runs the reference in torch: no CPU kernel for it

SOURCE = r"""
#include <cstdint>
#include <cstring>
#include <omp.h>
#include "ma_vecmath.h"
#include "ma_bf16.h"


static const float BETA = 0.7978845608028654f;  // sqrt(2 / pi)
static const float KAPPA = 0.044715f;

static inline float gelu_tanh_f32(float x) {
  const float cube = x * x * x;
  const float inner = BETA * (x + KAPPA * cube);
  return 0.5f * x * (1.0f + ma_tanhf(inner));
}


// 4096-element chunks, split across threads when there are many
extern "C" void gelu_tanh_f32_kernel(const float* x, float* out, int64_t n) {
  const int64_t chunk = 4096, nchunks = (n + chunk - 1) / chunk;
  #pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t b = c * chunk, e = b + chunk < n ? b + chunk : n;
    #pragma omp simd
    for (int64_t i = b; i < e; ++i) out[i] = gelu_tanh_f32(x[i]);
  }
}

extern "C" void gelu_tanh_bf16_kernel(const uint16_t* x, uint16_t* out, int64_t n) {
  const int64_t chunk = 4096, nchunks = (n + chunk - 1) / chunk;
  #pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t b = c * chunk, e = b + chunk < n ? b + chunk : n;
    #pragma omp simd
    for (int64_t i = b; i < e; ++i) out[i] = f32_to_bf16(gelu_tanh_f32(bf16_to_f32(x[i])));
  }
}
"""


def gelu_tanh(x):
    if x.dtype not in (torch.float32, torch.bfloat16) or x.numel() == 0:
        return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * (x * x * x))))
    # eager's output takes x's layout (a permuted x gives a permuted result): same allocation here
    out = torch.empty_like(x)
    dst = out if out.is_contiguous() else torch.empty(tuple(x.shape), dtype=x.dtype, device=x.device)
    xc = x.contiguous()
    if x.dtype == torch.float32:
        lib.gelu_tanh_f32_kernel(xc, dst, xc.numel())
    else:
        lib.gelu_tanh_bf16_kernel(xc, dst, xc.numel())
    if dst is not out:
        out.copy_(dst)
    return out
