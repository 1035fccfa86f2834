"""LayerNorm(dense(x) + residual), dropout off, as BERT's and RoBERTa's SelfOutput and Output compute it. The GEMM
with its bias stays with cuBLAS (F.linear, as eager runs it); one kernel then adds the residual and normalizes, in
place over the GEMM's output: each row of it and of the residual read once into registers (16-byte vector loads
where aligned), the sum rounded to x's dtype as eager's add stores it, the mean and the biased variance summed
from the registers with warp shuffles, and y = (s - mean) * rsqrt(var + eps) * ln_weight + ln_bias written back
in x's dtype. Eager's add and LayerNorm are two kernels with a full write and read of the sum between them: here
two reads and one write in all, and one launch. Rows wider than the registers hold take a three-pass kernel.
Served: x and residual (same shape as the GEMM's output) float32, float16 or bfloat16 with ln_weight and ln_bias
of x's dtype or float32; anything else runs the reference in torch."""
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
// Each reduction of a kernel has its own PART, so the second never overwrites partials the first still reads.
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

// The row's sum (of elements scaled by 2^-32) and largest magnitude, reduced together: one barrier.
__device__ __forceinline__ float2 row_sum_max(float s, float m, float2* part) {
    for (int o = 16; o > 0; o >>= 1) {
        s += __shfl_xor_sync(0xffffffffu, s, o);
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    }
    const int wpr = blockDim.x >> 5;
    if (wpr == 1) return make_float2(s, m);
    const int base = threadIdx.y * wpr;
    if ((threadIdx.x & 31) == 0) part[base + (threadIdx.x >> 5)] = make_float2(s, m);
    __syncthreads();
    float t = 0.0f, u = 0.0f;
    for (int i = 0; i < wpr; ++i) {
        t += part[base + i].x;
        u = fmaxf(u, part[base + i].y);
    }
    return make_float2(t, u);
}

// The mean sums x * 2^-32 (exact: a power of two) and scales back, so no partial sum overflows where the mean does not
// and a row's sum rounds as the plain sum would (a constant row's mean is exact). Rows whose squared deviations
// could overflow float (|x| over 2^48: no real activation) have them summed scaled by 2^-100, and rstd scaled
// back: float64's answer where eager's float32 variance overflows.
#define BIG 281474976710656.0f      // 2^48
#define SMALL 7.888609052210118e-31f  // 2^-100
#define SUM_SCALE 2.3283064365386963e-10f  // 2^-32
#define SUM_UNSCALE 4294967296.0f  // 2^32

// y = (s - mean) * rstd * w + b over each row s, with mean and the biased variance of s in float, rstd =
// rsqrt(var + eps), the row held in registers as T (D / V <= NV * blockDim.x, blockDim.x * blockDim.y <= 1024).
// ADD: s = round_T(x + r) and y == x (in place: every element is read into registers before any is written);
// else s = x. Rows (and w, b, r, y) are V-element aligned: D % V == 0 and 16-byte aligned bases where V > 1.
template <typename T, typename W, int V, bool ADD>
__device__ __forceinline__ void ln_rows(const T* x, const T* r, const W* __restrict__ w, const W* __restrict__ b,
                                        T* y, long long rows, int D, float eps) {
    __shared__ float2 part_mean[32];
    __shared__ float part_var[32];
    const long long row = (long long)blockIdx.x * blockDim.y + threadIdx.y;
    const bool live = row < rows;
    const int P = D / V;
    const long long off = (live ? row : 0) * (long long)D;
    const Pack<T, V>* xr = reinterpret_cast<const Pack<T, V>*>(x + off);
    const Pack<T, V>* rr = reinterpret_cast<const Pack<T, V>*>((ADD ? r : x) + off);
    Pack<T, V> v[NV];
    float s = 0.0f, m = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int p = threadIdx.x + k * blockDim.x;
        if (live && p < P) {
            v[k] = xr[p];
            if (ADD) {
                const Pack<T, V> a = rr[p];
#pragma unroll
                for (int e = 0; e < V; ++e) v[k].v[e] = from_f<T>(to_f(v[k].v[e]) + to_f(a.v[e]));
            }
#pragma unroll
            for (int e = 0; e < V; ++e) {
                const float f = to_f(v[k].v[e]);
                s += f * SUM_SCALE;
                m = fmaxf(m, fabsf(f));
            }
        }
    }
    const float2 sm = row_sum_max(s, m, part_mean);
    const float mean = sm.x / (float)D * SUM_UNSCALE, scale = sm.y > BIG ? SMALL : 1.0f;
    float q = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int p = threadIdx.x + k * blockDim.x;
        if (live && p < P) {
#pragma unroll
            for (int e = 0; e < V; ++e) {
                const float d = (to_f(v[k].v[e]) - mean) * scale;
                q += d * d;
            }
        }
    }
    const float rstd = scale * rsqrtf(row_sum(q, part_var) / (float)D + eps * scale * scale);
    if (!live) return;
    const Pack<W, V>* wp = reinterpret_cast<const Pack<W, V>*>(w);
    const Pack<W, V>* bp = reinterpret_cast<const Pack<W, V>*>(b);
    Pack<T, V>* yr = reinterpret_cast<Pack<T, V>*>(y + off);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int p = threadIdx.x + k * blockDim.x;
        if (p < P) {
            const Pack<W, V> g = wp[p], c = bp[p];
            Pack<T, V> o;
#pragma unroll
            for (int e = 0; e < V; ++e)
                o.v[e] = from_f<T>(to_f(g.v[e]) * ((to_f(v[k].v[e]) - mean) * rstd) + to_f(c.v[e]));
            yr[p] = o;
        }
    }
}

// Rows too wide for the registers: one block (blockDim.y == 1) per row, the row read three times (from L2 after the
// first). ADD: the first pass stores s = round_T(x + r) over x (y == x) and the later ones read it back.
template <typename T, typename W, bool ADD>
__device__ __forceinline__ void ln_wide(const T* x, const T* r, const W* __restrict__ w, const W* __restrict__ b,
                                        T* y, int D, float eps) {
    __shared__ float2 part_mean[32];
    __shared__ float part_var[32];
    const long long off = (long long)blockIdx.x * D;
    float s = 0.0f, m = 0.0f;
    for (int j = threadIdx.x; j < D; j += blockDim.x) {
        float f = to_f(x[off + j]);
        if (ADD) {
            const T t = from_f<T>(f + to_f(r[off + j]));
            y[off + j] = t;
            f = to_f(t);
        }
        s += f * SUM_SCALE;
        m = fmaxf(m, fabsf(f));
    }
    const T* src = ADD ? y : x;
    const float2 sm = row_sum_max(s, m, part_mean);
    const float mean = sm.x / (float)D * SUM_UNSCALE, scale = sm.y > BIG ? SMALL : 1.0f;
    float q = 0.0f;
    for (int j = threadIdx.x; j < D; j += blockDim.x) {
        const float d = (to_f(src[off + j]) - mean) * scale;
        q += d * d;
    }
    const float rstd = scale * rsqrtf(row_sum(q, part_var) / (float)D + eps * scale * scale);
    for (int j = threadIdx.x; j < D; j += blockDim.x)
        y[off + j] = from_f<T>(to_f(w[j]) * ((to_f(src[off + j]) - mean) * rstd) + to_f(b[j]));
}

extern "C" __global__ void __launch_bounds__(1024) add_ln_vec_f32(
    float* h, const float* r, const float* w, const float* b,
    long long rows, int D, float eps) {
    ln_rows<float, float, 4, true>(h, r, w, b, h, rows, D, eps);
}
extern "C" __global__ void __launch_bounds__(1024) add_ln_one_f32(
    float* h, const float* r, const float* w, const float* b,
    long long rows, int D, float eps) {
    ln_rows<float, float, 1, true>(h, r, w, b, h, rows, D, eps);
}
extern "C" __global__ void __launch_bounds__(1024) add_ln_wide_f32(
    float* h, const float* r, const float* w, const float* b, int D, float eps) {
    ln_wide<float, float, true>(h, r, w, b, h, D, eps);
}
extern "C" __global__ void __launch_bounds__(1024) add_ln_vec_f16(
    __half* h, const __half* r, const __half* w, const __half* b,
    long long rows, int D, float eps) {
    ln_rows<__half, __half, 8, true>(h, r, w, b, h, rows, D, eps);
}
extern "C" __global__ void __launch_bounds__(1024) add_ln_one_f16(
    __half* h, const __half* r, const __half* w, const __half* b,
    long long rows, int D, float eps) {
    ln_rows<__half, __half, 1, true>(h, r, w, b, h, rows, D, eps);
}
extern "C" __global__ void __launch_bounds__(1024) add_ln_wide_f16(
    __half* h, const __half* r, const __half* w, const __half* b, int D, float eps) {
    ln_wide<__half, __half, true>(h, r, w, b, h, D, eps);
}
extern "C" __global__ void __launch_bounds__(1024) add_ln_vec_bf16(
    __nv_bfloat16* h, const __nv_bfloat16* r, const __nv_bfloat16* w, const __nv_bfloat16* b,
    long long rows, int D, float eps) {
    ln_rows<__nv_bfloat16, __nv_bfloat16, 8, true>(h, r, w, b, h, rows, D, eps);
}
extern "C" __global__ void __launch_bounds__(1024) add_ln_one_bf16(
    __nv_bfloat16* h, const __nv_bfloat16* r, const __nv_bfloat16* w, const __nv_bfloat16* b,
    long long rows, int D, float eps) {
    ln_rows<__nv_bfloat16, __nv_bfloat16, 1, true>(h, r, w, b, h, rows, D, eps);
}
extern "C" __global__ void __launch_bounds__(1024) add_ln_wide_bf16(
    __nv_bfloat16* h, const __nv_bfloat16* r, const __nv_bfloat16* w, const __nv_bfloat16* b, int D, float eps) {
    ln_wide<__nv_bfloat16, __nv_bfloat16, true>(h, r, w, b, h, D, eps);
}
extern "C" __global__ void __launch_bounds__(1024) add_ln_vec_f16_f32(
    __half* h, const __half* r, const float* w, const float* b,
    long long rows, int D, float eps) {
    ln_rows<__half, float, 8, true>(h, r, w, b, h, rows, D, eps);
}
extern "C" __global__ void __launch_bounds__(1024) add_ln_one_f16_f32(
    __half* h, const __half* r, const float* w, const float* b,
    long long rows, int D, float eps) {
    ln_rows<__half, float, 1, true>(h, r, w, b, h, rows, D, eps);
}
extern "C" __global__ void __launch_bounds__(1024) add_ln_wide_f16_f32(
    __half* h, const __half* r, const float* w, const float* b, int D, float eps) {
    ln_wide<__half, float, true>(h, r, w, b, h, D, eps);
}
extern "C" __global__ void __launch_bounds__(1024) add_ln_vec_bf16_f32(
    __nv_bfloat16* h, const __nv_bfloat16* r, const float* w, const float* b,
    long long rows, int D, float eps) {
    ln_rows<__nv_bfloat16, float, 8, true>(h, r, w, b, h, rows, D, eps);
}
extern "C" __global__ void __launch_bounds__(1024) add_ln_one_bf16_f32(
    __nv_bfloat16* h, const __nv_bfloat16* r, const float* w, const float* b,
    long long rows, int D, float eps) {
    ln_rows<__nv_bfloat16, float, 1, true>(h, r, w, b, h, rows, D, eps);
}
extern "C" __global__ void __launch_bounds__(1024) add_ln_wide_bf16_f32(
    __nv_bfloat16* h, const __nv_bfloat16* r, const float* w, const float* b, int D, float eps) {
    ln_wide<__nv_bfloat16, float, true>(h, r, w, b, h, D, eps);
}
"""

ROW_PACKS = 4  # NV in SOURCE


def _launch_rows(vec, name, h, r, w, b, rows, D, e, grid, block):
    if vec and name == 'f32':
        lib.add_ln_vec_f32(h, r, w, b, rows, D, e, grid=grid, block=block)
    elif vec and name == 'f16':
        lib.add_ln_vec_f16(h, r, w, b, rows, D, e, grid=grid, block=block)
    elif vec and name == 'bf16':
        lib.add_ln_vec_bf16(h, r, w, b, rows, D, e, grid=grid, block=block)
    elif vec and name == 'f16_f32':
        lib.add_ln_vec_f16_f32(h, r, w, b, rows, D, e, grid=grid, block=block)
    elif vec and name == 'bf16_f32':
        lib.add_ln_vec_bf16_f32(h, r, w, b, rows, D, e, grid=grid, block=block)
    elif not vec and name == 'f32':
        lib.add_ln_one_f32(h, r, w, b, rows, D, e, grid=grid, block=block)
    elif not vec and name == 'f16':
        lib.add_ln_one_f16(h, r, w, b, rows, D, e, grid=grid, block=block)
    elif not vec and name == 'bf16':
        lib.add_ln_one_bf16(h, r, w, b, rows, D, e, grid=grid, block=block)
    elif not vec and name == 'f16_f32':
        lib.add_ln_one_f16_f32(h, r, w, b, rows, D, e, grid=grid, block=block)
    elif not vec and name == 'bf16_f32':
        lib.add_ln_one_bf16_f32(h, r, w, b, rows, D, e, grid=grid, block=block)


def _launch_wide(name, h, r, w, b, rows, D, e):
    if name == 'f32':
        lib.add_ln_wide_f32(h, r, w, b, D, e, grid=(rows,), block=(1024,))
    elif name == 'f16':
        lib.add_ln_wide_f16(h, r, w, b, D, e, grid=(rows,), block=(1024,))
    elif name == 'bf16':
        lib.add_ln_wide_bf16(h, r, w, b, D, e, grid=(rows,), block=(1024,))
    elif name == 'f16_f32':
        lib.add_ln_wide_f16_f32(h, r, w, b, D, e, grid=(rows,), block=(1024,))
    elif name == 'bf16_f32':
        lib.add_ln_wide_bf16_f32(h, r, w, b, D, e, grid=(rows,), block=(1024,))


def _shape(packs):
    """(threads a row, rows a block, wide): about four packs a thread, enough threads to keep a lone row's loads in
    flight; rows wider than NV packs a thread at 1024 threads take the wide kernel."""
    tpr = 1024
    for t in (32, 64, 128, 256, 512):
        if 4 * t >= packs:
            tpr = t
            break
    return tpr, max(1, 256 // tpr), packs > ROW_PACKS * tpr


def linear_add_layer_norm(x, residual, weight, bias, ln_weight, ln_bias, eps):
    h = F.linear(x, weight, bias)
    D = h.shape[-1]
    half = h.dtype == torch.float16 or h.dtype == torch.bfloat16
    served = (h.dtype == torch.float32 or half) and h.dtype == x.dtype and residual.dtype == h.dtype \
        and tuple(residual.shape) == tuple(h.shape) and ln_weight.dtype == ln_bias.dtype \
        and ln_weight.dtype in (h.dtype, torch.float32) and ln_weight.dim() == 1 and ln_bias.dim() == 1 \
        and ln_weight.numel() == D and ln_bias.numel() == D and D > 0 and h.numel() > 0
    if not served:
        return F.layer_norm(h + residual, (ln_weight.shape[0],), ln_weight, ln_bias, eps)
    h = h.contiguous()
    r = residual.contiguous()
    w = ln_weight.contiguous()
    b = ln_bias.contiguous()
    rows = h.numel() // D
    V = 8 if half else 4
    vec = D % V == 0 and h.storage_offset() % V == 0 and r.storage_offset() % V == 0 and w.storage_offset() % V == 0 \
        and b.storage_offset() % V == 0
    tpr, rpb, wide = _shape(D // V if vec else D)
    name = "f32" if h.dtype == torch.float32 else "f16" if h.dtype == torch.float16 else "bf16"
    if half and ln_weight.dtype == torch.float32:
        name = name + "_f32"
    if wide:
        _launch_wide(name, h, r, w, b, rows, D, float(eps))
    else:
        _launch_rows(vec, name, h, r, w, b, rows, D, float(eps), ((rows + rpb - 1) // rpb,), (tpr, rpb))
    return h
