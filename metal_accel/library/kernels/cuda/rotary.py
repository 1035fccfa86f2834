"""rotary (HF apply_rotary_pos_emb): q * cos + rotate_half(q) * sin, and the same for k, one thread per pair of
elements (i, i + D/2) of a (batch, head, position) row, grid-stride: each element of q, k, cos and sin is read once
and each output written once, where eager launches five kernels per tensor (two slices and a neg into a cat, two
muls, an add) with four intermediates. q and k may be contiguous or stored as [B, S, H, D] (HF's views of a
projection); cos and sin are [B or 1, S, D]. Rounding as eager's: each product rounded to the dtype, then the
sum (__fmul_rn/__fadd_rn: no fused multiply-add). Served: float32, float16 and bfloat16 with cos and sin of q's
dtype and unsqueeze_dim 1; anything else runs the same computation in torch."""
DTYPES = ("float32", "float16", "bfloat16")
SOURCE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// a product rounded to T, as eager's mul rounds it
template <typename T> __device__ __forceinline__ float mul_t(float a, float b) { return to_f(from_f<T>(__fmul_rn(a, b))); }

// x and y [B, H, S, D] with unit stride in D (element strides xb/xh/xs, yb/yh/ys); c and s [B or 1, S, D] with
// strides cb (0: one row of positions for every batch) and cs. Thread t: row t / (D/2), pair j = t % (D/2).
template <typename T>
__device__ __forceinline__ void rotate(const T* x, const T* c, const T* s, T* y, long long total, int H, int S, int D,
                                       long long xb, long long xh, long long xs, long long yb, long long yh,
                                       long long ys, long long cb, long long cs) {
    const int half_d = D / 2;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        const int j = (int)(t % half_d);
        const long long row = t / half_d;
        const long long pos = row % S, head = (row / S) % H, b = row / ((long long)S * H);
        const T* xr = x + b * xb + head * xh + pos * xs;
        T* yr = y + b * yb + head * yh + pos * ys;
        const long long cr = b * cb + pos * cs;
        const float x1 = to_f(xr[j]), x2 = to_f(xr[j + half_d]);
        const float a1 = mul_t<T>(x1, to_f(c[cr + j])), b1 = mul_t<T>(-x2, to_f(s[cr + j]));
        const float a2 = mul_t<T>(x2, to_f(c[cr + j + half_d])), b2 = mul_t<T>(x1, to_f(s[cr + j + half_d]));
        yr[j] = from_f<T>(__fadd_rn(a1, b1));
        yr[j + half_d] = from_f<T>(__fadd_rn(a2, b2));
    }
}

extern "C" __global__ void __launch_bounds__(256) rotary_f32(const float* x, const float* c, const float* s, float* y,
        long long total, int H, int S, int D, long long xb, long long xh, long long xs, long long yb, long long yh,
        long long ys, long long cb, long long cs) {
    rotate<float>(x, c, s, y, total, H, S, D, xb, xh, xs, yb, yh, ys, cb, cs);
}
extern "C" __global__ void __launch_bounds__(256) rotary_f16(const __half* x, const __half* c, const __half* s,
        __half* y, long long total, int H, int S, int D, long long xb, long long xh, long long xs, long long yb,
        long long yh, long long ys, long long cb, long long cs) {
    rotate<__half>(x, c, s, y, total, H, S, D, xb, xh, xs, yb, yh, ys, cb, cs);
}
extern "C" __global__ void __launch_bounds__(256) rotary_bf16(const __nv_bfloat16* x, const __nv_bfloat16* c,
        const __nv_bfloat16* s, __nv_bfloat16* y, long long total, int H, int S, int D, long long xb, long long xh,
        long long xs, long long yb, long long yh, long long ys, long long cb, long long cs) {
    rotate<__nv_bfloat16>(x, c, s, y, total, H, S, D, xb, xh, xs, yb, yh, ys, cb, cs);
}
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
    grid = (min((n + 255) // 256, 65536),)
    if x.dtype == torch.float32:
        lib.rotary_f32(_dense(src), c, s, _dense(dst), *args, grid=grid, block=(256,))
    elif x.dtype == torch.float16:
        lib.rotary_f16(_dense(src), c, s, _dense(dst), *args, grid=grid, block=(256,))
    else:
        lib.rotary_bf16(_dense(src), c, s, _dense(dst), *args, grid=grid, block=(256,))
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
              and cos.shape[0] in (1, q.shape[0]) and q.numel() > 0 and k.numel() > 0)
    c, s = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    if not served:
        return _reference(q, c, s), _reference(k, c, s)
    return _one(q, cos, sin), _one(k, cos, sin)
