"""rotary (HF apply_rotary_pos_emb): q * cos + rotate_half(q) * sin, and the same for k, in one pass.

Eager runs five ops per tensor (two slices and a neg into a cat for rotate_half, two muls, an add), each
allocating its result; here each (batch, head, position) row of q and k is read once with its cos and sin
row and written once, rows split across threads when the tensors are large. q and k may be any dense
layout with unit stride in the head dimension (HF passes transposed views); cos and sin are [B or 1, S, D].
Rounding follows eager: both products are rounded (to bfloat16 for bfloat16) before the add (no fused
multiply-add). Served: float32 and bfloat16 with cos and sin of q's dtype and unsqueeze_dim 1; anything else
runs the same computation in torch.
"""

DTYPES = ("float32", "bfloat16")  # float16 runs the reference in torch: no CPU kernel for it

SOURCE = r"""
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
#include <cstdint>
#include <omp.h>
#include "ma_bf16.h"

// Strides in elements: x and out [B, H, S, D] (unit stride in D), cos and sin [B or 1, S, D] (cb 0 when broadcast).
struct Layout {
  int64_t B, H, S, D;
  int64_t xb, xh, xs;
  int64_t ob, oh, os;
  int64_t cb, cs;
};

static inline float rd(float v) { return v; }
static inline float rd(uint16_t v) { return bf16_to_f32(v); }
static inline void wr(float* p, float v) { *p = v; }
static inline void wr(uint16_t* p, float v) { *p = f32_to_bf16(v); }
// a product rounded to the storage type, as eager's mul rounds it
static inline float mul(float a, float b, const float*) { return a * b; }
static inline float mul(float a, float b, const uint16_t*) { return bf16_to_f32(f32_to_bf16(a * b)); }

template <typename T>
static void rotate(const T* x, const T* cos, const T* sin, T* out, const Layout& L) {
  const int64_t half = L.D / 2;
  const int64_t rows = L.B * L.H * L.S;
  #pragma omp parallel for schedule(static) if (rows * L.D > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / (L.H * L.S), h = (r / L.S) % L.H, s = r % L.S;
    const T* xr = x + b * L.xb + h * L.xh + s * L.xs;
    const T* c = cos + b * L.cb + s * L.cs;
    const T* sn = sin + b * L.cb + s * L.cs;
    T* o = out + b * L.ob + h * L.oh + s * L.os;
    #pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const float x1 = rd(xr[i]), x2 = rd(xr[i + half]);
      const float a = mul(x1, rd(c[i]), x), b2 = mul(-x2, rd(sn[i]), x);
      wr(o + i, a + b2);
      const float a2 = mul(x2, rd(c[i + half]), x), b3 = mul(x1, rd(sn[i + half]), x);
      wr(o + i + half, a2 + b3);
    }
  }
}

extern "C" void rotary_f32(const float* x, const float* cos, const float* sin, float* out, int64_t B, int64_t H,
                           int64_t S, int64_t D, int64_t xb, int64_t xh, int64_t xs, int64_t ob, int64_t oh,
                           int64_t os, int64_t cb, int64_t cs) {
  const Layout L{B, H, S, D, xb, xh, xs, ob, oh, os, cb, cs};
  rotate(x, cos, sin, out, L);
}

extern "C" void rotary_bf16(const uint16_t* x, const uint16_t* cos, const uint16_t* sin, uint16_t* out, int64_t B,
                            int64_t H, int64_t S, int64_t D, int64_t xb, int64_t xh, int64_t xs, int64_t ob,
                            int64_t oh, int64_t os, int64_t cb, int64_t cs) {
  const Layout L{B, H, S, D, xb, xh, xs, ob, oh, os, cb, cs};
  rotate(x, cos, sin, out, L);
}
"""


def _reference(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _dense(t):
    """T's memory as a contiguous tensor: T itself, or T [B, H, S, D] stored as [B, S, H, D] (HF's q and k, views
    of a projection) transposed back; None for any other layout."""
    if t.is_contiguous():
        return t
    p = t.transpose(1, 2)
    return p if p.is_contiguous() else None


def _one(x, cos, sin):
    c, s = cos.contiguous(), sin.contiguous()
    src = x if _dense(x) is not None and x.stride(-1) == 1 else x.contiguous()
    out = torch.empty_like(x)  # eager's layout: x's where x is dense
    dst = out if _dense(out) is not None and out.stride(-1) == 1 else torch.empty(tuple(x.shape), dtype=x.dtype,
                                                                                   device=x.device)
    B, H, S, D = x.shape
    cb = c.stride(0) if c.shape[0] == B and B > 1 else 0
    strides = (src.stride(0), src.stride(1), src.stride(2), dst.stride(0), dst.stride(1), dst.stride(2), cb, c.stride(1))
    if x.dtype == torch.float32:
        lib.rotary_f32(_dense(src), c, s, _dense(dst), B, H, S, D, *strides)
    else:
        lib.rotary_bf16(_dense(src), c, s, _dense(dst), B, H, S, D, *strides)
    if dst is not out:
        out.copy_(dst)
    return out


def rotary(q, k, cos, sin, unsqueeze_dim):
    served = (unsqueeze_dim == 1 and q.dtype in (torch.float32, torch.bfloat16)
              and k.dtype == q.dtype and cos.dtype == q.dtype and sin.dtype == q.dtype
              and k.device == q.device and cos.device == q.device and sin.device == q.device
              and q.dim() == 4 and k.dim() == 4 and cos.dim() == 3 and sin.dim() == 3 and q.shape[-1] % 2 == 0
              and tuple(cos.shape) == tuple(sin.shape) and k.shape[0] == q.shape[0]
              and tuple(k.shape[2:]) == tuple(q.shape[2:]) and tuple(cos.shape[1:]) == tuple(q.shape[2:])
              and cos.shape[0] in (1, q.shape[0]) and q.numel() > 0 and k.numel() > 0)
    c, s = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    if not served:
        return _reference(q, c, s), _reference(k, c, s)
    return _one(q, cos, sin), _one(k, cos, sin)
