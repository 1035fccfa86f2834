"""gated_mlp (HF LlamaMLP/Qwen2MLP/MistralMLP): down(act(gate(x)) * up(x)), act silu, gelu_tanh or gelu.

The three GEMMs stay with torch's BLAS, as eager runs them; the win is the elementwise middle: eager
makes two more passes over the [rows, intermediate] activations (act, then the product) with a temporary
each, here one vectorized pass (ma_vecmath.h's silu/tanh under `omp simd`, threads for large tensors)
writes act(g) * u over g in place, no allocation. Rounding follows eager's two
ops: act(g) is rounded to the tensor's dtype before the product (bfloat16: both steps round to bfloat16).
act="gelu" (erf) runs eager's ops: torch's erf GELU plus the product beat this pass with
ma_vecmath's erf on a Xeon (float32 even, bfloat16 0.5x). Served: act silu or gelu_tanh, float32 and
bfloat16 with weights of x's dtype; anything else runs the reference in torch.
"""

DTYPES = ("float32", "bfloat16")  # float16 runs the reference in torch: no CPU kernel for it

SOURCE = r"""
#include <cstdint>
#include <cstring>
#include <omp.h>
#include "ma_vecmath.h"
#include "ma_bf16.h"


// torch's gelu(approximate="tanh") evaluation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
static inline float gelu_tanh_f(float x) {
  const float beta = 0.7978845608028654f, kappa = 0.044715f;
  const float cube = x * x * x;
  const float inner = beta * (x + kappa * cube);
  return 0.5f * x * (1.0f + ma_tanhf(inner));
}

#define MA_ACT_SILU 0
#define MA_ACT_GELU_TANH 1

// act(g[i]) * u[i] over [begin, end); out may be g itself
template <int ACT>
static inline void gated_f32(const float* g, const float* u, float* out, int64_t begin, int64_t end) {
  #pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    const float v = g[i];
    const float a = ACT == MA_ACT_SILU ? ma_siluf(v) : gelu_tanh_f(v);
    out[i] = a * u[i];
  }
}

template <int ACT>
static inline void gated_bf16(const uint16_t* g, const uint16_t* u, uint16_t* out, int64_t begin, int64_t end) {
  #pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    const float v = bf16_to_f32(g[i]);
    const float a = ACT == MA_ACT_SILU ? ma_siluf(v) : gelu_tanh_f(v);
    out[i] = f32_to_bf16(bf16_to_f32(f32_to_bf16(a)) * bf16_to_f32(u[i]));
  }
}

// chunks of 4096 elements (16 KB of float32 per operand), split across threads when there are many
template <typename T, typename F>
static void chunked(int64_t n, F body) {
  const int64_t chunk = 4096, nchunks = (n + chunk - 1) / chunk;
  #pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t b = c * chunk, e = b + chunk < n ? b + chunk : n;
    body(b, e);
  }
}

extern "C" void gated_act_f32(const float* g, const float* u, float* out, int64_t n, int act) {
  if (act == MA_ACT_SILU)
    chunked<float>(n, [&](int64_t b, int64_t e) { gated_f32<MA_ACT_SILU>(g, u, out, b, e); });
  else
    chunked<float>(n, [&](int64_t b, int64_t e) { gated_f32<MA_ACT_GELU_TANH>(g, u, out, b, e); });
}

extern "C" void gated_act_bf16(const uint16_t* g, const uint16_t* u, uint16_t* out, int64_t n, int act) {
  if (act == MA_ACT_SILU)
    chunked<uint16_t>(n, [&](int64_t b, int64_t e) { gated_bf16<MA_ACT_SILU>(g, u, out, b, e); });
  else
    chunked<uint16_t>(n, [&](int64_t b, int64_t e) { gated_bf16<MA_ACT_GELU_TANH>(g, u, out, b, e); });
}
"""


def gated_mlp(x, gate_weight, up_weight, down_weight, act):
    code = 0 if act == "silu" else 1 if act in ("gelu_tanh", "gelu_new") else -1
    served = (code >= 0 and x.dtype in (torch.float32, torch.bfloat16) and x.numel() > 0
              and gate_weight.dtype == x.dtype and up_weight.dtype == x.dtype and down_weight.dtype == x.dtype)
    g = F.linear(x, gate_weight)
    u = F.linear(x, up_weight)
    if not served or tuple(g.shape) != tuple(u.shape):
        if act == "silu":
            a = F.silu(g)
        elif act in ("gelu_tanh", "gelu_new"):
            a = F.gelu(g, approximate="tanh")
        elif act == "relu":
            a = F.relu(g)
        else:
            a = F.gelu(g)
        return F.linear(a * u, down_weight)
    g = g.contiguous()
    u = u.contiguous()
    if x.dtype == torch.float32:
        lib.gated_act_f32(g, u, g, g.numel(), code)
    else:
        lib.gated_act_bf16(g, u, g, g.numel(), code)
    return F.linear(g, down_weight)
