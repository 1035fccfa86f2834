"""gpt2_mlp (HF GPT2MLP, Conv1D weights [in, out]): addmm(proj_b, gelu_tanh(addmm(fc_b, x, fc_w)), proj_w).

Both GEMMs (bias folded in) stay with torch's BLAS, as eager runs them; the win is between them: GPT-2's
gelu_new (NewGELUActivation) is eight eager ops over the [rows, 4 * hidden] activation, each a pass over
memory with a fresh temporary; here one vectorized pass (ma_vecmath.h's tanh under `omp simd`, threads for
large tensors) overwrites the first GEMM's output in place. float32 evaluates the formula's operations in
its order, each rounded to float; bfloat16 rounds each intermediate to bfloat16 as the eager ops do
(constants kept in float, as torch's scalar ops on bfloat16 do). Served: float32, bfloat16 (all operands of
x's dtype); anything else runs the reference in torch.
"""

DTYPES = ("float32", "bfloat16")  # float16 runs the reference in torch: no CPU kernel for it

SOURCE = r"""
#include <cstdint>
#include <cstring>
#include <omp.h>
#include "ma_vecmath.h"
#include "ma_bf16.h"


static inline float rbf(float f) { return bf16_to_f32(f32_to_bf16(f)); }

static const float BETA = 0.7978845608028654f;  // sqrt(2 / pi)
static const float KAPPA = 0.044715f;

static inline float gelu_tanh_f32(float x) {
  const float cube = x * x * x;
  const float inner = BETA * (x + KAPPA * cube);
  return 0.5f * x * (1.0f + ma_tanhf(inner));
}

static inline float gelu_tanh_bf16(float x) {
  const float cube = rbf(rbf(x * x) * x);
  const float inner = rbf(BETA * rbf(x + rbf(KAPPA * cube)));
  return rbf(rbf(0.5f * x) * rbf(1.0f + rbf(ma_tanhf(inner))));
}

// in place over h[0, n): 4096-element chunks, split across threads when there are many
extern "C" void gpt2_gelu_f32(float* h, int64_t n) {
  const int64_t chunk = 4096, nchunks = (n + chunk - 1) / chunk;
  #pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t b = c * chunk, e = b + chunk < n ? b + chunk : n;
    #pragma omp simd
    for (int64_t i = b; i < e; ++i) h[i] = gelu_tanh_f32(h[i]);
  }
}

extern "C" void gpt2_gelu_bf16(uint16_t* h, int64_t n) {
  const int64_t chunk = 4096, nchunks = (n + chunk - 1) / chunk;
  #pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t b = c * chunk, e = b + chunk < n ? b + chunk : n;
    #pragma omp simd
    for (int64_t i = b; i < e; ++i) h[i] = f32_to_bf16(gelu_tanh_bf16(bf16_to_f32(h[i])));
  }
}
"""


def gpt2_mlp(x, fc_weight, fc_bias, proj_weight, proj_bias):
    lead = tuple(x.shape[:-1])
    h = torch.addmm(fc_bias, x.reshape(-1, x.shape[-1]), fc_weight)
    served = (x.dtype in (torch.float32, torch.bfloat16) and h.dtype == x.dtype and h.numel() > 0
              and h.is_contiguous())
    if served and x.dtype == torch.float32:
        lib.gpt2_gelu_f32(h, h.numel())
    elif served:
        lib.gpt2_gelu_bf16(h, h.numel())
    else:
        h = 0.5 * h * (1.0 + torch.tanh(0.7978845608028654 * (h + 0.044715 * (h * h * h))))
    return torch.addmm(proj_bias, h, proj_weight).view(lead + (proj_weight.shape[-1],))
