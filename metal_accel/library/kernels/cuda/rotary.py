"""rotary (HF apply_rotary_pos_emb): q * cos + rotate_half(q) * sin, and the same for k, in one launch: one thread
per pair of elements (i, i + D/2) of a (batch, head, position) row of q or k, grid-stride: each element of q, k, cos and sin is read once
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

// q [B, Hq, S, D] and k [B, Hk, S, D], each stored contiguous (layout 0) or as [B, S, H, D] (layout 1, HF's view of a
// projection); oq and ok in their input's layout. c and s [B or 1, S, D] contiguous, cb = S * D or 0 (one row of
// positions for every batch). Thread t (grid-stride): pair j = t % (D/2) of row t / (D/2), q's rows first, then k's.
template <typename T>
__device__ __forceinline__ void rotate(const T* q, const T* k, const T* c, const T* s, T* oq, T* ok, int B, int Hq,
                                       int Hk, int S, int D, int lq, int lk, long long cb) {
    const int half_d = D / 2;
    const long long rq = (long long)B * Hq * S, total = (rq + (long long)B * Hk * S) * half_d;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        const int j = (int)(t % half_d);
        const long long row = t / half_d;
        const bool is_q = row < rq;
        const long long i = is_q ? row : row - rq;
        const int H = is_q ? Hq : Hk;
        const long long pos = i % S, head = (i / S) % H, b = i / ((long long)S * H);
        const long long off = ((is_q ? lq : lk) ? (b * S + pos) * H + head : (b * H + head) * S + pos) * D;
        const T* xr = (is_q ? q : k) + off;
        T* yr = (is_q ? oq : ok) + off;
        const long long cr = b * cb + pos * D;
        const float x1 = to_f(xr[j]), x2 = to_f(xr[j + half_d]);
        const float a1 = mul_t<T>(x1, to_f(c[cr + j])), b1 = mul_t<T>(-x2, to_f(s[cr + j]));
        const float a2 = mul_t<T>(x2, to_f(c[cr + j + half_d])), b2 = mul_t<T>(x1, to_f(s[cr + j + half_d]));
        yr[j] = from_f<T>(__fadd_rn(a1, b1));
        yr[j + half_d] = from_f<T>(__fadd_rn(a2, b2));
    }
}

extern "C" __global__ void __launch_bounds__(256) rotary_f32(const float* q, const float* k, const float* c,
        const float* s, float* oq, float* ok, int B, int Hq, int Hk, int S, int D, int lq, int lk, long long cb) {
    rotate<float>(q, k, c, s, oq, ok, B, Hq, Hk, S, D, lq, lk, cb);
}
extern "C" __global__ void __launch_bounds__(256) rotary_f16(const __half* q, const __half* k, const __half* c,
        const __half* s, __half* oq, __half* ok, int B, int Hq, int Hk, int S, int D, int lq, int lk, long long cb) {
    rotate<__half>(q, k, c, s, oq, ok, B, Hq, Hk, S, D, lq, lk, cb);
}
extern "C" __global__ void __launch_bounds__(256) rotary_bf16(const __nv_bfloat16* q, const __nv_bfloat16* k,
        const __nv_bfloat16* c, const __nv_bfloat16* s, __nv_bfloat16* oq, __nv_bfloat16* ok, int B, int Hq, int Hk,
        int S, int D, int lq, int lk, long long cb) {
    rotate<__nv_bfloat16>(q, k, c, s, oq, ok, B, Hq, Hk, S, D, lq, lk, cb);
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
    served = (unsqueeze_dim == 1 and q.dtype in (torch.float32, torch.float16, torch.bfloat16)
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
    Hk = k.shape[1]
    cb = S * D if c.shape[0] == B and B > 1 else 0
    oq_m, ok_m = (oq.transpose(1, 2) if lq else oq), (ok.transpose(1, 2) if lk else ok)
    n = B * (Hq + Hk) * S * (D // 2)
    grid = (min((n + 255) // 256, 65536),)
    if q.dtype == torch.float32:
        lib.rotary_f32(mq, mk, c, s, oq_m, ok_m, B, Hq, Hk, S, D, lq, lk, cb, grid=grid, block=(256,))
    elif q.dtype == torch.float16:
        lib.rotary_f16(mq, mk, c, s, oq_m, ok_m, B, Hq, Hk, S, D, lq, lk, cb, grid=grid, block=(256,))
    else:
        lib.rotary_bf16(mq, mk, c, s, oq_m, ok_m, B, Hq, Hk, S, D, lq, lk, cb, grid=grid, block=(256,))
    return oq, ok
