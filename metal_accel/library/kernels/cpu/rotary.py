"""rotary (HF apply_rotary_pos_emb): q * cos + rotate_half(q) * sin, and the same for k, in one pass.

Eager runs five ops per tensor (two slices and a neg into a cat for rotate_half, two muls, an add), each
allocating its result; here one call reads each (batch, head, position) row of q and k once with its cos
and sin row and writes it once, rows split across threads when the tensors are large. q and k are read
where they are, contiguous or stored as [B, S, H, D] (HF's views of a projection; other layouts are copied
first); cos and sin are [B or 1, S, D].
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

// q [B, Hq, S, D] and k [B, Hk, S, D], each stored contiguous (layout 0) or as [B, S, H, D] (layout 1, HF's view of a
// projection); oq and ok in their input's layout. cos and sin [B or 1, S, D] contiguous, cb = S * D or 0 (one row
// of positions for every batch). One loop over the rows of q, then of k.
static inline float rd(float v) { return v; }
static inline float rd(uint16_t v) { return bf16_to_f32(v); }
static inline void wr(float* p, float v) { *p = v; }
static inline void wr(uint16_t* p, float v) { *p = f32_to_bf16(v); }
// a product rounded to the storage type, as eager's mul rounds it
static inline float mul(float a, float b, const float*) { return a * b; }
static inline float mul(float a, float b, const uint16_t*) { return bf16_to_f32(f32_to_bf16(a * b)); }

template <typename T>
static void rotate(const T* q, const T* k, const T* cos, const T* sin, T* oq, T* ok, int64_t B, int64_t Hq,
                   int64_t Hk, int64_t S, int64_t D, int64_t lq, int64_t lk, int64_t cb) {
  const int64_t half = D / 2, rq = B * Hq * S, rows = rq + B * Hk * S;
  #pragma omp parallel for schedule(static) if (rows * D > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    const bool is_q = r < rq;
    const int64_t i = is_q ? r : r - rq, H = is_q ? Hq : Hk;
    const int64_t b = i / (H * S), h = (i / S) % H, s = i % S;
    const int64_t off = (is_q ? lq : lk) ? ((b * S + s) * H + h) * D : ((b * H + h) * S + s) * D;
    const T* xr = (is_q ? q : k) + off;
    T* o = (is_q ? oq : ok) + off;
    const T* c = cos + b * cb + s * D;
    const T* sn = sin + b * cb + s * D;
    #pragma omp simd
    for (int64_t j = 0; j < half; ++j) {
      const float x1 = rd(xr[j]), x2 = rd(xr[j + half]);
      const float a = mul(x1, rd(c[j]), xr), b2 = mul(-x2, rd(sn[j]), xr);
      wr(o + j, a + b2);
      const float a2 = mul(x2, rd(c[j + half]), xr), b3 = mul(x1, rd(sn[j + half]), xr);
      wr(o + j + half, a2 + b3);
    }
  }
}

extern "C" void rotary_f32(const float* q, const float* k, const float* cos, const float* sin, float* oq, float* ok,
                           int64_t B, int64_t Hq, int64_t Hk, int64_t S, int64_t D, int64_t lq, int64_t lk,
                           int64_t cb) {
  rotate(q, k, cos, sin, oq, ok, B, Hq, Hk, S, D, lq, lk, cb);
}

extern "C" void rotary_bf16(const uint16_t* q, const uint16_t* k, const uint16_t* cos, const uint16_t* sin,
                            uint16_t* oq, uint16_t* ok, int64_t B, int64_t Hq, int64_t Hk, int64_t S, int64_t D,
                            int64_t lq, int64_t lk, int64_t cb) {
  rotate(q, k, cos, sin, oq, ok, B, Hq, Hk, S, D, lq, lk, cb);
}
"""


def _reference(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _stored(t):
    """(T, T's memory as a contiguous tensor, layout): T itself (layout 0), or T [B, H, S, D] stored as
    [B, S, H, D] (HF's q and k, views of a projection) transposed back (layout 1); for any other layout, a
    contiguous copy of T (0)."""
    if t.is_contiguous():
        return t, t, 0
    p = t.transpose(1, 2)
    if p.is_contiguous():
        return t, p, 1
    t = t.contiguous()
    return t, t, 0


def rotary(q, k, cos, sin, unsqueeze_dim):
    served = (unsqueeze_dim == 1 and q.dtype in (torch.float32, torch.bfloat16)
              and k.dtype == q.dtype and cos.dtype == q.dtype and sin.dtype == q.dtype
              and k.device == q.device and cos.device == q.device and sin.device == q.device
              and q.dim() == 4 and k.dim() == 4 and cos.dim() == 3 and sin.dim() == 3 and q.shape[-1] % 2 == 0
              and tuple(cos.shape) == tuple(sin.shape) and k.shape[0] == q.shape[0]
              and tuple(k.shape[2:]) == tuple(q.shape[2:]) and tuple(cos.shape[1:]) == tuple(q.shape[2:])
              and cos.shape[0] in (1, q.shape[0]) and q.numel() > 0 and k.numel() > 0)
    if not served:
        c, s = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return _reference(q, c, s), _reference(k, c, s)
    q, mq, lq = _stored(q)
    k, mk, lk = _stored(k)
    oq, ok = torch.empty_like(q), torch.empty_like(k)  # eager's layouts: the inputs' where they are dense
    c, s = cos.contiguous(), sin.contiguous()
    B, Hq, S, D = q.shape
    cb = S * D if c.shape[0] == B and B > 1 else 0
    oq_m, ok_m = (oq.transpose(1, 2) if lq else oq), (ok.transpose(1, 2) if lk else ok)
    if q.dtype == torch.float32:
        lib.rotary_f32(mq, mk, c, s, oq_m, ok_m, B, Hq, k.shape[1], S, D, lq, lk, cb)
    else:
        lib.rotary_bf16(mq, mk, c, s, oq_m, ok_m, B, Hq, k.shape[1], S, D, lq, lk, cb)
    return oq, ok
