"""rotary (HF apply_rotary_pos_emb): q * cos + rotate_half(q) * sin, and the same for k, in one dispatch: one
thread per pair of elements (i, i + D/2) of a (batch, head, position) row of q or k: each element of q, k, cos
and sin is read once and each output written once, where eager runs five kernels per tensor (two slices and a neg into a cat, two muls, an
add) with four intermediates. q and k may be contiguous or stored as [B, S, H, D] (HF's views of a projection);
cos and sin are [B or 1, S, D]. Rounding as eager's: each product rounded to the dtype before the add (float16
and bfloat16; float32 products round to float32 unless the compiler fuses them). Served: float32, float16 and
bfloat16 with cos and sin of q's dtype and unsqueeze_dim 1; anything else runs the same computation in torch."""
SOURCE = r"""
#include <metal_stdlib>
using namespace metal;

// q [B, Hq, S, D] and k [B, Hk, S, D], each stored contiguous (layout 0) or as [B, S, H, D] (layout 1, HF's view of a
// projection); oq and ok in their input's layout. c and s [B or 1, S, D] contiguous, cb = S * D or 0 (one row of
// positions for every batch). Thread t: pair j = t % (D/2) of row t / (D/2), the rows of q first, then k's.
template <typename T>
kernel void rotary(device const T* q [[buffer(0)]], device const T* k [[buffer(1)]], device const T* c [[buffer(2)]],
                   device const T* s [[buffer(3)]], device T* oq [[buffer(4)]], device T* ok [[buffer(5)]],
                   constant uint& B [[buffer(6)]], constant uint& Hq [[buffer(7)]], constant uint& Hk [[buffer(8)]],
                   constant uint& S [[buffer(9)]], constant uint& D [[buffer(10)]], constant uint& lq [[buffer(11)]],
                   constant uint& lk [[buffer(12)]], constant uint& cb [[buffer(13)]],
                   uint t [[thread_position_in_grid]]) {
    const uint half_d = D / 2;
    const uint rq = B * Hq * S;
    const uint row = t / half_d, j = t % half_d;
    if (row >= rq + B * Hk * S) return;
    const bool is_q = row < rq;
    const uint i = is_q ? row : row - rq, H = is_q ? Hq : Hk;
    const uint pos = i % S, head = (i / S) % H, b = i / (S * H);
    const ulong off = ((is_q ? lq : lk) != 0 ? ((ulong)(b * S + pos) * H + head) : ((ulong)(b * H + head) * S + pos)) * D;
    device const T* xr = (is_q ? q : k) + off;
    device T* yr = (is_q ? oq : ok) + off;
    const ulong cr = (ulong)b * cb + (ulong)pos * D;
    const float x1 = float(xr[j]), x2 = float(xr[j + half_d]);
    const float a1 = float(T(x1 * float(c[cr + j]))), b1 = float(T(-x2 * float(s[cr + j])));
    const float a2 = float(T(x2 * float(c[cr + j + half_d]))), b2 = float(T(x1 * float(s[cr + j + half_d])));
    yr[j] = T(a1 + b1);
    yr[j + half_d] = T(a2 + b2);
}

template [[host_name("rotary_f32")]] [[kernel]] decltype(rotary<float>) rotary<float>;
template [[host_name("rotary_f16")]] [[kernel]] decltype(rotary<half>) rotary<half>;
template [[host_name("rotary_bf16")]] [[kernel]] decltype(rotary<bfloat>) rotary<bfloat>;
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
    served = (unsqueeze_dim == 1 and q.dtype in (torch.float32, torch.float16, torch.bfloat16)
              and k.dtype == q.dtype and cos.dtype == q.dtype and sin.dtype == q.dtype
              and k.device == q.device and cos.device == q.device and sin.device == q.device
              and q.dim() == 4 and k.dim() == 4 and cos.dim() == 3 and sin.dim() == 3 and q.shape[-1] % 2 == 0
              and tuple(cos.shape) == tuple(sin.shape) and k.shape[0] == q.shape[0]
              and tuple(k.shape[2:]) == tuple(q.shape[2:]) and tuple(cos.shape[1:]) == tuple(q.shape[2:])
              and cos.shape[0] in (1, q.shape[0]) and q.numel() > 0 and k.numel() > 0
              and q.numel() + k.numel() < 2 ** 31)
    if not served:
        c, s = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return _reference(q, c, s), _reference(k, c, s)
    q, mq, lq = _stored(q)
    k, mk, lk = _stored(k)
    oq, ok = torch.empty_like(q), torch.empty_like(k)  # eager's layouts: the inputs' where they are dense
    c, s = cos.contiguous(), sin.contiguous()
    B, Hq, S, D = q.shape
    Hk = k.shape[1]
    cb = S * D if c.shape[0] == B and B > 1 else 0
    oq_m, ok_m = (oq.transpose(1, 2) if lq else oq), (ok.transpose(1, 2) if lk else ok)
    n = B * (Hq + Hk) * S * (D // 2)
    tg = min(256, n)
    if q.dtype == torch.float32:
        lib.rotary_f32(mq, mk, c, s, oq_m, ok_m, B, Hq, Hk, S, D, lq, lk, cb, threads=n, group_size=tg)
    elif q.dtype == torch.float16:
        lib.rotary_f16(mq, mk, c, s, oq_m, ok_m, B, Hq, Hk, S, D, lq, lk, cb, threads=n, group_size=tg)
    else:
        lib.rotary_bf16(mq, mk, c, s, oq_m, ok_m, B, Hq, Hk, S, D, lq, lk, cb, threads=n, group_size=tg)
    return oq, ok
