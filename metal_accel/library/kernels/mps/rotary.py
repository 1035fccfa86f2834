"""rotary (HF apply_rotary_pos_emb): q * cos + rotate_half(q) * sin, and the same for k, one thread per pair of
elements (i, i + D/2) of a (batch, head, position) row: each element of q, k, cos and sin is read once and each
output written once, where eager runs five kernels per tensor (two slices and a neg into a cat, two muls, an
add) with four intermediates. q and k may be contiguous or stored as [B, S, H, D] (HF's views of a projection);
cos and sin are [B or 1, S, D]. Rounding as eager's: each product rounded to the dtype before the add (float16
and bfloat16; float32 products round to float32 unless the compiler fuses them). Served: float32, float16 and
bfloat16 with cos and sin of q's dtype and unsqueeze_dim 1; anything else runs the same computation in torch."""
SOURCE = r"""
#include <metal_stdlib>
using namespace metal;

// x and y [B, H, S, D] with unit stride in D, element strides xb/xh/xs and yb/yh/ys; c and s [B or 1, S, D] with
// strides cb (0: one row of positions for every batch) and cs. Thread t: row t / (D/2), pair j = t % (D/2).
template <typename T>
kernel void rotary(device const T* x [[buffer(0)]], device const T* c [[buffer(1)]], device const T* s [[buffer(2)]],
                   device T* y [[buffer(3)]], constant uint& total [[buffer(4)]], constant uint& H [[buffer(5)]],
                   constant uint& S [[buffer(6)]], constant uint& D [[buffer(7)]], constant uint& xb [[buffer(8)]],
                   constant uint& xh [[buffer(9)]], constant uint& xs [[buffer(10)]], constant uint& yb [[buffer(11)]],
                   constant uint& yh [[buffer(12)]], constant uint& ys [[buffer(13)]], constant uint& cb [[buffer(14)]],
                   constant uint& cs [[buffer(15)]], uint t [[thread_position_in_grid]]) {
    if (t >= total) return;
    const uint half_d = D / 2;
    const uint j = t % half_d;
    const uint row = t / half_d;
    const uint pos = row % S, head = (row / S) % H, b = row / (S * H);
    device const T* xr = x + (ulong)b * xb + (ulong)head * xh + (ulong)pos * xs;
    device T* yr = y + (ulong)b * yb + (ulong)head * yh + (ulong)pos * ys;
    const ulong cr = (ulong)b * cb + (ulong)pos * cs;
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


def _dense(t):
    """T's memory as a contiguous tensor: T itself, or T [B, H, S, D] stored as [B, S, H, D] transposed back;
    None for any other layout."""
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
    n = B * H * S * (D // 2)
    cb = c.stride(0) if c.shape[0] == B and B > 1 else 0
    args = (n, H, S, D, src.stride(0), src.stride(1), src.stride(2), dst.stride(0), dst.stride(1), dst.stride(2),
            cb, c.stride(1))
    tg = min(256, n)
    if x.dtype == torch.float32:
        lib.rotary_f32(_dense(src), c, s, _dense(dst), *args, threads=n, group_size=tg)
    elif x.dtype == torch.float16:
        lib.rotary_f16(_dense(src), c, s, _dense(dst), *args, threads=n, group_size=tg)
    else:
        lib.rotary_bf16(_dense(src), c, s, _dense(dst), *args, threads=n, group_size=tg)
    if dst is not out:
        out.copy_(dst)
    return out


def rotary(q, k, cos, sin, unsqueeze_dim):
    served = (unsqueeze_dim == 1 and q.dtype in (torch.float32, torch.float16, torch.bfloat16)
              and k.dtype == q.dtype and cos.dtype == q.dtype and sin.dtype == q.dtype
              and k.device == q.device and cos.device == q.device and sin.device == q.device
              and q.dim() == 4 and k.dim() == 4 and cos.dim() == 3 and sin.dim() == 3 and q.shape[-1] % 2 == 0
              and tuple(cos.shape) == tuple(sin.shape) and k.shape[0] == q.shape[0]
              and tuple(k.shape[2:]) == tuple(q.shape[2:]) and tuple(cos.shape[1:]) == tuple(q.shape[2:])
              and cos.shape[0] in (1, q.shape[0]) and q.numel() > 0 and k.numel() > 0
              and max(q.numel(), k.numel()) < 2 ** 31)
    c, s = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    if not served:
        return _reference(q, c, s), _reference(k, c, s)
    return _one(q, cos, sin), _one(k, cos, sin)
