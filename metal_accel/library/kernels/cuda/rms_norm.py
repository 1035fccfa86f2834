"""RMSNorm over the last dimension as HF Llama/Qwen2/Mistral compute it: weight * (x * rsqrt(mean(x^2) + eps)) with
the normalized row rounded to x's dtype before the weight multiplies it. One pass: each row is read once into
registers (16-byte vector loads where rows are 16-byte aligned, scalars otherwise), squares are summed in float
with warp shuffles (one shared-memory exchange when a row spans several warps), and the output is written from
the registers: one read and one write of the row, against eager's six kernels and float32 intermediates (and
their launches, which dominate a decode step's single row). Rows wider than the registers hold (over 4096
vectors of 16 bytes) take a two-pass kernel. Served: x float32, float16 or bfloat16 with weight of x's dtype or
float32 (output of the weight's dtype, as eager promotes); other dtype pairs run the same computation in torch."""
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

// V elements loaded or stored as one access (16 bytes of x's type on the vector path, 1 on the scalar one)
template <typename T, int V> struct alignas(sizeof(T) * V) Pack { T v[V]; };

#define NV 4  // packs of a row each thread holds in registers (8 spilled bf16 rows past 64 registers)

// Sum of v over the threads of one row: blockDim.x threads (a multiple of 32) per row, blockDim.y rows per block,
// at most 32 warps a block. The branch on blockDim.x is uniform over the block, so every thread meets the barrier.
__device__ __forceinline__ float row_sum(float v, float* part) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int wpr = blockDim.x >> 5;
    if (wpr == 1) return v;
    const int base = threadIdx.y * wpr;
    if ((threadIdx.x & 31) == 0) part[base + (threadIdx.x >> 5)] = v;
    __syncthreads();
    float t = 0.0f;
    for (int i = 0; i < wpr; ++i) t += part[base + i];
    return t;
}

// y = w * round_T(x * rsqrt(mean(x^2) + eps)) for each row, the row held in registers (D / V <= NV * blockDim.x).
// x rows (and w, y) are V-element aligned: D % V == 0 and 16-byte aligned bases where V > 1.
template <typename T, typename W, int V>
__device__ __forceinline__ void rms_rows(const T* __restrict__ x, const W* __restrict__ w, W* __restrict__ y,
                                         long long rows, int D, float eps) {
    __shared__ float part[32];
    const long long r = (long long)blockIdx.x * blockDim.y + threadIdx.y;
    const bool live = r < rows;
    const int P = D / V;
    const Pack<T, V>* xr = reinterpret_cast<const Pack<T, V>*>(x + (live ? r : 0) * (long long)D);
    Pack<T, V> v[NV];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int p = threadIdx.x + k * blockDim.x;
        if (live && p < P) {
            v[k] = xr[p];
#pragma unroll
            for (int e = 0; e < V; ++e) {
                const float f = to_f(v[k].v[e]);
                ss += f * f;
            }
        }
    }
    const float inv = rsqrtf(row_sum(ss, part) / (float)D + eps);
    if (!live) return;
    const Pack<W, V>* wp = reinterpret_cast<const Pack<W, V>*>(w);
    Pack<W, V>* yr = reinterpret_cast<Pack<W, V>*>(y + r * (long long)D);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int p = threadIdx.x + k * blockDim.x;
        if (p < P) {
            const Pack<W, V> g = wp[p];
            Pack<W, V> o;
#pragma unroll
            for (int e = 0; e < V; ++e) o.v[e] = from_f<W>(to_f(g.v[e]) * to_f(from_f<T>(to_f(v[k].v[e]) * inv)));
            yr[p] = o;
        }
    }
}

// Rows too wide for the registers: one block (blockDim.y == 1) per row, x read twice (the second time from L2).
template <typename T, typename W>
__device__ __forceinline__ void rms_wide(const T* __restrict__ x, const W* __restrict__ w, W* __restrict__ y,
                                         int D, float eps) {
    __shared__ float part[32];
    const T* xr = x + (long long)blockIdx.x * D;
    W* yr = y + (long long)blockIdx.x * D;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < D; j += blockDim.x) {
        const float f = to_f(xr[j]);
        ss += f * f;
    }
    const float inv = rsqrtf(row_sum(ss, part) / (float)D + eps);
    for (int j = threadIdx.x; j < D; j += blockDim.x) yr[j] = from_f<W>(to_f(w[j]) * to_f(from_f<T>(to_f(xr[j]) * inv)));
}

extern "C" __global__ void __launch_bounds__(1024) rms_vec_f32(const float* x, const float* w, float* y, long long rows,
                                                               int D, float eps) { rms_rows<float, float, 4>(x, w, y, rows, D, eps); }
extern "C" __global__ void __launch_bounds__(1024) rms_vec_f16(const __half* x, const __half* w, __half* y, long long rows,
                                                               int D, float eps) { rms_rows<__half, __half, 8>(x, w, y, rows, D, eps); }
extern "C" __global__ void __launch_bounds__(1024) rms_vec_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w,
                                                                __nv_bfloat16* y, long long rows, int D, float eps) {
    rms_rows<__nv_bfloat16, __nv_bfloat16, 8>(x, w, y, rows, D, eps);
}
extern "C" __global__ void __launch_bounds__(1024) rms_vec_f16_f32(const __half* x, const float* w, float* y, long long rows,
                                                                   int D, float eps) { rms_rows<__half, float, 8>(x, w, y, rows, D, eps); }
extern "C" __global__ void __launch_bounds__(1024) rms_vec_bf16_f32(const __nv_bfloat16* x, const float* w, float* y,
                                                                    long long rows, int D, float eps) {
    rms_rows<__nv_bfloat16, float, 8>(x, w, y, rows, D, eps);
}
extern "C" __global__ void __launch_bounds__(1024) rms_one_f32(const float* x, const float* w, float* y, long long rows,
                                                               int D, float eps) { rms_rows<float, float, 1>(x, w, y, rows, D, eps); }
extern "C" __global__ void __launch_bounds__(1024) rms_one_f16(const __half* x, const __half* w, __half* y, long long rows,
                                                               int D, float eps) { rms_rows<__half, __half, 1>(x, w, y, rows, D, eps); }
extern "C" __global__ void __launch_bounds__(1024) rms_one_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w,
                                                                __nv_bfloat16* y, long long rows, int D, float eps) {
    rms_rows<__nv_bfloat16, __nv_bfloat16, 1>(x, w, y, rows, D, eps);
}
extern "C" __global__ void __launch_bounds__(1024) rms_one_f16_f32(const __half* x, const float* w, float* y, long long rows,
                                                                   int D, float eps) { rms_rows<__half, float, 1>(x, w, y, rows, D, eps); }
extern "C" __global__ void __launch_bounds__(1024) rms_one_bf16_f32(const __nv_bfloat16* x, const float* w, float* y,
                                                                    long long rows, int D, float eps) {
    rms_rows<__nv_bfloat16, float, 1>(x, w, y, rows, D, eps);
}
extern "C" __global__ void __launch_bounds__(1024) rms_wide_f32(const float* x, const float* w, float* y, int D, float eps) {
    rms_wide<float, float>(x, w, y, D, eps);
}
extern "C" __global__ void __launch_bounds__(1024) rms_wide_f16(const __half* x, const __half* w, __half* y, int D, float eps) {
    rms_wide<__half, __half>(x, w, y, D, eps);
}
extern "C" __global__ void __launch_bounds__(1024) rms_wide_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w,
                                                                 __nv_bfloat16* y, int D, float eps) {
    rms_wide<__nv_bfloat16, __nv_bfloat16>(x, w, y, D, eps);
}
extern "C" __global__ void __launch_bounds__(1024) rms_wide_f16_f32(const __half* x, const float* w, float* y, int D,
                                                                    float eps) { rms_wide<__half, float>(x, w, y, D, eps); }
extern "C" __global__ void __launch_bounds__(1024) rms_wide_bf16_f32(const __nv_bfloat16* x, const float* w, float* y,
                                                                     int D, float eps) { rms_wide<__nv_bfloat16, float>(x, w, y, D, eps); }
"""

ROW_PACKS = 4  # NV in SOURCE


def _launch_rows(vec, name, xc, w, y, rows, D, e, grid, block):
    if vec and name == "f32":
        lib.rms_vec_f32(xc, w, y, rows, D, e, grid=grid, block=block)
    elif vec and name == "f16":
        lib.rms_vec_f16(xc, w, y, rows, D, e, grid=grid, block=block)
    elif vec and name == "bf16":
        lib.rms_vec_bf16(xc, w, y, rows, D, e, grid=grid, block=block)
    elif vec and name == "f16_f32":
        lib.rms_vec_f16_f32(xc, w, y, rows, D, e, grid=grid, block=block)
    elif vec:
        lib.rms_vec_bf16_f32(xc, w, y, rows, D, e, grid=grid, block=block)
    elif name == "f32":
        lib.rms_one_f32(xc, w, y, rows, D, e, grid=grid, block=block)
    elif name == "f16":
        lib.rms_one_f16(xc, w, y, rows, D, e, grid=grid, block=block)
    elif name == "bf16":
        lib.rms_one_bf16(xc, w, y, rows, D, e, grid=grid, block=block)
    elif name == "f16_f32":
        lib.rms_one_f16_f32(xc, w, y, rows, D, e, grid=grid, block=block)
    else:
        lib.rms_one_bf16_f32(xc, w, y, rows, D, e, grid=grid, block=block)


def _launch_wide(name, xc, w, y, rows, D, e):
    if name == "f32":
        lib.rms_wide_f32(xc, w, y, D, e, grid=(rows,), block=(1024,))
    elif name == "f16":
        lib.rms_wide_f16(xc, w, y, D, e, grid=(rows,), block=(1024,))
    elif name == "bf16":
        lib.rms_wide_bf16(xc, w, y, D, e, grid=(rows,), block=(1024,))
    elif name == "f16_f32":
        lib.rms_wide_f16_f32(xc, w, y, D, e, grid=(rows,), block=(1024,))
    else:
        lib.rms_wide_bf16_f32(xc, w, y, D, e, grid=(rows,), block=(1024,))


def rms_norm(x, weight, eps):
    D = x.shape[-1]
    half = x.dtype in (torch.float16, torch.bfloat16)
    served = (x.dtype == torch.float32 or half) and weight.dtype in (x.dtype, torch.float32) \
        and weight.dim() == 1 and weight.numel() == D and D > 0
    if not served:
        h = x.to(torch.float32)
        h = h * (h.pow(2).mean(-1, keepdim=True) + eps).rsqrt()
        return weight * h.to(x.dtype)
    out = torch.empty_like(x, dtype=weight.dtype)  # eager's layout: x's strides where x is dense
    rows = x.numel() // D
    if rows == 0:
        return out
    xc = x.contiguous()
    w = weight.contiguous()
    y = out if out.is_contiguous() else torch.empty(x.shape, dtype=weight.dtype, device=x.device)
    V = 8 if half else 4
    vec = D % V == 0 and xc.storage_offset() % V == 0 and w.storage_offset() % V == 0
    packs = D // V if vec else D
    tpr = 1024
    for t in (32, 64, 128, 256, 512):
        if 4 * t >= packs:  # about four packs a thread: threads enough to keep a lone row's loads in flight
            tpr = t
            break
    name = "f32" if x.dtype == torch.float32 else "f16" if x.dtype == torch.float16 else "bf16"
    if half and weight.dtype == torch.float32:
        name = name + "_f32"
    if packs > ROW_PACKS * tpr:
        _launch_wide(name, xc, w, y, rows, D, float(eps))
    else:
        rpb = max(1, 256 // tpr)
        _launch_rows(vec, name, xc, w, y, rows, D, float(eps), ((rows + rpb - 1) // rpb,), (tpr, rpb))
    if y is not out:
        out.copy_(y)
    return out
